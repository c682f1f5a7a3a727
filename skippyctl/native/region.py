"""The engine-side half of the native ingress: one mapping of a shared region and its adapters.

Contract:

- ``IngressRegion.attach(fd)`` maps a region the host initialised (``SharedIngress.create`` in
  ``ingress``) from an inherited fd; ``EngineAdapter`` creates a process-local adapter on it
  whose C functions llama.cpp calls directly (progress, log and abort callbacks).
- ``close()`` is idempotent; it destroys the adapters created on this mapping and unmaps only
  when no wrapper call is in progress. llama.cpp hooks pointing at an adapter must be unhooked
  (``llama_log_set(None, None)``, model/context freed) before the adapter or mapping is closed.
- The host-side reading API (``wait``, ``drain``, ``stats``, the debug log) lives in
  ``ingress.SharedIngress``, a subclass. This module is what an engine worker imports, so it
  defines no dataclasses, numpy types or fact decoding: every engine process pays for its imports
  on every model load (see docs/BENCHMARKS.md §3).
- Nothing here runs on a producer path: producers are C functions called by llama.cpp.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
from collections.abc import Iterator
from typing import Self

from skippyctl.native import abi
from skippyctl.native.library import NativeLibrary, native_library


class IngressClosed(RuntimeError):
    """The wrapper was closed; its mapping is gone."""


class IngressRegion:
    """One mapping of a shared ingress region (host: created it; engine: attached to it)."""

    def __init__(
        self,
        *,
        library: NativeLibrary,
        fd: int,
        owns_fd: bool,
        mapping: mmap.mmap,
        view: ctypes.Array[ctypes.c_char],
        handle: int,
        host: bool,
    ) -> None:
        self._library = library
        self._fd = fd
        self._owns_fd = owns_fd
        self._mapping: mmap.mmap | None = mapping
        self._view: ctypes.Array[ctypes.c_char] | None = view
        self._handle = handle
        self._host = host
        self._size = len(mapping)
        self._state_lock = threading.Lock()
        self._idle = threading.Condition(self._state_lock)
        self._users = 0
        self._closing = False
        self._marked_closed = False
        self._adapters: list[EngineAdapter] = []

    # ---- construction ----

    @classmethod
    def attach(cls, fd: int, *, library: NativeLibrary | None = None) -> Self:
        """Engine side: map an initialised region from an inherited fd (the fd stays the
        caller's; the mapping outlives it)."""
        lib = library if library is not None else native_library()
        size = os.fstat(fd).st_size
        if size <= 0:
            raise ValueError("not a skippy ingress region (empty)")
        mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        view = (ctypes.c_char * size).from_buffer(mapping)
        handle = lib.cdll.skippy_ingress_attach(ctypes.addressof(view), size)
        if not handle:
            del view
            mapping.close()
            raise ValueError("not a skippy ingress region (magic, version or layout mismatch)")
        return cls(
            library=lib,
            fd=fd,
            owns_fd=False,
            mapping=mapping,
            view=view,
            handle=int(handle),
            host=False,
        )

    # ---- properties ----

    @property
    def fd(self) -> int:
        return self._fd

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def library(self) -> NativeLibrary:
        return self._library

    @property
    def handle(self) -> int:
        """This process's ``skippy_ingress_t*`` handle on the mapping (valid until close)."""
        return self._handle

    @property
    def mapping_address(self) -> int:
        """Where this process mapped the region (differs between host and engine)."""
        if self._view is None:
            raise IngressClosed("ingress wrapper is closed")
        return ctypes.addressof(self._view)

    @property
    def is_host(self) -> bool:
        return self._host

    @property
    def closed(self) -> bool:
        return self._closing

    # ---- lifetime guard ----

    @contextlib.contextmanager
    def _use(self) -> Iterator[int]:
        with self._state_lock:
            if self._closing:
                raise IngressClosed("ingress wrapper is closed")
            self._users += 1
        try:
            yield self._handle
        finally:
            with self._state_lock:
                self._users -= 1
                if self._users == 0:
                    self._idle.notify_all()

    def request_cancel(self, operation_id: int) -> None:
        """Sets the shared cancel word; the engine's progress/abort callbacks act on it."""
        with self._use() as handle:
            self._library.cdll.skippy_ingress_request_cancel(handle, operation_id)

    def mark_closed(self) -> None:
        """Marks the shared region closed: producers count ``rejected_closed`` from now on and
        a sleeping ``wait`` returns. Pending facts can still be drained."""
        with self._use() as handle:
            if not self._marked_closed:
                self._marked_closed = True
                self._library.cdll.skippy_ingress_close(handle)

    def close(self) -> None:
        """Idempotent. Host: marks the region closed, then unmaps and closes the fd. Engine:
        destroys its adapters and unmaps (the region stays open for the host)."""
        if self._host:
            with contextlib.suppress(IngressClosed):
                self.mark_closed()
        with self._state_lock:
            if self._closing:
                return
            self._closing = True
            while self._users:
                self._idle.wait()
        for adapter in list(self._adapters):
            adapter._destroy()
        self._adapters.clear()
        self._library.cdll.skippy_ingress_detach(self._handle)
        view, self._view = self._view, None
        mapping, self._mapping = self._mapping, None
        del view
        if mapping is not None:
            mapping.close()
        if self._owns_fd:
            os.close(self._fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- adapter registry (engine side) ----

    def _register(self, adapter: EngineAdapter) -> None:
        with self._state_lock:
            if self._closing:
                raise IngressClosed("ingress wrapper is closed")
            self._adapters.append(adapter)

    def _unregister(self, adapter: EngineAdapter) -> None:
        with self._state_lock, contextlib.suppress(ValueError):
            self._adapters.remove(adapter)


class EngineAdapter:
    """Engine-side, process-local adapter: operation scopes and the llama.cpp hook addresses.

    Put ``progress_callback_address`` / ``log_callback_address`` / ``abort_callback_address``
    into llama.cpp's callback fields with ``user_data`` as their user data; those calls then go
    straight to C and never touch Python.
    """

    def __init__(self, ingress: IngressRegion, capture_debug_log: bool = False) -> None:
        flags = abi.AdapterFlag.CAPTURE_DEBUG_LOG if capture_debug_log else 0
        self._ingress = ingress
        self._lib = ingress.library
        with ingress._use() as handle:
            created = self._lib.cdll.skippy_adapter_create(handle, int(flags))
        if not created:
            raise RuntimeError("skippy_adapter_create failed")
        self._handle: int | None = int(created)
        self._fatal_hook = False
        ingress._register(self)

    @property
    def handle(self) -> int:
        """The ``skippy_adapter_t*``."""
        if self._handle is None:
            raise IngressClosed("adapter is closed")
        return self._handle

    @property
    def user_data(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(self.handle)

    @property
    def progress_callback_address(self) -> int:
        return self._lib.address_of("skippy_llama_progress_callback")

    @property
    def log_callback_address(self) -> int:
        return self._lib.address_of("skippy_llama_log_callback")

    @property
    def abort_callback_address(self) -> int:
        return self._lib.address_of("skippy_llama_abort_callback")

    @property
    def trampoline_address(self) -> int:
        return self._lib.address_of("skippy_trampoline_v1")

    def reporter(self) -> abi.skippy_runtime_event_reporter_v1:
        """A reporter ``{1, 24, skippy_trampoline_v1, adapter}`` for a Skippy runtime."""
        out = abi.skippy_runtime_event_reporter_v1()
        self._lib.cdll.skippy_adapter_reporter(self.handle, ctypes.byref(out))
        return out

    def operation_begin(self, operation_id: int, model_id: int = 0) -> None:
        status = int(self._lib.cdll.skippy_operation_begin(self.handle, operation_id, model_id))
        if status != abi.Status.OK:
            raise ValueError(
                f"operation_begin({operation_id}) refused: {abi.Status(status).name} "
                "(operation id 0, or a scope is already active)"
            )

    def operation_end(self) -> None:
        """After this returns no callback pushes anything stamped with the ended operation."""
        self._lib.cdll.skippy_operation_end(self.handle)

    def model_load_begin(self, operation_id: int, model_id: int) -> None:
        """Operation begin + MODEL_OPEN STARTED."""
        status = int(self._lib.cdll.skippy_model_load_begin(self.handle, operation_id, model_id))
        if status != abi.Status.OK:
            raise ValueError(f"model_load_begin({operation_id}) refused: {abi.Status(status).name}")

    def report_device(self, n_gpu_layers: int) -> abi.Status:
        """BACKEND_DEVICE_SELECTED once per operation (needs ``devices.resolve_ggml`` first)."""
        return abi.Status(
            int(self._lib.cdll.skippy_model_load_report_device(self.handle, n_gpu_layers))
        )

    def model_load_end(self, status: int, failure_code: int = abi.FailureCode.NONE) -> None:
        """FINISHED (status OK) or FAILED_HANDLED with this status/failure code; ends the scope."""
        self._lib.cdll.skippy_model_load_end(self.handle, int(status), int(failure_code))

    def install_fatal_hook(self) -> abi.Status:
        """From now on a ggml abort in this process (a failed GGML_ASSERT) first pushes a fatal
        failure fact into the ring (needs ``devices.resolve_ggml`` first; process-wide, so one
        adapter per process). UNSUPPORTED when ggml has no abort hook."""
        status = abi.Status(int(self._lib.cdll.skippy_adapter_install_fatal_hook(self.handle)))
        self._fatal_hook = status is abi.Status.OK
        return status

    def set_test_progress_delay_us(self, delay_us: int) -> None:
        self._lib.cdll.skippy_adapter_set_test_progress_delay_us(self.handle, delay_us)

    def emit(self, event: abi.skippy_runtime_event_v1) -> None:
        """Calls the trampoline with a ctypes event (what a Skippy runtime reporter does)."""
        self._lib.cdll.skippy_trampoline_v1(ctypes.byref(event), self.handle)

    def emit_raw(self, data: bytes) -> None:
        """Test emitter: the bytes are the event. They must cover the header and struct_size."""
        if len(data) < 8:
            raise ValueError("an event needs at least its 8-byte header")
        struct_size = int.from_bytes(data[4:8], "little")
        if len(data) < struct_size:
            raise ValueError(f"{len(data)} bytes do not cover struct_size {struct_size}")
        buffer = ctypes.create_string_buffer(data, len(data))
        self._lib.cdll.skippy_test_emit_raw(self.handle, buffer)

    def close(self) -> None:
        """Idempotent: ends any scope, waits for in-flight callbacks, frees the adapter."""
        self._destroy()
        self._ingress._unregister(self)

    def _destroy(self) -> None:
        handle, self._handle = self._handle, None
        if self._fatal_hook:  # ggml must not call into a freed adapter
            self._fatal_hook = False
            self._lib.cdll.skippy_adapter_remove_fatal_hook()
        if handle is not None:
            self._lib.cdll.skippy_adapter_destroy(handle)

    def __enter__(self) -> EngineAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
