"""Host side of one engine worker: start it, talk to it, notice when it dies.

Host code (it moved here from the engine package): it depends on the engine only through the
protocol (``engine/protocol.py``, ``engine/channel.py``) and the worker's spawn arguments
(``engine/options.py``), and on the pipeline, its listener and its topology only through the
protocols of ``runtime/engine_seams.py`` (:class:`EnginePipeline`: the three things it needs —
register and drain the engine's ring, submit authoritative items after the ring's facts, submit
an event — never the concrete pipeline).

The supervisor never parses the engine's output. Its stderr goes to /dev/null unless the operator
opts into a debug artifact (SKIPPY_ENGINE_STDERR=inherit). What the engine returns arrives on the
control channel and is queued, in order after the engine's ring, as authoritative items; an
end-of-stream on that channel means the engine exited, and the exit status says whether it was
asked to (`crashed` otherwise). An engine whose model is split across stages has an
:class:`EngineTopology`: it hears the load and context returns, and when the engine crashed it
says why (a lost stage: `stage_unavailable`) before the exit is reported; the engine's link
figures (`link` messages) go to it too. Resource messages (load phases, devices, allocations,
compute failures) become events (``runtime/resource_events.py``) queued as ``Observed`` items,
in order with the return values around them.

An engine gets the host's environment without its credentials (``CREDENTIAL_VARIABLES``: it
needs none, and the plugin sidecars it starts inherit its environment) and its configuration as
arguments (``engine/options.py``), never through the environment; its stderr goes to the host's
only with ``inherit_stderr`` (the SKIPPY_ENGINE_STDERR setting).

Commands go out through the engine's :class:`~skippyctl.runtime.engine_commands.CommandWriter`
(``runtime/engine_commands.py``): in order, never blocking the caller, a message over the frame
limit refused in `send` itself before anything is queued.

An unusable frame or message from the engine is counted (`protocol_errors`) and reported as
`invariant_protocol_violation`; it never ends the reader (only end of stream does). An unusable
`gen_done` that still names its request is handed on as that request's failed terminal, so no
request waits for one that will never come.

Liveness: every message from the engine counts as a sign of life (`silent_for_s`); `ping` asks the
engine's main thread (not its decode thread) for a `pong`, at most one unanswered at a time.

A load that ends without a serving context (llama.cpp returned NULL, the load raised in the
engine, it was cancelled, or the engine had to be killed) retires the engine: `on_retire` is
called once and its owner stops it (without an owner the engine stops itself). No failed or
cancelled load leaves an idle engine behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, assert_never

from skippyctl.config.runtime_settings import inherited_environment, python_module_command
from skippyctl.engine.channel import MalformedMessage, host_side
from skippyctl.engine.options import EngineOptions
from skippyctl.engine.protocol_commands import AttachStream, Command, Load, Ping, Shutdown
from skippyctl.engine.protocol_messages import (
    AllocationRefused,
    Backends,
    ComputeFailed,
    ContextBegun,
    ContextReturned,
    CpuFallback,
    DeviceMemory,
    EmbeddingAnswer,
    EngineMessage,
    GenDone,
    GenFirstToken,
    GenPrefillDone,
    GenPrefillProgress,
    GenProgress,
    GenSpecSwitched,
    GenStarted,
    GenText,
    GenToken,
    Hello,
    Kv,
    Link,
    LoadBegun,
    LoadPhase,
    LoadReturned,
    MemoryAllocated,
    PluginCounters,
    PluginReported,
    Pong,
    ProtocolError,
    SessionChanged,
    StateExported,
    StateImported,
    VocabularyAnswer,
)
from skippyctl.engine.stream_socket import StreamSocket, stream_socket_pair
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId, Scope, make_event, summaries
from skippyctl.events.reasons import Outcome, ReasonCode

# Host side: imported with the supervisor at host start, not in EngineProcess.__init__, which
# runs inside every load (time to model_available). Loads no native code by itself.
from skippyctl.native.ingress import IngressClosed, SharedIngress
from skippyctl.native.library import NativeLibrary
from skippyctl.pipeline.authority import (
    Authoritative,
    CancelRequested,
    EngineExited,
    Observed,
    OperationBound,
)
from skippyctl.pipeline.authority import (
    ContextBegun as ContextBegunItem,
)
from skippyctl.pipeline.authority import (
    ContextReturned as ContextReturnedItem,
)
from skippyctl.pipeline.authority import (
    LoadBegun as LoadBegunItem,
)
from skippyctl.pipeline.authority import (
    LoadReturned as LoadReturnedItem,
)
from skippyctl.plugins.sidecar_supervisor import CREDENTIAL_VARIABLES
from skippyctl.runtime.engine_commands import CommandWriter
from skippyctl.runtime.engine_seams import EngineListener, EnginePipeline, EngineTopology
from skippyctl.runtime.plugin_events import plugin_events
from skippyctl.runtime.resource_events import resource_events

STOP_GRACE_S: Final = 3.0
_ENGINE_ENVIRONMENT: Final = {"GGML_NO_BACKTRACE": "1", "PYTHONUNBUFFERED": "1"}
"""Set for every engine: an abort must not run gdb for a backtrace, and its output is not
buffered."""
WRITER_JOIN_S: Final = 1.0


CANCEL_GRACE_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class EngineHello:
    native: bool
    native_problem: str | None
    features: int


@dataclass(frozen=True, slots=True)
class LoadCommand:
    model_id: LogicalId
    load: Load


class EngineProcess:
    """One worker process and its channels. Thread-safe public methods."""

    def __init__(
        self,
        key: str,
        model_id: LogicalId,
        pipeline: EnginePipeline,
        native_library: NativeLibrary | None,
        on_hello: Callable[[EngineProcess, EngineHello], None] | None = None,
        listener: EngineListener | None = None,
        on_retire: Callable[[EngineProcess], None] | None = None,
        options: EngineOptions | None = None,
        topology: EngineTopology | None = None,
        inherit_stderr: bool = False,
    ) -> None:
        self.key = key
        self.topology = topology
        self.model_id = model_id
        self._kv_events = (options or EngineOptions()).serving_events
        """KV events are serving events: with serving events off (the benchmark baseline) the
        resource messages' KV events are left out like the engine's own ``kv`` messages."""
        self._pipeline = pipeline
        self._ring: SharedIngress | None = None
        self._serving_operation = 0
        self._stopping = threading.Event()
        self._device: str | None = None
        """The device the model's load selected (its resource events name it)."""
        self._killed_for: ReasonCode | None = None
        """Why the host killed an engine it did not mean to stop (an unresponsive one): its
        exit is a crash with this reason."""
        self._exited = threading.Event()
        self._hello_seen = threading.Event()
        self._on_hello = on_hello
        self._on_retire = on_retire
        self.hello: EngineHello | None = None
        self.listener = listener
        self._operations: dict[LogicalId, int] = {}
        self._settled: dict[LogicalId, threading.Event] = {}
        self._settled_lock = threading.Lock()
        # Orders a cancel against the context's return, so this process and the reconciler
        # agree on whether the load ended cancelled (then the engine is retired) or serves.
        self._load_lock = threading.Lock()
        self._cancelled: set[LogicalId] = set()
        self._retired = False
        self._ring_closed = False
        self._serving = False
        self.protocol_errors = 0
        self._last_heard_ns = time.monotonic_ns()
        self._ping_lock = threading.Lock()
        self._ping_outstanding = False
        self._pings = 0
        self.pongs = 0
        """Pings the engine answered (for operators and tests)."""
        host_sock, child_sock = socket.socketpair()
        host_streams, child_streams = stream_socket_pair()
        pass_fds = [child_sock.fileno(), child_streams.fileno()]
        args = python_module_command("skippyctl.engine.engine_worker")
        args += ["--control-fd", str(child_sock.fileno())]
        args += ["--stream-fd", str(child_streams.fileno())]
        args += (options or EngineOptions()).argv()
        try:
            if native_library is not None:
                self._ring = SharedIngress.create(library=native_library)
                pass_fds.append(self._ring.fd)
                args += ["--ring-fd", str(self._ring.fd)]
                args += ["--native-library", str(native_library.path)]  # the one the host checked
            env = inherited_environment(drop=CREDENTIAL_VARIABLES, overrides=_ENGINE_ENVIRONMENT)
            stderr = None if inherit_stderr else subprocess.DEVNULL
            self.process = subprocess.Popen(
                args,
                pass_fds=pass_fds,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,  # a Ctrl-C for the CLI must not kill the engine mid-reply
            )
        except BaseException:
            host_sock.close()
            child_sock.close()
            host_streams.close()
            child_streams.close()
            self.close_ring()
            raise
        child_sock.close()
        child_streams.close()
        self._streams = StreamSocket(host_streams)
        self._attach_lock = threading.Lock()
        try:
            self._channel = host_side(host_sock)
            self._commands = CommandWriter(self._channel, key)
            self._engine_channel = (
                pipeline.attach_engine(key, self._ring, model_id)
                if self._ring is not None
                else None
            )
            self._reader = threading.Thread(
                target=self._read_loop, name=f"skippy-engine-{key}", daemon=True
            )
            self._reader.start()
            self._commands.start()
        except BaseException:
            # Never leave a process behind that nobody watches.
            self.process.kill()
            self.process.wait()
            host_sock.close()
            host_streams.close()
            if self._ring is not None:
                pipeline.detach_engine(key)
            self.close_ring()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def ring(self) -> SharedIngress | None:
        return self._ring

    @property
    def serving(self) -> bool:
        """The engine has a serving context (its load completed) and has not exited."""
        return self._serving and not self._exited.is_set()

    def _authority(self, item: Authoritative) -> None:
        if self._engine_channel is not None:
            self._engine_channel.submit_authority(item)
        else:
            self._pipeline.submit_authority(item)

    def wait_hello(self, timeout_s: float) -> EngineHello | None:
        self._hello_seen.wait(timeout_s)
        return self.hello

    def load(self, command: LoadCommand) -> None:
        load = command.load
        operation_id = LogicalId(load.operation_id)
        self._operations[operation_id] = load.native_operation
        self._serving_operation = load.serving_operation
        self._authority(
            OperationBound(self.key, operation_id, load.native_operation, command.model_id)
        )
        if not self.send(load):
            self._exited.wait(STOP_GRACE_S)

    def abort_decode(self) -> None:
        """Stop any llama_decode in flight now (forced unload): the engine's abort callback
        reads this flag in shared memory. Every later decode of this engine aborts too."""
        serving = self._serving_operation
        if self._ring is not None and serving:
            with contextlib.suppress(IngressClosed):  # the engine is gone already
                self._ring.request_cancel(serving)

    def send(self, command: Command) -> bool:
        """Queue a command for the writer thread; never blocks. False if the engine is gone.
        Raises :class:`MessageTooLarge` or :class:`UnencodableMessage` (nothing queued) for a
        command that cannot be framed."""
        return self._commands.send(command)

    def attach_stream(self, command: AttachStream, fd: int) -> bool:
        """Hand the engine a client connection (`fd`, which the caller keeps) to write
        `command`'s request text to; never blocks. False if it could not be handed over (the
        engine then never has it)."""
        with self._attach_lock:  # descriptors and commands reach the engine in the same order
            if not self._streams.give(command.request_id, fd):
                return False
            return self.send(command)

    # -- liveness -------------------------------------------------------------------------------
    def silent_for_s(self, now_ns: int | None = None) -> float:
        """Seconds since the engine last sent anything (a pong, text, any message)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        return max(0.0, (now - self._last_heard_ns) / 1e9)

    def ping(self) -> bool:
        """Ask the engine for a pong unless a ping is still unanswered; True if one was sent."""
        with self._ping_lock:
            if self._ping_outstanding:
                return False
            self._ping_outstanding = True
            self._pings += 1
            seq = self._pings
        return self.send(Ping(seq))

    # -- load cancellation ----------------------------------------------------------------------
    def cancel(self, operation_id: LogicalId, reason: ReasonCode) -> None:
        """Ask a running operation to stop; the engine is killed if it cannot stop by itself."""
        with self._load_lock:
            self._cancelled.add(operation_id)
            self._authority(CancelRequested(operation_id, reason))
        native_operation = self._operations.get(operation_id)
        if self._ring is not None and native_operation is not None:
            with contextlib.suppress(IngressClosed):  # the engine is gone already
                self._ring.request_cancel(native_operation)
        threading.Thread(
            target=self._kill_unless_settled,
            args=(operation_id, CANCEL_GRACE_S),
            name=f"skippy-cancel-{self.key}",
            daemon=True,
        ).start()

    def _kill_unless_settled(self, operation_id: LogicalId, grace_s: float) -> None:
        # Context creation, and any load in legacy mode, cannot be interrupted through the
        # progress callback; the operation's terminal is already decided by CancelRequested.
        if not self._settled_event(operation_id).wait(grace_s):
            self.kill()
            self._retire()

    def _settled_event(self, operation_id: LogicalId) -> threading.Event:
        with self._settled_lock:
            return self._settled.setdefault(operation_id, threading.Event())

    def _settle(self, operation_id: LogicalId) -> None:
        self._settled_event(operation_id).set()

    def _retire(self) -> None:
        """This engine will never serve: hand it to its owner to stop (once)."""
        with self._load_lock:
            if self._retired:
                return
            self._retired = True
        if self._on_retire is not None:
            self._on_retire(self)
        else:
            threading.Thread(
                target=self.stop, name=f"skippy-engine-stop-{self.key}", daemon=True
            ).start()

    # -- stopping -------------------------------------------------------------------------------
    def kill_unresponsive(self) -> None:
        """End an engine that stopped answering while serving: its exit is reported as a
        crash with reason ``timeout`` (so its model's restart policy applies), not as a stop."""
        self._killed_for = ReasonCode.TIMEOUT
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)

    def kill(self) -> None:
        self._stopping.set()
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)

    def stop(self, timeout_s: float = STOP_GRACE_S, shutdown: Shutdown | None = None) -> None:
        """Orderly stop: ask (``shutdown``: the command, e.g. one that saves session state
        first), wait, then kill (a stopped or stuck engine too). Idempotent; returns once the
        process is reaped."""
        self._stopping.set()
        self.send(shutdown or Shutdown())
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout_s)
        self._exited.wait(timeout_s)
        if self._reader is not threading.current_thread():
            self._reader.join(timeout_s)

    # -- reading --------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        while True:
            try:
                message = self._channel.receive()
            except MalformedMessage as error:
                self._last_heard_ns = time.monotonic_ns()
                self._malformed(error)
                continue
            if message is None:
                break
            self._last_heard_ns = time.monotonic_ns()
            try:
                self._on_message(message)
            except Exception:  # noqa: BLE001 - a bad message must not end the reader
                self._protocol_error()
        returncode = self.process.wait()
        self._report_exit(returncode)

    def _malformed(self, error: MalformedMessage) -> None:
        self._protocol_error()
        listener = self.listener
        if error.tag == "gen_done" and error.correlation_id is not None and listener is not None:
            failed = GenDone.refused(error.correlation_id, ReasonCode.INTERNAL_RUNTIME_FAILURE)
            listener.on_engine_message(self, failed)

    def _protocol_error(self) -> None:
        self.protocol_errors += 1
        self._pipeline.submit(
            make_event(
                EventId.INVARIANT_PROTOCOL_VIOLATION,
                scope=Scope(model_id=self.model_id),
                outcome=Outcome.FAILURE,
                reason_code=ReasonCode.INTERNAL_RUNTIME_FAILURE,
                summaries=summaries(count=self.protocol_errors),
            )
        )

    def _report_exit(self, returncode: int) -> None:
        crashed = not self._stopping.is_set()
        self._commands.close()
        reason: ReasonCode | None = self._killed_for if crashed else None
        if crashed and reason is None and self.topology is not None:
            try:
                reason = self.topology.engine_crashed()
            except Exception:  # noqa: BLE001 - attribution is best effort; the exit is reported
                reason = None
        if self.listener is not None:
            self.listener.on_engine_exit(self, crashed, reason)
        self._authority(
            EngineExited(
                self.key,
                crashed=crashed,
                exit_status=returncode if returncode >= 0 else None,
                exit_signal=-returncode if returncode < 0 else None,
                reason=reason,
            )
        )
        if self._engine_channel is not None:
            self._pipeline.detach_engine(self.key)
        # The peer is gone, so a write in flight fails at once; then the socket can close.
        self._commands.join(WRITER_JOIN_S)
        self._channel.close()
        self._streams.close()
        self._exited.set()

    def _on_message(self, message: EngineMessage) -> None:
        match message:
            case Pong():
                with self._ping_lock:
                    self._ping_outstanding = False
                    self.pongs += 1
            case ProtocolError():  # the engine could not use a frame we sent
                self._protocol_error()
            case Hello():
                self.hello = EngineHello(message.native, message.native_problem, message.features)
                if self._on_hello is not None:
                    self._on_hello(self, self.hello)
                self._hello_seen.set()
            case LoadBegun():
                self._authority(LoadBegunItem(LogicalId(message.operation_id)))
            case LoadReturned():
                self._on_load_returned(message)
            case ContextBegun():
                self._authority(ContextBegunItem(LogicalId(message.operation_id)))
            case ContextReturned():
                self._on_context_returned(message)
            case Link():
                if self.topology is not None:
                    self.topology.engine_link(message)
            case PluginReported() | PluginCounters():
                for event in plugin_events(message, self.model_id):
                    self._authority(Observed(event))
            case (
                LoadPhase()
                | Backends()
                | MemoryAllocated()
                | AllocationRefused()
                | CpuFallback()
                | ComputeFailed()
                | DeviceMemory()
            ):
                if isinstance(message, Backends):
                    selected = [d.name for d in message.devices if d.selected]
                    self._device = selected[0] if selected else None
                events = resource_events(message, self.model_id, self._kv_events, self._device)
                for event in events:
                    self._authority(Observed(event))
            case (
                GenStarted()
                | GenText()
                | GenPrefillProgress()
                | GenPrefillDone()
                | GenFirstToken()
                | GenProgress()
                | GenToken()
                | GenSpecSwitched()
                | GenDone()
                | Kv()
                | SessionChanged()
                | StateExported()
                | StateImported()
                | VocabularyAnswer()
                | EmbeddingAnswer()
            ):
                if self.listener is not None:
                    self.listener.on_engine_message(self, message)
            case _:
                assert_never(message)

    def _on_load_returned(self, message: LoadReturned) -> None:
        operation = LogicalId(message.operation_id)
        if not message.ok:
            self._settle(operation)
        self._authority(
            LoadReturnedItem(
                operation,
                ok=message.ok,
                model_size_bytes=message.model_size_bytes,
                parameters=message.parameters,
                duration_ms=message.duration_ms,
                layers=message.layers,
                context_train_tokens=message.context_train_tokens,
                vocab_size=message.vocab_size,
                files=message.files,
                chat_template=_chat_template_facts(message),
            )
        )
        if self.topology is not None:
            self.topology.engine_loaded(message.ok)
        if not message.ok:
            self._retire()

    def _on_context_returned(self, message: ContextReturned) -> None:
        operation = LogicalId(message.operation_id)
        with self._load_lock:
            cancelled = operation in self._cancelled
            self._settle(operation)
            self._authority(
                ContextReturnedItem(
                    operation,
                    ok=message.ok,
                    context_tokens=message.context_tokens,
                    lanes=message.lanes,
                    context_tokens_per_lane=message.context_tokens_per_lane,
                    reason=message.reason,
                    batch_tokens=message.batch_tokens,
                    threads=message.threads,
                    flash_attention=message.flash_attention,
                    batch_invariant=message.batch_invariant,
                )
            )
            self._serving = message.ok and not cancelled
        if self.topology is not None:
            self.topology.engine_serving(self._serving)
        if not self._serving:
            self._retire()
        elif self.listener is not None and message.lanes is not None:
            # Before any serving message: the engine's decode thread starts after this reply.
            self.listener.on_engine_serving(
                self, message.lanes, message.tool_call_format, message.pooling
            )

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    def close_ring(self) -> None:
        """Idempotent: unmap the shared ring (after the engine exited)."""
        with self._load_lock:
            if self._ring_closed or self._ring is None:
                return
            self._ring_closed = True
        self._ring.close()


def _chat_template_facts(message: LoadReturned) -> tuple[tuple[str, str | bool], ...]:
    facts: list[tuple[str, str | bool]] = []
    if message.chat_template_source is not None:
        facts.append(("source", message.chat_template_source))
    if message.chat_template_sha256 is not None:
        facts.append(("sha256", message.chat_template_sha256))
    if message.chat_template_tool_use:
        facts.append(("tool_use", True))
    return tuple(facts)
