"""Fixtures of the BatchEngine tests on real llama.cpp (tiny.gguf): the model, loaded once for
the package (read-only: every engine gets its own context), a logit bias banning every
end-of-generation token of the model, and ``make_engine``, which starts engines on fresh
contexts and stops and frees them after the test. A module that defines its own ``model``
fixture gets these on that model instead."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import llama_cpp
import pytest

from skippyctl.engine.generation import BatchEngine
from tests.engine.generation_harness import EngineFactory, Harness, Recorder


def loaded_model(path: Path) -> Iterator[Any]:
    """The llama.cpp model at ``path``, freed after use (the body of a ``model`` fixture)."""
    llama_cpp.llama_backend_init()
    loaded = llama_cpp.llama_model_load_from_file(
        os.fsencode(path), llama_cpp.llama_model_default_params()
    )
    assert loaded
    yield loaded
    llama_cpp.llama_model_free(loaded)


@pytest.fixture(scope="package")
def model(fixture_dir: Path) -> Iterator[Any]:
    yield from loaded_model(fixture_dir / "tiny.gguf")


@pytest.fixture(scope="module")
def eog_ban(model: Any) -> tuple[tuple[int, float], ...]:
    """A logit bias banning every end-of-generation token, so a run goes to its length limit."""
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    return tuple((t, -math.inf) for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))


@pytest.fixture
def make_engine(model: Any) -> Iterator[EngineFactory]:
    made: list[Harness] = []

    def factory(
        lanes: int = 2,
        n_ctx: int = 1024,
        unified: bool = False,
        llama: ModuleType | SimpleNamespace = llama_cpp,
        on_model: Any = None,
        start: bool = True,
        n_threads: int | None = 1,
        **kwargs: Any,
    ) -> Harness:
        """A started engine on a fresh context.

        One compute thread by default: OpenMP's spinning barrier threads degrade badly when
        other processes share the cores, and these tests are about behaviour, not speed.
        """
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_seq_max = lanes
        params.kv_unified = unified
        the_model = model if on_model is None else on_model
        context = llama_cpp.llama_init_from_model(the_model, params)
        assert context
        recorder = Recorder()
        engine = BatchEngine(
            llama,  # type: ignore[arg-type]  # a fault-injecting proxy may stand in for the module
            the_model,
            context,
            lanes=lanes,
            emit=recorder,
            n_threads=n_threads,
            **kwargs,
        )
        harness = Harness(engine, recorder, context)
        made.append(harness)
        if start:
            engine.start()
        return harness

    yield factory
    for harness in made:
        harness.engine.stop()
        llama_cpp.llama_free(harness.context)
