"""What a model's plugins are activated with (engine/model_loader.py ``plugin_activation``): the
model's id (its alias, else its file's basename — never the path), its geometry, the spec mode,
the deadline and ``--plugin-config``."""

from __future__ import annotations

from skippyctl.config.load_options import LoadOptions, SpecMode
from skippyctl.engine.model_loader import plugin_activation
from skippyctl.engine.protocol_commands import Load


def test_the_activation_names_the_model_never_its_path_and_carries_the_config() -> None:
    options = LoadOptions(
        "/secret/models/tiny-successor.gguf",
        spec=SpecMode.PLUGIN,
        spec_deadline_ms=12.5,
        plugins=("ngram",),
        plugin_config="ngram_max=3",
    )
    context = plugin_activation(Load("op", 1, 2, options), n_vocab=100, n_ctx=8192, lanes=4)
    assert context.model_id == "tiny-successor"
    assert "/" not in context.model_id
    assert (context.n_vocab, context.n_ctx_per_lane, context.lanes) == (100, 2048, 4)
    assert (context.spec_mode, context.proposal_deadline_ms) == ("plugin", 12.5)
    assert context.config == "ngram_max=3"
    aliased = Load("op", 1, 2, options.replace(alias="chat", plugin_config=None))
    context = plugin_activation(aliased, n_vocab=100, n_ctx=1024, lanes=1)
    assert (context.model_id, context.config, context.n_ctx_per_lane) == ("chat", "", 1024)
