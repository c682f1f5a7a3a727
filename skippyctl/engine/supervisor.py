"""Host side of one engine worker: start it, talk to it, notice when it dies.

The supervisor never parses the engine's output. Its stderr goes to /dev/null unless the operator
opts into a debug artifact (SKIPPY_ENGINE_STDERR=inherit). What the engine returns arrives on the
control channel and is queued, in order after the engine's ring, as authoritative items; an
end-of-stream on that channel means the engine exited, and the exit status says whether it was
asked to (`crashed` otherwise).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from skippyctl.engine.protocol import ControlChannel, Message
from skippyctl.events.envelope import LogicalId
from skippyctl.events.reasons import ReasonCode

# Host side: imported with the supervisor at host start, not in EngineProcess.__init__, which
# runs inside every load (time to model_available). Loads no native code by itself.
from skippyctl.native.ingress import SharedIngress
from skippyctl.pipeline.authority import (
    Authoritative,
    CancelRequested,
    ContextBegun,
    ContextReturned,
    EngineExited,
    LoadBegun,
    LoadReturned,
    OperationBound,
)
from skippyctl.pipeline.pipeline import Pipeline

STOP_GRACE_S: Final = 3.0
_LOAD_MESSAGES: Final = frozenset(
    {"hello", "load_begun", "load_returned", "context_begun", "context_returned"}
)


class EngineListener(Protocol):
    """Receives an engine's serving messages (generation observations) and its exit.

    Called on the engine's reader thread: implementations hand work off, never block.
    """

    def on_engine_message(self, engine: EngineProcess, message: Message) -> None: ...
    def on_engine_exit(self, engine: EngineProcess, crashed: bool) -> None: ...


CANCEL_GRACE_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class EngineHello:
    native: bool
    native_problem: str | None
    features: int


@dataclass(frozen=True, slots=True)
class LoadCommand:
    operation_id: LogicalId
    native_operation: int
    serving_operation: int
    """Native scope the engine keeps open while it serves (its abort callback watches it)."""
    model_id: LogicalId
    path: str
    context_tokens: int | None
    lanes: int
    gpu_layers: int


class EngineProcess:
    """One worker process and its channels. Thread-safe public methods."""

    def __init__(
        self,
        key: str,
        model_id: LogicalId,
        pipeline: Pipeline,
        native_library: Any | None,
        on_hello: Callable[[EngineProcess, EngineHello], None] | None = None,
        listener: EngineListener | None = None,
    ) -> None:
        self.key = key
        self.model_id = model_id
        self._pipeline = pipeline
        self._ring: Any | None = None
        self._stopping = threading.Event()
        self._exited = threading.Event()
        self._hello_seen = threading.Event()
        self._on_hello = on_hello
        self.hello: EngineHello | None = None
        self.listener = listener
        self._operations: dict[LogicalId, int] = {}
        self._settled: dict[LogicalId, threading.Event] = {}
        self._settled_lock = threading.Lock()
        host_sock, child_sock = socket.socketpair()
        pass_fds = [child_sock.fileno()]
        args = [sys.executable, "-m", "skippyctl.engine.worker"]
        args += ["--control-fd", str(child_sock.fileno())]
        if native_library is not None:
            self._ring = SharedIngress.create(library=native_library)
            pass_fds.append(self._ring.fd)
            args += ["--ring-fd", str(self._ring.fd)]
            if os.environ.get("SKIPPY_CAPTURE_NATIVE_LOG") == "1":
                args.append("--capture-debug-log")
        env = dict(os.environ, GGML_NO_BACKTRACE="1", PYTHONUNBUFFERED="1")
        stderr = None if os.environ.get("SKIPPY_ENGINE_STDERR") == "inherit" else subprocess.DEVNULL
        self.process = subprocess.Popen(
            args,
            pass_fds=pass_fds,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # a Ctrl-C for the CLI must not kill the engine mid-reply
        )
        child_sock.close()
        self._channel = ControlChannel(host_sock)
        self._engine_channel = (
            pipeline.attach_engine(key, self._ring) if self._ring is not None else None
        )
        self._reader = threading.Thread(
            target=self._read_loop, name=f"skippy-engine-{key}", daemon=True
        )
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def ring(self) -> Any | None:
        return self._ring

    def _authority(self, item: Authoritative) -> None:
        if self._engine_channel is not None:
            self._engine_channel.submit_authority(item)
        else:
            self._pipeline.submit_authority(item)

    def wait_hello(self, timeout_s: float) -> EngineHello | None:
        self._hello_seen.wait(timeout_s)
        return self.hello

    def load(self, command: LoadCommand) -> None:
        self._operations[command.operation_id] = command.native_operation
        self._serving_operation = command.serving_operation
        self._authority(
            OperationBound(
                self.key, command.operation_id, command.native_operation, command.model_id
            )
        )
        sent = self._channel.send(
            {
                "op": "load",
                "operation_id": command.operation_id,
                "native_operation": command.native_operation,
                "serving_operation": command.serving_operation,
                "path": command.path,
                "context_tokens": command.context_tokens,
                "lanes": command.lanes,
                "gpu_layers": command.gpu_layers,
            }
        )
        if not sent:
            self._exited.wait(STOP_GRACE_S)

    def abort_decode(self) -> None:
        """Stop any llama_decode in flight now (forced unload): the engine's abort callback
        reads this flag in shared memory. Every later decode of this engine aborts too."""
        serving = getattr(self, "_serving_operation", 0)
        if self._ring is not None and serving:
            self._ring.request_cancel(serving)

    def send(self, message: Message) -> bool:
        """Send a serving command (generate, cancel, drop_session); False if the engine is gone."""
        return self._channel.send(message)

    def cancel(self, operation_id: LogicalId, reason: ReasonCode) -> None:
        """Ask a running operation to stop; the engine is killed if it cannot stop by itself."""
        self._authority(CancelRequested(operation_id, reason))
        native_operation = self._operations.get(operation_id)
        if self._ring is not None and native_operation is not None:
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

    def _settled_event(self, operation_id: LogicalId) -> threading.Event:
        with self._settled_lock:
            return self._settled.setdefault(operation_id, threading.Event())

    def _settle(self, operation_id: LogicalId) -> None:
        self._settled_event(operation_id).set()

    def kill(self) -> None:
        self._stopping.set()
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)

    def stop(self, timeout_s: float = STOP_GRACE_S) -> None:
        """Orderly stop: ask, wait, then kill. Idempotent."""
        self._stopping.set()
        self._channel.send({"op": "shutdown"})
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout_s)
        self._exited.wait(timeout_s)
        self._reader.join(timeout_s)

    def _read_loop(self) -> None:
        while True:
            try:
                message = self._channel.receive()
            except ValueError:
                message = None
            if message is None:
                break
            self._on_message(message)
        returncode = self.process.wait()
        self._report_exit(returncode)

    def _report_exit(self, returncode: int) -> None:
        crashed = not self._stopping.is_set()
        if self.listener is not None:
            self.listener.on_engine_exit(self, crashed)
        self._authority(
            EngineExited(
                self.key,
                crashed=crashed,
                exit_status=returncode if returncode >= 0 else None,
                exit_signal=-returncode if returncode < 0 else None,
            )
        )
        if self._engine_channel is not None:
            self._pipeline.detach_engine(self.key)
        self._channel.close()
        self._exited.set()

    def _on_message(self, message: Message) -> None:
        kind = message.get("msg")
        if kind not in _LOAD_MESSAGES:
            listener = self.listener
            if listener is not None:
                listener.on_engine_message(self, message)
            return
        operation = LogicalId(str(message.get("operation_id", "none")))
        if kind == "hello":
            self.hello = EngineHello(
                native=bool(message.get("native")),
                native_problem=message.get("native_problem"),
                features=int(message.get("features", 0)),
            )
            if self._on_hello is not None:
                self._on_hello(self, self.hello)
            self._hello_seen.set()
        elif kind == "load_begun":
            self._authority(LoadBegun(operation))
        elif kind == "load_returned":
            if not message.get("ok"):
                self._settle(operation)
            self._authority(
                LoadReturned(
                    operation,
                    ok=bool(message.get("ok")),
                    model_size_bytes=message.get("model_size_bytes"),
                    parameters=message.get("parameters"),
                    duration_ms=message.get("duration_ms"),
                )
            )
        elif kind == "context_begun":
            self._authority(ContextBegun(operation))
        elif kind == "context_returned":
            self._settle(operation)
            self._authority(
                ContextReturned(
                    operation,
                    ok=bool(message.get("ok")),
                    context_tokens=message.get("context_tokens"),
                    lanes=message.get("lanes"),
                )
            )

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    def close_ring(self) -> None:
        if self._ring is not None:
            self._ring.close()
