"""A real engine worker process (tiny.gguf) driven over its control channel: nothing a client can
cause — any size, any field, a broken frame — ends the process; each bad command ends alone."""

from __future__ import annotations

import dataclasses
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from skippyctl.config.load_options import FlashAttention, LoadOptions
from skippyctl.engine.channel import frame, host_side
from skippyctl.engine.options import EngineOptions
from skippyctl.engine.protocol import encode
from skippyctl.engine.protocol_commands import Load
from skippyctl.fixtures.generate import CHATML_TEMPLATE, TINY, make_model

Message = dict[str, Any]

MEGABYTE_PROMPT = "hello world " * 90_000  # ~1.08 MB: over the old 1 MiB line limit


class Engine:
    def __init__(self, args: tuple[str, ...] = (), timeout_s: float = 60) -> None:
        """``timeout_s``: how long any reply may take before the test fails (a hang guard)."""
        host, child = socket.socketpair()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "skippyctl.engine.engine_worker",
                "--control-fd",
                str(child.fileno()),
                *args,
            ],
            pass_fds=[child.fileno()],
            env=dict(os.environ, GGML_NO_BACKTRACE="1"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        child.close()
        host.settimeout(timeout_s)
        self.channel = host_side(host)
        assert self.next("hello")["native"] is False

    def send(self, message: Message) -> None:
        """Send a raw command payload: these tests also send what the host's encoder never
        would (wrong types, unknown fields)."""
        assert self.channel.send_frame(frame(orjson.dumps(message)))

    def next(self, kind: str) -> Message:
        """The next message of `kind` (others skipped), as its raw payload; fails if the engine
        ends first."""
        while True:
            payload = self.channel.receive_payload()
            assert payload is not None, f"the engine ended (exit {self.process.wait(5)})"
            message: Message = orjson.loads(payload)
            if message.get("msg") == kind:
                return message

    def until_done(self, request_id: str) -> list[Message]:
        """Every message up to and including `request_id`'s gen_done."""
        seen: list[Message] = []
        while True:
            payload = self.channel.receive_payload()
            assert payload is not None, f"the engine ended (exit {self.process.wait(5)})"
            seen.append(orjson.loads(payload))
            if seen[-1].get("msg") == "gen_done" and seen[-1]["request_id"] == request_id:
                return seen

    def done(self, request_id: str) -> Message:
        while True:
            message = self.next("gen_done")
            if message["request_id"] == request_id:
                return message

    def generate(self, request_id: str, **fields: Any) -> Message:
        self.send({"op": "generate", "request_id": request_id, **fields})
        return self.done(request_id)

    def alive(self) -> bool:
        """Answers a ping (main thread) and still serves a request (decode thread)."""
        self.send({"op": "ping", "seq": 7})
        assert self.next("pong") == {"msg": "pong", "seq": 7}
        done = self.generate("alive", prompt="The quick brown fox", max_tokens=2)
        return bool(done["outcome"] == "completed") and self.process.poll() is None

    def close(self) -> None:
        self.send({"op": "shutdown"})
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.channel.close()


def load_message(operation_id: str, native_operation: int, options: LoadOptions) -> Any:
    """The load command as the host sends it (the protocol's own encoding)."""
    return orjson.loads(encode(Load(operation_id, native_operation, 0, options)))


def load_tiny(engine: Engine, fixture_dir: Path) -> None:
    engine.send(
        load_message("load-1", 1, LoadOptions(str(fixture_dir / "tiny.gguf"), ctx=1024, lanes=2))
    )
    assert engine.next("context_returned")["ok"] is True


@pytest.fixture(scope="module")
def engine(fixture_dir: Path) -> Iterator[Engine]:
    running = Engine()
    try:
        load_tiny(running, fixture_dir)
        yield running
    finally:
        running.close()


def test_a_megabyte_prompt_is_refused_with_context_exhausted_before_decode(
    engine: Engine,
) -> None:
    done = engine.generate("big", prompt=MEGABYTE_PROMPT, max_tokens=4)
    assert (done["outcome"], done["reason"]) == ("failed", "context_exhausted")
    figures = done["figures"]
    assert figures["prompt_tokens"] > 512  # counted, though never kept: more than a lane holds
    assert figures["generated_tokens"] == 0 and figures["prefill_ms"] == 0.0
    assert engine.alive()


def test_a_megabyte_chat_message_is_refused_with_context_exhausted(engine: Engine) -> None:
    messages = [{"role": "user", "content": MEGABYTE_PROMPT}]
    done = engine.generate("big-chat", messages=messages, max_tokens=4)
    assert (done["outcome"], done["reason"]) == ("failed", "context_exhausted")
    assert engine.alive()


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt": "hi", "sampling": {"logit_bias": [[1]]}},  # IndexError: ended the engine
        {"prompt": "hi", "max_tokens": "many"},
        {"prompt": "hi", "sampling": {"temperature": "hot"}},
        {"prompt": "hi", "sampling": {"no_such_knob": 1}},
        {"messages": [{"role": "user"}]},
        {"messages": "not a list"},
        {"prompt": ["not", "text"]},
    ],
)
def test_a_malformed_generate_ends_that_request_only(
    engine: Engine, fields: dict[str, Any]
) -> None:
    done = engine.generate("bad", **fields)
    assert done["outcome"] == "failed"
    assert done["reason"] in ("invalid_configuration", "internal_runtime_failure")
    assert engine.alive()


@pytest.mark.parametrize("payload", [b"{torn", b"[]", b'{"op": 1e400}'])
def test_an_unusable_frame_is_answered_with_protocol_error_and_the_engine_serves_on(
    engine: Engine, payload: bytes
) -> None:
    engine.channel.send_frame(struct.pack(">I", len(payload)) + payload)
    assert engine.next("protocol_error")["count"] >= 1
    assert engine.alive()


def test_a_load_command_that_raises_fails_the_load_and_the_engine_stays_up() -> None:
    fresh = Engine()
    try:
        fresh.send({"op": "load", "operation_id": "load-x", "native_operation": "x"})
        returned = fresh.next("load_returned")
        assert returned == {"msg": "load_returned", "operation_id": "load-x", "ok": False}
        fresh.send({"op": "ping", "seq": 1})
        assert fresh.next("pong")["seq"] == 1
        assert fresh.process.poll() is None
    finally:
        fresh.close()


def test_a_context_the_engine_cannot_serve_fails_the_load_instead_of_the_process(
    fixture_dir: Path,
) -> None:
    fresh = Engine()
    try:
        # llama.cpp accepts 256 lanes, but n_batch (256) must exceed the lanes: BatchEngine
        # raises, which used to end the engine.
        options = LoadOptions(str(fixture_dir / "tiny.gguf"), ctx=256, lanes=256)
        fresh.send(load_message("load-y", 2, options))
        assert fresh.next("load_returned")["ok"] is True
        assert fresh.next("context_returned")["ok"] is False
        fresh.send({"op": "ping", "seq": 2})
        assert fresh.next("pong")["seq"] == 2
    finally:
        fresh.close()


@pytest.mark.parametrize(
    ("name", "files", "threads"),
    [("tiny.gguf", 1, None), ("tiny-split-00001-of-00003.gguf", 3, 1)],
    ids=["single-file", "split-set-one-thread"],
)
def test_the_load_returns_llama_cpps_model_and_context_figures(
    fixture_dir: Path, name: str, files: int, threads: int | None
) -> None:
    """The figures llama.cpp's log prints about a model and its context, read from its API."""
    fresh = Engine()
    try:
        options = LoadOptions(str(fixture_dir / name), ctx=256, lanes=1, threads=threads)
        fresh.send(load_message("load-f", 3, options))
        loaded = fresh.next("load_returned")
        figures = ("layers", "context_train_tokens", "vocab_size", "files")
        assert {key: loaded[key] for key in figures} == {
            "layers": TINY.n_layer,
            "context_train_tokens": TINY.n_ctx_train,
            "vocab_size": TINY.n_vocab,
            "files": files,
        }
        serving = fresh.next("context_returned")
        # llama.cpp caps n_batch at n_ctx: 256 here, below its default of 2048.
        assert (serving["ok"], serving["batch_tokens"]) == (True, 256)
        # The load's threads (else one per core) are the context's, as llama.cpp reports them.
        assert serving["threads"] == (threads or os.cpu_count())
    finally:
        fresh.close()


VENDORED_TEMPLATES = Path(__file__).resolve().parents[2] / "fixtures" / "vendor" / "templates"


@pytest.mark.parametrize(
    ("template", "form"),
    [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3_json"),
        (None, None),  # the tiny fixture's ChatML teaches no tool calls
    ],
)
def test_the_context_reply_names_the_tool_call_form_the_template_teaches(
    tmp_path: Path, template: str | None, form: str | None
) -> None:
    if template is not None and not (VENDORED_TEMPLATES / template).exists():
        pytest.skip(f"vendored template {template} not in fixtures/vendor/templates")
    text = CHATML_TEMPLATE if template is None else (VENDORED_TEMPLATES / template).read_text()
    path = make_model(tmp_path / "templated.gguf", dataclasses.replace(TINY, chat_template=text))
    fresh = Engine()
    try:
        fresh.send(load_message("load-t", 4, LoadOptions(str(path), ctx=256, lanes=1)))
        assert fresh.next("load_returned")["ok"] is True
        serving = fresh.next("context_returned")
        assert serving["ok"] is True and serving.get("tool_call_format") == form
    finally:
        fresh.close()


@pytest.mark.parametrize(
    ("options", "present", "absent"),
    [
        (EngineOptions(), {"gen_started", "gen_text", "gen_done", "kv"}, {"gen_token"}),
        (EngineOptions(debug_token_events=True), {"gen_started", "gen_token"}, set()),
        (
            EngineOptions(serving_events=False, debug_token_events=True),
            {"gen_text", "gen_done"},
            {"gen_started", "gen_token", "kv", "gen_first_token"},
        ),
    ],
    ids=["defaults", "debug-token-events", "serving-events-off"],
)
def test_the_engine_is_configured_by_its_spawn_arguments_alone(
    fixture_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    options: EngineOptions,
    present: set[str],
    absent: set[str],
) -> None:
    # The old environment switches must not matter any more: only the arguments do.
    monkeypatch.setenv("SKIPPY_SERVING_EVENTS", "on" if not options.serving_events else "off")
    monkeypatch.setenv("SKIPPY_DEBUG_TOKEN_EVENTS", "0" if options.debug_token_events else "1")
    fresh = Engine(tuple(options.argv()))
    try:
        load_tiny(fresh, fixture_dir)
        fresh.send({"op": "generate", "request_id": "o", "prompt": "The quick", "max_tokens": 4})
        kinds = {m["msg"] for m in fresh.until_done("o")}
        assert present <= kinds, kinds
        assert not absent & kinds, kinds
    finally:
        fresh.close()


def _served(
    fresh: Engine, model: Path, flash_attn: FlashAttention, lanes: int = 1, threads: int = 1
) -> Message:
    """Load ``model`` into ``fresh`` with ``--flash-attn``; the engine's context reply."""
    options = LoadOptions(str(model), ctx=512, lanes=lanes, threads=threads, flash_attn=flash_attn)
    fresh.send(load_message("load-kernels", 3, options))
    assert fresh.next("load_returned")["ok"] is True
    serving = fresh.next("context_returned")
    assert serving["ok"] is True, serving
    return serving


@pytest.mark.parametrize(
    ("flash_attn", "expected"),
    [(FlashAttention.AUTO, False), (FlashAttention.OFF, False), (FlashAttention.ON, True)],
)
def test_the_context_s_flash_attention_is_the_load_s_choice_on_the_cpu(
    fixture_dir: Path, flash_attn: FlashAttention, expected: bool
) -> None:
    """'auto' is off with the KV cache in host memory, and the reply says what the context uses
    (docs/LOG_COVERAGE.md checks it against llama.cpp's own log line)."""
    fresh = Engine()
    try:
        assert _served(fresh, fixture_dir / "tiny.gguf", flash_attn)["flash_attention"] is expected
    finally:
        fresh.close()


@pytest.mark.parametrize(
    ("invariant_kernels", "flash_attn", "expected"),
    [
        (True, FlashAttention.OFF, True),
        (True, FlashAttention.AUTO, True),  # the default: off on the CPU
        (True, FlashAttention.ON, False),
        (False, FlashAttention.OFF, False),
    ],
)
def test_a_context_is_batch_invariant_only_without_flash_attention_on_the_invariant_kernels(
    fixture_dir: Path, invariant_kernels: bool, flash_attn: FlashAttention, expected: bool
) -> None:
    """The reply says whether a row decodes the same whatever is beside it: the engine computes
    on the ggml with batch-invariant products (engine/kernels.py) and flash attention is off.
    The stock kernels (the engine not asked for the other ones) are not."""
    fresh = Engine(tuple(EngineOptions(invariant_kernels=invariant_kernels).argv()))
    try:
        assert _served(fresh, fixture_dir / "tiny.gguf", flash_attn)["batch_invariant"] is expected
    finally:
        fresh.close()


@pytest.mark.parametrize(("ctx", "lanes"), [(64, 1), (24, 2), (16, 1)])
def test_the_load_s_probe_fits_a_small_context(fixture_dir: Path, ctx: int, lanes: int) -> None:
    """The probe's windows fit the lane's context and the decode call's batch: llama.cpp aborts
    the process on a batch it cannot hold (a 64-token context crashed the load when the probe
    decoded 73 positions). Each of these lanes holds the probe's prompt and a short window."""
    fresh = Engine(tuple(EngineOptions(invariant_kernels=True).argv()))
    try:
        options = LoadOptions(
            str(fixture_dir / "tiny.gguf"), ctx=ctx, lanes=lanes, flash_attn=FlashAttention.OFF
        )
        fresh.send(load_message("load-small", 3, options))
        assert fresh.next("load_returned")["ok"] is True
        serving = fresh.next("context_returned")
        assert serving["ok"] is True, serving
        assert serving["batch_invariant"] is True
    finally:
        fresh.close()


def test_the_load_s_probe_leaves_no_decode_threads_behind(fixture_dir: Path) -> None:
    """The probe decodes on a thread of its own and lets its OpenMP team go: a team left on
    the engine's control thread stays beside the decode thread's, and libgomp, managing more
    threads than there are cores, stops spinning at its barriers (decode measured 3.4x
    slower). After a load and a first generation (the decode thread's own team) the engine
    has as many threads as one whose load never decoded."""
    counts = []
    for invariant, flash_attn in ((False, FlashAttention.ON), (True, FlashAttention.OFF)):
        fresh = Engine(tuple(EngineOptions(invariant_kernels=invariant).argv()))
        try:
            served = _served(fresh, fixture_dir / "tiny.gguf", flash_attn, lanes=2, threads=2)
            assert served["batch_invariant"] is invariant
            fresh.send({"op": "generate", "request_id": "t", "prompt": "The", "max_tokens": 2})
            fresh.until_done("t")
            tasks = f"/proc/{fresh.process.pid}/task"
            samples = []
            for _ in range(10):  # threads that start or end around now are not the point
                samples.append(len(os.listdir(tasks)))
                time.sleep(0.05)
            counts.append(min(samples))
        finally:
            fresh.close()
    assert counts[1] == counts[0], counts


REAL_MODEL = Path(__file__).resolve().parents[2] / "fixtures/real/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def q6_k_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real model's weights requantized to Q6_K (its matrices Q6_K and Q8_0)."""
    import llama_cpp

    if not REAL_MODEL.exists():
        pytest.fail("the real model is not in fixtures/real: run `make fixtures`")
    out = tmp_path_factory.mktemp("q6k") / "real-q6_k.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K
    params.allow_requantize = True
    params.nthread = 2
    assert llama_cpp.llama_model_quantize(str(REAL_MODEL).encode(), str(out).encode(), params) == 0
    return out


@pytest.mark.parametrize("lanes", [1, 2])
def test_the_claim_is_measured_a_q6_k_model_is_not_batch_invariant_even_on_those_kernels(
    q6_k_model: Path, lanes: int
) -> None:
    """ggml's Q6_K product takes another path for a window of rows than for one row (measured
    here: a window of 8 parts from 8 single steps), so the load's probe (engine/kernels.py)
    finds the context is not invariant, where the real model itself (Q4_1) is."""
    for model, expected in ((q6_k_model, False), (REAL_MODEL, True)):
        # The load's probe decodes about 200 rows: beside another test's engine on these 2 cores
        # (spinning teams preempting each other) that took over 60 s.
        fresh = Engine(tuple(EngineOptions(invariant_kernels=True).argv()), timeout_s=300)
        try:
            served = _served(fresh, model, FlashAttention.OFF, lanes=lanes, threads=2)
            assert served["batch_invariant"] is expected, model.name
        finally:
            fresh.close()
