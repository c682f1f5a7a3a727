"""The host settles every load and leaves no engine behind a load that failed or was cancelled.

Real engines on the generated fixtures; engine processes are counted as children of this (the
host's) process through /proc.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skippyctl.config.load_options import LoadOptions
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId
from skippyctl.events.reasons import ReasonCode
from skippyctl.pipeline.dispatch import Subscription
from skippyctl.reducer.state import SETTLED_MODEL_STATES
from skippyctl.runtime import host as host_module
from skippyctl.runtime.host import RuntimeHost

TERMINALS = {EventId.MODEL_AVAILABLE, EventId.MODEL_LOAD_FAILED, EventId.MODEL_LOAD_CANCELLED}
SETTLE_S = 30.0


def children(pid: int) -> set[int]:
    """Child processes of `pid` (zombies included: a child that was not reaped still counts)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.update(int(c) for c in (task / "children").read_text().split())
        except FileNotFoundError:  # the thread ended while we listed
            continue
    return found


def engine_children(pid: int) -> set[int]:
    engines = set()
    for child in children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"skippyctl.engine.engine_worker" in cmdline or not cmdline:  # empty: a zombie
            engines.add(child)
    return engines


def wait_for(predicate: Any, timeout_s: float = SETTLE_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


@pytest.fixture
def host() -> Iterator[RuntimeHost]:
    runtime = RuntimeHost().start()
    yield runtime
    runtime.shutdown()


def _until(subscription: Subscription, operation: LogicalId, ids: set[EventId]) -> list[Event]:
    seen: list[Event] = []
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        item = subscription.get(0.1)
        if item is None:
            continue
        seen.append(item.event)
        if item.event.operation_id == operation and item.event.id in ids:
            return seen
    raise AssertionError(f"{ids} not seen: {[e.id.value for e in seen]}")


def _terminals(events: list[Event], operation: LogicalId) -> list[Event]:
    return [e for e in events if e.operation_id == operation and e.id in TERMINALS]


def test_a_path_with_a_nul_byte_fails_the_load_and_frees_the_model_id(
    host: RuntimeHost, fixture_dir: Path
) -> None:
    watch = host.pipeline.subscribe("test", max_queue_size=10_000, replay=True)
    handle = host.load_model(LoadOptions(str(fixture_dir / "ti\x00ny.gguf"), alias="nul"))
    assert handle.problem is not None and "\x00" not in handle.problem
    events = _until(watch, handle.operation_id, TERMINALS)
    (failed,) = _terminals(events, handle.operation_id)
    assert failed.id is EventId.MODEL_LOAD_FAILED
    assert failed.reason_code is ReasonCode.INVALID_CONFIGURATION
    view = host.pipeline.state.models.get(LogicalId("nul"))
    assert view is None or view.state in SETTLED_MODEL_STATES  # never stuck in `requested`
    retry = host.load_model(LoadOptions(str(fixture_dir / "tiny.gguf"), alias="nul"))
    assert _until(watch, retry.operation_id, TERMINALS)[-1].id is EventId.MODEL_AVAILABLE


def test_any_exception_after_the_load_was_requested_ends_in_model_load_failed(
    host: RuntimeHost, fixture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mocked: a failing fork/exec (no memory, no pids left) cannot be produced for real here.
    def cannot_spawn(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError(11, "Resource temporarily unavailable")

    watch = host.pipeline.subscribe("test", max_queue_size=10_000, replay=True)
    monkeypatch.setattr(host_module, "EngineProcess", cannot_spawn)
    handle = host.load_model(LoadOptions(str(fixture_dir / "tiny.gguf"), alias="nospawn"))
    assert handle.problem is not None
    (failed,) = _terminals(_until(watch, handle.operation_id, TERMINALS), handle.operation_id)
    assert failed.id is EventId.MODEL_LOAD_FAILED
    assert failed.reason_code is ReasonCode.INTERNAL_RUNTIME_FAILURE
    monkeypatch.undo()
    retry = host.load_model(LoadOptions(str(fixture_dir / "tiny.gguf"), alias="nospawn"))
    assert _until(watch, retry.operation_id, TERMINALS)[-1].id is EventId.MODEL_AVAILABLE


def test_failed_loads_leave_no_engine_process_behind(host: RuntimeHost, fixture_dir: Path) -> None:
    watch = host.pipeline.subscribe("test", max_queue_size=10_000, replay=True)
    before = engine_children(os.getpid())
    for alias in ("broken-1", "broken-2", "broken-3"):
        # truncated.gguf passes the host's header pre-check; llama.cpp returns NULL for it.
        handle = host.load_model(LoadOptions(str(fixture_dir / "truncated.gguf"), alias=alias))
        assert handle.problem is None
        (failed,) = _terminals(_until(watch, handle.operation_id, TERMINALS), handle.operation_id)
        assert failed.id is EventId.MODEL_LOAD_FAILED
        assert failed.reason_code is ReasonCode.MODEL_FORMAT_OR_LOAD_FAILURE
    assert wait_for(lambda: engine_children(os.getpid()) <= before), engine_children(os.getpid())
    assert host.engine_pids() == {}


def test_a_cancelled_load_leaves_no_engine_process_behind(
    host: RuntimeHost, fixture_dir: Path
) -> None:
    # A load that takes seconds (what SKIPPY_TEST_PROGRESS_DELAY_US=200000 tells engines).
    host.options = dataclasses.replace(host.options, test_progress_delay_us=200_000)
    watch = host.pipeline.subscribe("test", max_queue_size=10_000, replay=True)
    before = engine_children(os.getpid())
    handle = host.load_model(LoadOptions(str(fixture_dir / "tiny.gguf"), alias="cancelled"))
    _until(watch, handle.operation_id, {EventId.MODEL_LOAD_PROGRESS})
    assert len(engine_children(os.getpid()) - before) == 1
    host.cancel(handle.operation_id)
    (cancelled,) = _terminals(_until(watch, handle.operation_id, TERMINALS), handle.operation_id)
    assert cancelled.id is EventId.MODEL_LOAD_CANCELLED
    assert wait_for(lambda: engine_children(os.getpid()) <= before), engine_children(os.getpid())
    assert host.engine_pids() == {}


def test_a_load_that_serves_keeps_its_engine(host: RuntimeHost, fixture_dir: Path) -> None:
    """The other side of retiring: only loads that end without serving lose their engine."""
    watch = host.pipeline.subscribe("test", max_queue_size=10_000, replay=True)
    handle = host.load_model(LoadOptions(str(fixture_dir / "tiny.gguf"), alias="serves"))
    assert _until(watch, handle.operation_id, TERMINALS)[-1].id is EventId.MODEL_AVAILABLE
    pid = host.engine_pids()["serves"]
    assert pid in engine_children(os.getpid())
    engine = host.engine_for(LogicalId("serves"))
    assert engine is not None and engine.serving
