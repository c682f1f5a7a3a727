"""The engine worker process: owns llama.cpp for one model.

Run by the host's supervisor (``skippyctl/runtime/engine_supervisor.py``) as
`python -m skippyctl.engine.engine_worker --control-fd N [--stream-fd S] [--ring-fd M
--native-library PATH] --serving-events on|off --debug-token-events on|off …`
(``engine/options.py``): everything the host decided about this engine arrives as arguments —
the test fault injections too — and the worker reads no configuration from its environment.
With a ring, llama.cpp's progress and log callbacks point straight at C functions of the native
library (no Python on the callback path), and the worker brackets each load in a native
operation scope.
Without one (legacy mode) it only reports return values. Either way the authoritative result of
every llama.cpp call is sent on the control channel after the native scope has ended, so the host
drains every native fact of the operation before it sees the return.

llama.cpp may abort this process (GGML_ASSERT on a bad vocabulary); the supervisor reports that as
`process_crash`. GGML_NO_BACKTRACE is set by the supervisor so an abort does not run gdb.

Nothing the host forwards from a client may end this process: an unusable frame or command is
counted and answered with `ProtocolError` — or, when it names its request or load, with that
command's one terminal (`GenDone` failed with invalid_configuration, `LoadReturned` failed) —
and any exception while handling a command ends that command only: a `Generate` with its one
`GenDone` (failed, with a reason code), a `Load` with a failed `LoadReturned`/`ContextReturned`.
The main thread reads the channel and answers `Ping` with `Pong` without touching the decode
thread, so the host can tell a stuck process from a busy one.

A ``Load`` — the model, its context, draft and plugins, and the resource messages that report
them — is ``engine/model_loader.py``; this module is the process: its entry, the native setup,
the serve loop and the handling of every other command.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Final, assert_never

from skippyctl.config.stream_wire import SocketChunks
from skippyctl.engine import options as engine_options
from skippyctl.engine.channel import ControlChannel, MalformedMessage, engine_side
from skippyctl.engine.model_loader import LoadedModel, ModelLoader, address_space_bytes
from skippyctl.engine.options import EngineOptions
from skippyctl.engine.protocol_commands import (
    AttachStream,
    Cancel,
    Command,
    Detokenize,
    DropSession,
    Embed,
    Generate,
    Load,
    Ping,
    ReleaseText,
    SaveSessions,
    Shutdown,
    Tokenize,
)
from skippyctl.engine.protocol_messages import (
    EmbeddingAnswer,
    EngineMessage,
    GenDone,
    Hello,
    LoadReturned,
    Pong,
    ProtocolError,
    StateExported,
    VocabularyAnswer,
)
from skippyctl.engine.stream_socket import StreamSocket
from skippyctl.events.reasons import ReasonCode

SAVE_TIMEOUT_S: Final = 60.0
"""The most a ``Shutdown`` waits for the decode thread to write session state files."""


class Worker:
    def __init__(
        self,
        channel: ControlChannel[EngineMessage, Command],
        ring_fd: int | None,
        capture_debug_log: bool,
        options: EngineOptions | None = None,
        native_library: str | None = None,
        streams: StreamSocket | None = None,
    ) -> None:
        self.channel = channel
        self.streams = streams
        """Where client connections arrive for ``AttachStream`` (None: every attach is
        refused, the host's text path serves)."""
        self.options = options or EngineOptions()
        self.adapter: Any | None = None
        self.native_problem: str | None = None
        self.features = 0
        """The native families this engine uses (the library's usable feature mask)."""
        self._load_events = False
        """The per-call model-open family is there: loads report through the native hooks."""
        self.loaded: LoadedModel | None = None
        self.protocol_errors = 0
        import llama_cpp

        llama_cpp.llama_backend_init()
        self.llama: Any = llama_cpp
        if self.options.compute_turns is not None:
            from skippyctl.engine.compute_turns import ComputeTurns, TakingTurns

            self.llama = TakingTurns(llama_cpp, ComputeTurns(self.options.compute_turns))
        if ring_fd is not None:
            self._setup_native(ring_fd, capture_debug_log, native_library)
        self._loader = ModelLoader(
            self.llama,
            self.options,
            adapter=self.adapter,
            load_events=self._load_events,
            emit=self._send,
            emit_many=self._send_many,
        )

    def _setup_native(
        self, ring_fd: int, capture_debug_log: bool, native_library: str | None
    ) -> None:
        """Attach the host's ring, with the library the host checked (``native_library``; None:
        the one built in the package)."""
        try:
            # Only the engine-side modules: this runs in every engine start, inside the time
            # to model_available (the host's fact decoding in native.ingress is not needed here).
            from skippyctl.native.abi import FeatureBit
            from skippyctl.native.devices import resolve_ggml
            from skippyctl.native.library import (
                NativeAbiIncompatible,
                NativeLibraryUnavailable,
                load_native_library,
            )
            from skippyctl.native.region import EngineAdapter, IngressRegion

            library = load_native_library(None if native_library is None else Path(native_library))
            ring = IngressRegion.attach(ring_fd, library=library)
            self.adapter = EngineAdapter(ring, capture_debug_log=capture_debug_log)
            self.features = library.features
            self._load_events = library.has(FeatureBit.RUNTIME_EVENTS)
            resolve_ggml(library)  # UNSUPPORTED, not an error, without the device family
            log_counting = library.has(FeatureBit.DIAGNOSTIC_EVENTS)
            if log_counting:
                # A failed GGML_ASSERT then tells the host why this process ends, before it does.
                self.adapter.install_fatal_hook()
        except (NativeLibraryUnavailable, NativeAbiIncompatible, OSError) as error:
            self.adapter = None
            self.native_problem = type(error).__name__
            return
        if self.options.test_progress_delay_us > 0:
            self.adapter.set_test_progress_delay_us(self.options.test_progress_delay_us)
        if log_counting:
            log_callback = self.llama.llama_log_callback(self.adapter.log_callback_address)
            self._log_callback = log_callback  # keep the function pointer object alive
            self.llama.llama_log_set(log_callback, self.adapter.user_data)

    def hello(self) -> None:
        self._send(Hello(os.getpid(), self.adapter is not None, self.native_problem, self.features))

    def serve(self) -> int:
        self.hello()
        while True:
            try:
                command = self.channel.receive()
            except MalformedMessage as error:
                # The frame was consumed whole: the channel is in step, carry on.
                self._malformed(error)
                continue
            if command is None:
                self._free()
                return 0
            try:
                serving = self._dispatch(command)
            except Exception:  # noqa: BLE001 - one command's failure must not end the engine
                self._command_failed(command)
                continue
            if not serving:
                self._free()
                return 0

    def _dispatch(self, command: Command) -> bool:
        """Handle one command; False when it ends the engine."""
        match command:
            case Ping():
                self._send(Pong(command.seq))
            case Load():
                loaded = self._loader.load(command)
                if loaded is not None:
                    self.loaded = loaded
            case Generate():
                self._generate(command)
            case Cancel():
                if self._batch is not None:
                    self._batch.cancel(command.request_id)
            case AttachStream():
                self._attach_stream(command)
            case ReleaseText():
                if self._batch is not None:
                    self._batch.release_text(command.request_id)
            case DropSession():
                if self._batch is not None:
                    self._batch.drop_session(command.session, command.reason)
            case SaveSessions():
                self._save_now(command)
            case Tokenize() | Detokenize():
                self._send(self._vocabulary(command))
            case Embed():
                self._send(self._embed(command))
            case Shutdown():
                try:
                    self._save_sessions(command)
                except Exception:  # noqa: BLE001 - a failed save must not keep the engine up
                    self.protocol_errors += 1
                return False
            case _:
                assert_never(command)
        return True

    def _malformed(self, error: MalformedMessage) -> None:
        """An unusable frame or command. One that names its request or load gets that command's
        terminal (so nothing waits for it); anything else cannot be attributed (the host encodes
        every frame itself, so it is a bug) and is counted."""
        if error.tag == "generate" and error.correlation_id is not None:
            self._send(GenDone.refused(error.correlation_id, ReasonCode.INVALID_CONFIGURATION))
        elif error.tag == "load" and error.correlation_id is not None:
            self._send(LoadReturned(error.correlation_id, ok=False))
        else:
            self.protocol_errors += 1
            self._send(ProtocolError(self.protocol_errors))

    def _command_failed(self, command: Command) -> None:
        """The terminal of a command whose handling raised (never re-raises)."""
        try:
            if isinstance(command, Generate):
                self._send(GenDone.refused(command.request_id, ReasonCode.INTERNAL_RUNTIME_FAILURE))
        except Exception:  # noqa: BLE001 - the serve loop must go on whatever happens here
            self.protocol_errors += 1

    def _attach_stream(self, command: AttachStream) -> None:
        """Hand the client connection that went ahead of `command` on the stream socket to the
        decode thread, which writes the request's text to it (``DecodeCore.attach_stream``);
        closed here when it cannot be. Without the connection the text goes to the host."""
        batch = self._batch
        fd = None if self.streams is None else self.streams.take(command.request_id)
        if batch is None:
            if fd is not None:
                os.close(fd)
            return
        if fd is None:
            batch.release_text(command.request_id)
            return
        chunks = SocketChunks(fd, command.head.encode(), command.tail.encode())
        batch.attach_stream(command.request_id, chunks)

    def _send(self, message: EngineMessage) -> None:
        # A host that went away is noticed by the serve loop (end of stream); nothing to do here.
        self.channel.send(message)

    def _send_many(self, messages: list[EngineMessage]) -> int:
        """One decode step's messages in one write; how many could not be framed."""
        _sent, unframable = self.channel.send_many(messages)
        return unframable

    @property
    def _batch(self) -> Any | None:
        return None if self.loaded is None else self.loaded.generation

    def _generate(self, command: Generate) -> None:
        from skippyctl.engine.generation import GenerateRequest
        from skippyctl.engine.sampling import SamplingParams

        if self.loaded is not None and self.loaded.pooling is not None:
            # An embedding model's context pools its outputs: there are no logits to sample.
            self._send(GenDone.refused(command.request_id, ReasonCode.UNSUPPORTED_CAPABILITY))
            return
        try:
            if self._batch is None:
                raise ValueError("no model is loaded in this engine")
            sampling = command.sampling
            timeout = command.timeout_s
            request = GenerateRequest(
                request_id=command.request_id,
                prompt=command.prompt,
                messages=command.messages,
                tools=command.tools,
                chat_template_kwargs=command.chat_template_kwargs,
                session=command.session,
                max_tokens=command.max_tokens,
                stop=command.stop,
                # Validated here, not on the host: an out-of-range value fails this request.
                sampling=SamplingParams(
                    temperature=sampling.temperature,
                    top_k=sampling.top_k,
                    top_p=sampling.top_p,
                    min_p=sampling.min_p,
                    repeat_penalty=sampling.repeat_penalty,
                    seed=sampling.seed,
                    logit_bias=sampling.logit_bias,
                    presence_penalty=sampling.presence_penalty,
                    frequency_penalty=sampling.frequency_penalty,
                    repeat_last_n=sampling.repeat_last_n,
                    grammar=sampling.grammar,
                    json_schema=sampling.json_schema,
                    json_schema_tags=sampling.json_schema_tags,
                    logprobs=sampling.logprobs,
                ),
                deadline_mono_s=None if timeout is None else time.monotonic() + timeout,
                hold_text=command.hold_text,
            )
        except Exception:  # noqa: BLE001 - any bad field refuses this request, never the engine
            self._send(GenDone.refused(command.request_id, ReasonCode.INVALID_CONFIGURATION))
            return
        self._batch.submit(request)

    def _vocabulary(self, command: Tokenize | Detokenize) -> VocabularyAnswer:
        """Tokenize or detokenize with the loaded model's vocabulary (read-only in llama.cpp,
        so the decode thread may run beside it, as llama-server's HTTP threads do)."""
        from skippyctl.engine.text import token_piece, tokenize

        if self.loaded is None or self.loaded.model is None:
            return VocabularyAnswer(command.request_id, problem="no model is loaded")
        llama = self.llama
        vocab = llama.llama_model_get_vocab(self.loaded.model)
        if isinstance(command, Tokenize):
            tokens = tokenize(
                llama,
                vocab,
                command.content,
                add_special=command.add_special,
                parse_special=command.parse_special,
            )
            pieces = (
                tuple(tuple(token_piece(llama, vocab, t)) for t in tokens)
                if command.with_pieces
                else None
            )
            return VocabularyAnswer(command.request_id, tokens=tuple(tokens), pieces=pieces)
        n_vocab = int(llama.llama_vocab_n_tokens(vocab))
        if any(not 0 <= t < n_vocab for t in command.tokens):
            return VocabularyAnswer(
                command.request_id,
                problem=f"a token id is outside the vocabulary (0..{n_vocab - 1})",
            )
        text = b"".join(token_piece(llama, vocab, t) for t in command.tokens)
        return VocabularyAnswer(command.request_id, content=text.decode("utf-8", errors="replace"))

    def _embed(self, command: Embed) -> EmbeddingAnswer:
        """Embed the inputs with the loaded embedding model (engine/embeddings.py). Its decode
        thread never decodes (generation is refused above), so the context is this thread's."""
        from skippyctl.engine.embeddings import EmbedRefused, embed
        from skippyctl.engine.text import tokenize

        loaded = self.loaded
        if loaded is None or loaded.model is None or loaded.context is None:
            return EmbeddingAnswer(
                command.request_id,
                problem="no model is loaded",
                reason=ReasonCode.STAGE_UNAVAILABLE,
            )
        llama = self.llama
        try:
            if command.texts:
                vocab = llama.llama_model_get_vocab(loaded.model)
                token_lists: tuple[tuple[int, ...], ...] = tuple(
                    tuple(tokenize(llama, vocab, text, add_special=True, parse_special=True))
                    for text in command.texts
                )
            else:
                token_lists = command.token_lists
            vectors = embed(llama, loaded.model, loaded.context, token_lists)
        except EmbedRefused as refused:
            return EmbeddingAnswer(
                command.request_id, problem=refused.problem, reason=refused.reason
            )
        return EmbeddingAnswer(
            command.request_id, vectors=vectors, prompt_tokens=sum(len(t) for t in token_lists)
        )

    def _save_now(self, command: SaveSessions) -> None:
        """On request, while serving: queued on the decode thread, not waited for (this thread
        goes on answering pings); each named session gets its ``StateExported``."""
        batch = self._batch
        fingerprint = None if self.loaded is None else self.loaded.fingerprint
        files = {f.session: f.path for f in command.save}
        if batch is None or fingerprint is None:
            for session in files:
                self._send(
                    StateExported(session, False, 0, 0, 0.0, ReasonCode.INTERNAL_RUNTIME_FAILURE)
                )
            return
        batch.save_sessions(files, command.budget_bytes, fingerprint, 0.0, report_missing=True)

    def _save_sessions(self, command: Shutdown) -> None:
        """Before the engine ends: the named sessions' KV state files (engine/kv_state.py).
        Without a fingerprint of the model nothing could be matched on restore: nothing is
        written."""
        batch = self._batch
        if not command.save or batch is None or self.loaded is None:
            return
        fingerprint = self.loaded.fingerprint
        if fingerprint is None:
            return
        files = {f.session: f.path for f in command.save}
        batch.save_sessions(files, command.save_budget_bytes, fingerprint, SAVE_TIMEOUT_S)

    def _free(self) -> None:
        if self.loaded is None:
            return
        if self.loaded.device_watch is not None:
            self.loaded.device_watch.stop()
        if self.loaded.generation is not None:
            self.loaded.generation.stop()
        if self.loaded.plugins is not None:
            self.loaded.plugins.close()  # after the decode thread: it calls into the link
        if self.loaded.draft is not None:
            self.loaded.draft.free()
        if self.loaded.context:
            self.llama.llama_free(self.loaded.context)
        self.llama.llama_model_free(self.loaded.model)
        self.loaded = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="skippyctl-engine", description=__doc__)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--ring-fd", type=int)
    parser.add_argument("--native-library")
    parser.add_argument("--stream-fd", type=int)
    engine_options.add_arguments(parser)
    args = parser.parse_args(argv)
    options = engine_options.from_arguments(args)
    if options.omp_spin_count is not None and "OMP_WAIT_POLICY" not in os.environ:
        # libgomp's only input, read once when llama.cpp is mapped (in Worker, below); an
        # operator's own GOMP_SPINCOUNT or OMP_WAIT_POLICY wins.
        os.environ.setdefault("GOMP_SPINCOUNT", str(options.omp_spin_count))
    if options.invariant_kernels:
        # Before llama.cpp is mapped (in Worker, below). Where it cannot be, the engine computes
        # with the stock kernels and its contexts say so (``batch_invariant`` 0).
        from skippyctl.engine.kernels import preload_invariant_kernels

        problem = preload_invariant_kernels()
        if problem is not None:
            sys.stderr.write(f"skippyctl-engine: {problem}\n")
    channel = engine_side(socket.socket(fileno=args.control_fd))
    streams = None if args.stream_fd is None else StreamSocket(socket.socket(fileno=args.stream_fd))
    worker = Worker(
        channel, args.ring_fd, options.capture_debug_log, options, args.native_library, streams
    )
    # After llama.cpp and the native library are mapped.
    _test_address_space_limit(options.test_address_space_limit_mib)
    if options.test_template_date is not None:
        import datetime

        from skippyctl.engine.chat_template import pin_today

        pin_today(datetime.date.fromisoformat(options.test_template_date))
    return worker.serve()


def _test_address_space_limit(limit_mib: int | None) -> None:
    """Test fault injection (``--test-address-space-limit-mib``, the host's
    SKIPPY_TEST_ENGINE_AS_LIMIT_MB): run this engine under an address-space limit (RLIMIT_AS) of
    that many MiB above what it maps once llama.cpp is loaded, so a context that fits the
    machine but not the limit is refused for memory."""
    if limit_mib is None:
        return
    import resource

    limit = address_space_bytes() + limit_mib * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))


if __name__ == "__main__":
    sys.exit(main())
