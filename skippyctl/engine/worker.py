"""The engine worker process: owns llama.cpp for one model.

Run by the supervisor as `python -m skippyctl.engine.worker --control-fd N [--ring-fd M]`.
With a ring, llama.cpp's progress and log callbacks point straight at C functions of the native
library (no Python on the callback path), and the worker brackets each load in a native operation
scope. Without one (legacy mode) it only reports return values. Either way the authoritative result
of every llama.cpp call is sent on the control channel after the native scope has ended, so the
host drains every native fact of the operation before it sees the return.

llama.cpp may abort this process (GGML_ASSERT on a bad vocabulary); the supervisor reports that as
`process_crash`. GGML_NO_BACKTRACE is set by the supervisor so an abort does not run gdb.

Nothing the host forwards from a client may end this process: an unusable frame is counted and
answered with `protocol_error`, and any exception while handling one command ends that command
only — a `generate` with its one `gen_done` (failed, with a reason code), a `load` with a failed
`load_returned`/`context_returned`. The main thread reads the channel and answers `ping` with
`pong` without touching the decode thread, so the host can tell a stuck process from a busy one.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, Final

from skippyctl.engine.protocol import ControlChannel, MalformedMessage, Message
from skippyctl.events.reasons import ReasonCode

DEFAULT_MAX_CONTEXT_TOKENS: Final = 4096
"""Without --ctx the context is the model's training context, capped here to bound memory."""
SERVING_EVENTS_ENV: Final = "SKIPPY_SERVING_EVENTS"
"""`off`: a benchmark baseline, not an operator feature. The engine sends only text and terminals
and the host submits no serving events (request, prefill, generation, session, KV); model
lifecycle events still flow. Read by the engine worker and the scheduler (inherited env)."""
DEBUG_TOKEN_EVENTS_ENV: Final = "SKIPPY_DEBUG_TOKEN_EVENTS"
"""`1` (set by `runtime serve --debug-token-events`): one `gen_token` observation per sampled
token, mapped by the host to the debug-class `generation_token_observed`."""


def serving_events_enabled() -> bool:
    return os.environ.get(SERVING_EVENTS_ENV, "on").strip().lower() != "off"


@dataclass(slots=True)
class _Loaded:
    model: Any
    context: Any | None = None
    generation: Any | None = None  # BatchEngine once the context exists


class Worker:
    def __init__(self, channel: ControlChannel, ring_fd: int | None, capture_debug_log: bool):
        self.channel = channel
        self.adapter: Any | None = None
        self.native_problem: str | None = None
        self.features = 0
        self.loaded: _Loaded | None = None
        self.protocol_errors = 0
        import llama_cpp

        self.llama = llama_cpp
        llama_cpp.llama_backend_init()
        if ring_fd is not None:
            self._setup_native(ring_fd, capture_debug_log)

    def _setup_native(self, ring_fd: int, capture_debug_log: bool) -> None:
        try:
            # Only the engine-side modules: this runs in every engine start, inside the time
            # to model_available (the host's fact decoding in native.ingress is not needed here).
            from skippyctl.native.devices import resolve_ggml
            from skippyctl.native.library import (
                NativeAbiIncompatible,
                NativeLibraryUnavailable,
                load_native_library,
            )
            from skippyctl.native.region import EngineAdapter, IngressRegion

            library = load_native_library()
            ring = IngressRegion.attach(ring_fd, library=library)
            self.adapter = EngineAdapter(ring, capture_debug_log=capture_debug_log)
            self.features = library.features
            resolve_ggml(library)
        except (NativeLibraryUnavailable, NativeAbiIncompatible, OSError) as error:
            self.adapter = None
            self.native_problem = type(error).__name__
            return
        delay = int(os.environ.get("SKIPPY_TEST_PROGRESS_DELAY_US", "0") or 0)
        if delay > 0:
            self.adapter.set_test_progress_delay_us(delay)
        log_callback = self.llama.llama_log_callback(self.adapter.log_callback_address)
        self._log_callback = log_callback  # keep the function pointer object alive
        self.llama.llama_log_set(log_callback, self.adapter.user_data)

    def hello(self) -> None:
        self.channel.send(
            {
                "msg": "hello",
                "pid": os.getpid(),
                "native": self.adapter is not None,
                "native_problem": self.native_problem,
                "features": self.features,
            }
        )

    def serve(self) -> int:
        self.hello()
        while True:
            try:
                message = self.channel.receive()
            except MalformedMessage:
                # The frame was consumed whole: the channel is in step, carry on. It cannot be
                # attributed to a request (the host encodes every frame itself, so this is a bug).
                self.protocol_errors += 1
                self._send({"msg": "protocol_error", "count": self.protocol_errors})
                continue
            if message is None or message.get("op") == "shutdown":
                self._free()
                return 0
            try:
                self._dispatch(message)
            except Exception:  # noqa: BLE001 - one command's failure must not end the engine
                self._command_failed(message)

    def _dispatch(self, message: Message) -> None:
        op = message.get("op")
        if op == "ping":
            self._send({"msg": "pong", "seq": message.get("seq")})
        elif op == "load":
            self._load(message)
        elif op == "generate":
            self._generate(message)
        elif op == "cancel" and self._batch is not None:
            self._batch.cancel(str(message.get("request_id")))
        elif op == "drop_session" and self._batch is not None:
            reason = str(message.get("reason") or "dropped")
            self._batch.drop_session(str(message.get("session")), reason)

    def _command_failed(self, message: Message) -> None:
        """The terminal of a command whose handling raised (never re-raises)."""
        try:
            if message.get("op") == "generate":
                self._send(
                    _refused(str(message.get("request_id")), ReasonCode.INTERNAL_RUNTIME_FAILURE)
                )
        except Exception:  # noqa: BLE001 - the serve loop must go on whatever happens here
            self.protocol_errors += 1

    def _send(self, message: Message) -> None:
        # A host that went away is noticed by the serve loop (end of stream); nothing to do here.
        self.channel.send(message)

    def _arm_abort(self, context: Any, serving_operation: int) -> None:
        """Point llama_decode's abort callback at the native layer, inside a serving scope, so the
        host can stop a decode in flight (forced unload) through shared memory, not Python."""
        if self.adapter is None or serving_operation <= 0:
            return
        self.adapter.operation_begin(serving_operation, serving_operation)
        self._abort_callback = self.llama.ggml_abort_callback(self.adapter.abort_callback_address)
        self.llama.llama_set_abort_callback(context, self._abort_callback, self.adapter.user_data)

    def _emit(self, message: Message) -> None:
        self._send(message)

    @property
    def _batch(self) -> Any | None:
        return None if self.loaded is None else self.loaded.generation

    def _generate(self, message: Message) -> None:
        from skippyctl.engine.generation import ChatMessage, GenerateRequest
        from skippyctl.engine.sampling import SamplingParams

        request_id = str(message.get("request_id"))
        try:
            if self._batch is None:
                raise ValueError("no model is loaded in this engine")
            sampling = dict(message.get("sampling") or {})
            sampling["logit_bias"] = tuple(
                (int(token), float(bias)) for token, bias in sampling.get("logit_bias") or ()
            )
            messages = message.get("messages")
            timeout = message.get("timeout_s")
            request = GenerateRequest(
                request_id=request_id,
                prompt=message.get("prompt"),
                messages=None
                if messages is None
                else tuple(ChatMessage(str(m["role"]), str(m["content"])) for m in messages),
                session=message.get("session"),
                max_tokens=int(message.get("max_tokens", 128)),
                stop=tuple(message.get("stop") or ()),
                sampling=SamplingParams(**sampling),
                deadline_mono_s=None if timeout is None else time.monotonic() + float(timeout),
            )
        except Exception:  # noqa: BLE001 - any bad field refuses this request, never the engine
            self._send(_refused(request_id, ReasonCode.INVALID_CONFIGURATION))
            return
        self._batch.submit(request)

    def _load(self, command: Message) -> None:
        """Load the model, then its context. Exactly one failed reply ends a load that raised:
        `load_returned` if the model was not returned yet, else `context_returned`."""
        operation_id = str(command.get("operation_id", "none"))
        owed = "load_returned"
        scope_open = False
        try:
            llama = self.llama
            native_operation = int(command["native_operation"])
            gpu_layers = int(command.get("gpu_layers", 0))
            path = os.fsencode(str(command["path"]))
            if b"\0" in path:
                raise ValueError("a model path cannot contain NUL")  # C would truncate it
            params = llama.llama_model_default_params()
            params.n_gpu_layers = gpu_layers
            adapter = self.adapter
            if adapter is not None:
                adapter.model_load_begin(native_operation, native_operation)
                scope_open = True
                params.progress_callback = llama.llama_progress_callback(
                    adapter.progress_callback_address
                )
                params.progress_callback_user_data = adapter.user_data
            self._send({"msg": "load_begun", "operation_id": operation_id})
            if adapter is not None:
                adapter.report_device(gpu_layers)
            started = time.perf_counter()
            model = llama.llama_model_load_from_file(path, params)
            duration_ms = round((time.perf_counter() - started) * 1000, 3)
            ok = bool(model)
            if adapter is not None:
                scope_open = False
                self._end_load_scope(ok)
            reply: Message = {
                "msg": "load_returned",
                "operation_id": operation_id,
                "ok": ok,
                "duration_ms": duration_ms,
            }
            if ok:
                self.loaded = _Loaded(model)
                reply["model_size_bytes"] = int(llama.llama_model_size(model))
                reply["parameters"] = int(llama.llama_model_n_params(model))
            owed = "context_returned" if ok else ""
            self._send(reply)
            if not ok:
                return
            self._create_context(command, operation_id, model)
        except Exception:  # noqa: BLE001 - a load that raised fails; the engine stays up
            if scope_open:
                self._end_load_scope(False)
            if owed:
                self._send({"msg": owed, "operation_id": operation_id, "ok": False})

    def _end_load_scope(self, ok: bool) -> None:
        from skippyctl.native.abi import FailureCode, Status

        assert self.adapter is not None
        self.adapter.model_load_end(
            Status.OK if ok else Status.MODEL_ERROR,
            FailureCode.NONE if ok else FailureCode.MODEL_ERROR,
        )

    def _create_context(self, command: Message, operation_id: str, model: Any) -> None:
        llama = self.llama
        assert self.loaded is not None
        self._send({"msg": "context_begun", "operation_id": operation_id})
        context_params = llama.llama_context_default_params()
        context_tokens = command.get("context_tokens")
        train_tokens = int(llama.llama_model_n_ctx_train(model))
        context_params.n_ctx = (
            int(context_tokens) if context_tokens else min(train_tokens, DEFAULT_MAX_CONTEXT_TOKENS)
        )
        context_params.n_seq_max = int(command.get("lanes", 1))
        context_params.n_threads = context_params.n_threads_batch = max(1, os.cpu_count() or 1)
        context = llama.llama_init_from_model(model, context_params)
        reply: Message = {"msg": "context_returned", "operation_id": operation_id, "ok": False}
        if context:
            from skippyctl.engine.generation import BatchEngine

            self.loaded.context = context
            self._arm_abort(context, int(command.get("serving_operation") or 0))
            lanes = int(llama.llama_n_seq_max(context))
            # Raises for a context it cannot serve (e.g. more lanes than its batch): the load
            # then fails with context_returned ok=false (see _load).
            self.loaded.generation = BatchEngine(
                _with_test_decode_delay(llama),
                model,
                context,
                lanes=lanes,
                emit=self._emit,
                observations=serving_events_enabled(),
                token_observations=os.environ.get(DEBUG_TOKEN_EVENTS_ENV) == "1",
            )
            reply.update(ok=True, context_tokens=int(llama.llama_n_ctx(context)), lanes=lanes)
        self._send(reply)
        if self.loaded.generation is not None:
            # Started after the reply, so the host sees the context before any kv message.
            self.loaded.generation.start()

    def _free(self) -> None:
        if self.loaded is None:
            return
        if self.loaded.generation is not None:
            self.loaded.generation.stop()
        if self.loaded.context:
            self.llama.llama_free(self.loaded.context)
        self.llama.llama_model_free(self.loaded.model)
        self.loaded = None


class _SlowDecode:
    """Test fault injection (SKIPPY_TEST_DECODE_DELAY_MS): every llama_decode takes at least
    this long, so tests can hold requests in flight on a model that decodes in microseconds."""

    def __init__(self, llama: Any, delay_s: float) -> None:
        self._llama = llama
        self._delay_s = delay_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llama, name)

    def llama_decode(self, *args: Any) -> Any:
        time.sleep(self._delay_s)
        return self._llama.llama_decode(*args)


def _with_test_decode_delay(llama: Any) -> Any:
    delay_ms = float(os.environ.get("SKIPPY_TEST_DECODE_DELAY_MS", "0") or 0)
    return _SlowDecode(llama, delay_ms / 1000) if delay_ms > 0 else llama


def _refused(request_id: str, reason: ReasonCode) -> Message:
    """The one terminal of a request the engine could not even start."""
    return {
        "msg": "gen_done",
        "request_id": request_id,
        "outcome": "failed",
        "reason": reason.value,
        "stop_reason": "error",
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "reused_tokens": 0,
        "prefill_ms": 0.0,
        "decode_ms": 0.0,
        "ttft_ms": None,
        "prefill_tokens_per_s": None,
        "decode_tokens_per_s": None,
        "shared_steps": 0,
        "max_batch": 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="skippyctl-engine", description=__doc__)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--ring-fd", type=int)
    parser.add_argument("--capture-debug-log", action="store_true")
    args = parser.parse_args(argv)
    channel = ControlChannel(socket.socket(fileno=args.control_fd))
    worker = Worker(channel, args.ring_fd, args.capture_debug_log)
    return worker.serve()


if __name__ == "__main__":
    sys.exit(main())
