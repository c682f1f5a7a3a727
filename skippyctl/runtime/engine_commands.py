"""Commands from the host to one engine, in order, without ever blocking the caller.

Contract: a command goes out from the caller's thread when the socket takes it at once and
nothing waits ahead of it; otherwise (the socket is full, or frames are already queued) through
one writer thread per engine (``skippy-engine-writer-<key>``), in order. :meth:`CommandWriter.send`
never blocks on the socket, so an engine that stops reading (SIGSTOP, a stuck process) can never
block an API handler, the scheduler or the engine's reader thread. A message over the frame
limit raises :class:`~skippyctl.engine.channel.MessageTooLarge` (a value JSON cannot carry,
:class:`~skippyctl.engine.channel.UnencodableMessage`) in ``send`` itself, before anything is
queued: the caller refuses the one request it belongs to. Once the engine is gone (a write
failed, or :meth:`CommandWriter.close`), ``send`` returns False and queues nothing.
"""

from __future__ import annotations

import queue
import threading

from skippyctl.engine.channel import ControlChannel, encode_frame
from skippyctl.engine.protocol_commands import Command
from skippyctl.engine.protocol_messages import EngineMessage


class CommandWriter:
    """The ordered, non-blocking command path to one engine (module docstring). Thread-safe."""

    def __init__(self, channel: ControlChannel[Command, EngineMessage], key: str) -> None:
        self._channel = channel
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._queue_lock = threading.Lock()
        """Held only around a non-blocking write or a queue put, never across blocking I/O."""
        self.queued = 0
        """Frames (or the rest of one) handed to the writer and not yet written: while any is,
        `send` queues behind them to keep the order."""
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._write_loop, name=f"skippy-engine-writer-{key}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def send(self, command: Command) -> bool:
        """Queue a command for the writer thread; never blocks. False if the engine is gone.
        Raises :class:`MessageTooLarge` or :class:`UnencodableMessage` (nothing queued) for a
        command that cannot be framed."""
        frame = encode_frame(command, self._channel.limit_bytes)
        if self._closed.is_set():
            return False
        with self._queue_lock:
            if self.queued == 0:
                # Nothing ahead of it: write now, from the caller's thread. Handing the frame to
                # the writer costs a thread switch, and on 2 busy cores the writer waits
                # milliseconds for the GIL: simultaneous requests then reach the engine spread
                # out and miss each other's prefill step.
                sent = self._channel.send_frame_now(frame)
                if sent is None:
                    self._closed.set()
                    return False
                if sent == len(frame):
                    return True
                frame = frame[sent:]
            self.queued += 1
            self._outbox.put(frame)
        return True

    def close(self) -> None:
        """The engine is gone: refuse later commands and let the writer thread end."""
        self._closed.set()
        self._outbox.put(None)

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the writer thread (after :meth:`close`)."""
        self._thread.join(timeout_s)

    def _write_loop(self) -> None:
        while True:
            frame = self._outbox.get()
            if frame is None or not self._channel.send_frame(frame):
                self._closed.set()
                return
            with self._queue_lock:
                self.queued -= 1
