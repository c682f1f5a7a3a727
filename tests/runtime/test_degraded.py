"""The host runs degraded when no native library can be used (`SKIPPY_NATIVE_DISABLE=1` makes
that real: the library is not loaded and engines get no ring): it says so once, with
`degraded_operation_entered` (`legacy_ingress`), and the state keeps the mode."""

from __future__ import annotations

from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.events.catalog import EventId
from skippyctl.events.reasons import ReasonCode
from skippyctl.pipeline.pipeline import Pipeline
from skippyctl.reducer.state import NativeMode
from skippyctl.runtime.host import RuntimeHost


def test_a_host_without_the_native_library_enters_degraded_operation_once() -> None:
    pipeline = Pipeline(health_interval_s=0.05)
    watcher = pipeline.subscribe("watcher", max_queue_size=1 << 12)
    host = RuntimeHost(pipeline, settings=RuntimeSettings(native_disabled=True)).start()
    try:
        state = pipeline.wait_state(lambda s: bool(s.degraded_modes), 5.0)
        assert state is not None
        assert state.native_mode is NativeMode.LEGACY
        assert state.degraded_modes == frozenset({"legacy_ingress"})
        ids = []
        while (item := watcher.get(0.5)) is not None:
            ids.append(item.event)
        entered = [e for e in ids if e.id is EventId.DEGRADED_OPERATION_ENTERED]
        assert len(entered) == 1
        assert entered[0].reason_code is ReasonCode.UNSUPPORTED_CAPABILITY
        assert entered[0].state is not None and entered[0].state.previous == "normal"
    finally:
        host.shutdown()


def test_a_host_with_the_native_library_is_not_degraded() -> None:
    pipeline = Pipeline(health_interval_s=0.05)
    host = RuntimeHost(pipeline).start()
    try:
        state = pipeline.wait_state(lambda s: s.native_mode is NativeMode.NATIVE, 5.0)
        assert state is not None and not state.degraded_modes
    finally:
        host.shutdown()
