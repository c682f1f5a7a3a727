"""A load's options: one table, one validation, and every option reaching every surface.

`LoadOptions.problem` is the one rule the CLI (before any runtime is reached), the API and the
host (before anything starts) apply; the table of fields is what `skippyctl load`'s flags, the
API's `LoadBody`, the client's JSON, the engine protocol's `Load` and the `settings` of
`model_load_requested` are made from — checked here field by field, so an option added to the
table is checked too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main

from skippyctl.api.schemas import LoadBody
from skippyctl.cli.app import app
from skippyctl.config.load_options import (
    OPTIONS,
    LoadOptions,
    OptionField,
    RestartPolicy,
    SpecMode,
    is_choice,
    shown_settings,
)
from skippyctl.engine.protocol import decode_command, encode
from skippyctl.engine.protocol_commands import Load
from skippyctl.events.envelope import settings


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"spec": "eager"}, "--spec must be one of: off, auto, ngram, plugin, draft"),
        ({"spec": "ngram", "spec_draft_tokens": 0}, "--spec-draft-tokens must be 1-64"),
        ({"spec": "plugin", "spec_deadline_ms": 0.0}, "--spec-deadline-ms must be 1-1000"),
        ({"spec": "plugin", "spec_deadline_ms": float("nan")}, "--spec-deadline-ms must be"),
        ({"spec": "plugin", "spec_runahead_tokens": 257}, "--spec-runahead-tokens must be"),
        ({"spec_runahead_tokens": 8}, "needs --spec plugin or ngram"),
        ({"spec": "draft", "draft": "d.gguf", "spec_runahead_tokens": 8}, "needs --spec plugin"),
        ({"spec": "draft"}, "go together"),
        ({"spec": "ngram", "draft": "d.gguf"}, "go together"),
        ({"plugins": ("relative.so",)}, "absolute path"),
        ({"plugins": ("/nowhere/p.so",)}, "p.so: no such file"),
        ({"plugins": ("bad name!",)}, "entry-point name"),
        ({"plugins": ("ngram", "ngram")}, "--plugin: a value is given twice"),
        ({"ctx": 0}, "--ctx must be 1-"),
        ({"lanes": -1}, "--lanes must be 1-"),
        ({"threads": 0}, "--threads must be 1-1024"),
        ({"gpu_layers": -2}, "--gpu-layers must be -1-"),
        ({"timeout_s": -1.0}, "--timeout must be 0-86400"),
        ({"timeout_s": float("inf")}, "--timeout must be a finite number"),
        ({"max_queue": -1}, "--max-queue must be 0-"),
        ({"alias": "has a space"}, "--alias must be 1-64 characters"),
        ({"stages": ("localhost:5",)}, "--stage: 'localhost' is not an IPv4 address"),
        ({"stages": ("127.0.0.1:5",) * 2}, "--stage: a value is given twice"),
        ({"local_stages": 17}, "--local-stages must be 0-16"),
        ({"stages": ("127.0.0.1:5",), "local_stages": 16}, "at most 16 stages in all"),
        ({"local_stage_mem_mib": 64}, "--mem applies to local stages only"),
        ({"local_stages": 1, "local_stage_mem_mib": 0}, "--mem must be 1-"),
        ({"stage_link_p95_ms": 20.0}, "applies to a split load only"),
        ({"local_stages": 1, "stage_link_p95_ms": 0.0}, "--stage-link-p95-ms must be more than 0"),
        ({"local_stages": 1, "gpu_layers": 3}, "--gpu-layers does not apply to a split load"),
        ({"replan": True}, "--replan needs --stage"),
        ({"draft": ""}, "--draft must not be empty"),
    ],
)
def test_an_unusable_option_is_refused_with_what_to_change(
    options: dict[str, Any], says: str
) -> None:
    problem = LoadOptions("tiny.gguf", **options).problem()
    assert problem is not None and says in problem, problem
    assert "/nowhere" not in problem  # a file is named by its basename


def test_a_model_path_with_nul_is_refused() -> None:
    problem = LoadOptions("ti\x00ny.gguf").problem()
    assert problem is not None and "NUL" in problem


def test_usable_options_pass(tmp_path: Path) -> None:
    plugin = tmp_path / "p.so"
    plugin.write_bytes(b"")
    usable = [
        LoadOptions("m.gguf"),
        LoadOptions("m.gguf", spec=SpecMode.NGRAM, spec_draft_tokens=8),
        LoadOptions("m.gguf", spec=SpecMode.NGRAM, spec_runahead_tokens=32),
        LoadOptions("m.gguf", spec_runahead_tokens=0),  # 0 is fixed depth
        LoadOptions(
            "m.gguf",
            spec=SpecMode.PLUGIN,
            plugins=(str(plugin), "ngram-py"),
            spec_deadline_ms=2.0,
            spec_runahead_tokens=64,
        ),
        LoadOptions("m.gguf", spec=SpecMode.DRAFT, draft="d.gguf"),
        LoadOptions("m.gguf", stages=("127.0.0.1:5",), replan=True, stage_link_p95_ms=20.0),
        LoadOptions("m.gguf", local_stages=2, local_stage_mem_mib=64),
        LoadOptions("m.gguf", ctx=2048, lanes=2, threads=1, max_queue=0, gpu_layers=-1),
    ]
    assert [options.problem() for options in usable] == [None] * len(usable)


def test_a_choice_given_as_text_becomes_its_member() -> None:
    assert LoadOptions("m.gguf", spec="ngram").spec is SpecMode.NGRAM  # type: ignore[arg-type]
    never = LoadOptions("m.gguf", restart="never")  # type: ignore[arg-type]
    assert never.restart is RestartPolicy.NEVER


def test_a_choice_that_names_no_value_is_refused_with_the_values() -> None:
    problem = LoadOptions("m.gguf", restart="always").problem()  # type: ignore[arg-type]
    assert problem == "--restart must be one of: never, on-failure"


def _sample(spec: OptionField) -> Any:
    """A value of `spec`'s type that is not its default."""
    match spec.kind:
        case _ if spec.kind is bool:
            return not spec.default
        case _ if spec.kind is int:
            low = int(spec.option.minimum if spec.option.minimum is not None else 0)
            return low if low != spec.default else low + 1
        case _ if spec.kind is float:
            low = spec.option.minimum if spec.option.minimum is not None else 1.0
            # The first of these the option's own rule takes (ttl: -1 or at least 0).
            return next(v for v in (low + 0.5, low + 1.5) if spec.problem(v) is None)
        case _ if spec.kind is str:
            return "value.gguf"
        case _ if spec.kind is tuple:
            return ("127.0.0.1:5",)
        case _ if is_choice(spec.kind):
            return next(member for member in spec.kind if member != spec.default)
    raise AssertionError(f"no sample for {spec.kind}")


OPTION_FIELDS = [spec for spec in OPTIONS if spec.name != "model"]


def _load_command() -> Any:
    command = typer.main.get_command(app)
    return command.commands["load"]  # type: ignore[attr-defined]  # a click group


@pytest.mark.parametrize("spec", OPTION_FIELDS, ids=lambda spec: spec.name)
def test_every_option_reaches_the_cli_the_api_the_engine_and_the_state(spec: OptionField) -> None:
    value = _sample(spec)
    options = LoadOptions("m.gguf", **{spec.name: value})
    # The CLI: a flag of its own, with the option's help.
    flags = {name: param for param in _load_command().params for name in param.opts}
    assert spec.flag in flags, f"load has no {spec.flag}"
    assert flags[spec.flag].help == spec.option.help
    # The API: a body field, and the client's JSON reads back as the same options.
    assert spec.name in LoadBody.model_fields
    body = LoadBody.model_validate(options.to_json())
    assert LoadOptions.from_json(body.model_dump()) == options
    # The engine: the Load command carries it unchanged over the control channel.
    command = Load("op", 1, 2, options)
    assert decode_command(encode(command)) == command
    # The state: model_load_requested states it when it is shown (never a path or endpoint).
    shown = dict(shown_settings(options))
    if spec.option.shown is not None:
        assert spec.name in shown
        settings(tuple(shown.items()))  # an Event can carry it (no path, no spaces)
        assert "/" not in str(shown[spec.name]) and ":" not in str(shown[spec.name])
    else:
        assert spec.name not in shown


def test_defaults_are_not_stated_and_json_null_is_the_default() -> None:
    options = LoadOptions("m.gguf")
    assert shown_settings(options) == ()
    assert options.to_json() == {"model": "m.gguf"}
    nulls = {spec.name: None for spec in OPTION_FIELDS}
    assert LoadOptions.from_json({"model": "m.gguf", **nulls}) == options
    body = LoadBody.model_validate({"model": "m.gguf", **nulls})
    assert LoadOptions.from_json(body.model_dump()) == options


def test_paths_and_endpoints_are_shown_as_ids_and_counts() -> None:
    options = LoadOptions(
        "/secret/dir/m.gguf",
        spec=SpecMode.DRAFT,
        draft="/secret/dir/draft-model.gguf",
        plugins=("/secret/p.so", "ngram"),
        stages=("10.1.2.3:50052", "10.1.2.4:50052"),
    )
    assert dict(shown_settings(options)) == {
        "stages": 2,
        "spec": SpecMode.DRAFT,
        "plugins": 2,
        "draft": "draft-model",
    }


def test_plugin_config_is_bounded_and_shown_as_its_length_only() -> None:
    secret = "api_key=s3cret mode=fast"
    options = LoadOptions("m.gguf", plugin_config=secret)
    assert options.problem() is None
    assert dict(shown_settings(options)) == {"plugin_config": len(secret)}
    assert secret not in repr(shown_settings(options))
    too_long = LoadOptions("m.gguf", plugin_config="x" * 4097).problem()
    assert too_long == "--plugin-config: at most 4096 characters"
    assert LoadOptions("m.gguf", plugin_config="x" * 4096).problem() is None
    assert LoadOptions("m.gguf", plugin_config="a\x00b").problem() is not None
    assert LoadOptions("m.gguf", plugin_config="").problem() is not None
