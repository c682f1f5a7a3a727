"""Split loads over real ggml RPC stages on loopback: an in-process host and scheduler, a real
engine on tiny.gguf, real stage workers (`stage serve` processes, or the host's local stages).

The only processes signalled here are the stage workers and `stage serve` processes these tests
started; every one is reaped (the helpers' cleanup, the host's shutdown). Nothing asserts a
duration: the bounds below only keep a broken run from hanging.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from skippyctl.config.load_options import LoadOptions
from skippyctl.engine.options import EngineOptions
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, SummaryKey
from skippyctl.events.reasons import Category, ReasonCode
from skippyctl.output.state import state_document
from skippyctl.runtime.host import RuntimeHost
from skippyctl.runtime.requests import Finished, GenerationParams, TextChunk
from skippyctl.runtime.scheduler import Scheduler
from skippyctl.runtime.topology import Topology
from skippyctl.stages.probe import StageIncompatible, StageUnreachable, probe
from tests.stages.helpers import (
    StageProcess,
    alive,
    children_of,
    free_port,
    kill_quietly,
    loopback_server,
    relay_to,
    stage_process,
    wait_gone,
)

CLIENT_EVENTS = frozenset(
    {
        EventId.UPSTREAM_CONNECTION_ESTABLISHED,
        EventId.UPSTREAM_CONNECTION_LOST,
        EventId.UPSTREAM_CONNECTION_RECOVERED,
    }
)
"""A stage's view of its client: they come when a connection settled, whenever that is."""
WAIT_S = 120.0
GREEDY = {"prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0.0}
LOAD_TERMINALS = {EventId.MODEL_AVAILABLE, EventId.MODEL_LOAD_FAILED, EventId.MODEL_LOAD_CANCELLED}


class Runtime:
    def __init__(self, options: EngineOptions | None = None) -> None:
        self.host = RuntimeHost(options=options).start()
        self.scheduler = Scheduler(self.host).start()
        self.watch = self.host.pipeline.subscribe("test", max_queue_size=100_000, replay=True)
        self.seen: list[Event] = []

    def next_event(self, until: set[EventId], timeout_s: float = WAIT_S) -> Event:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            item = self.watch.get(0.1)
            if item is None:
                continue
            self.seen.append(item.event)
            if item.event.id in until:
                return item.event
        raise AssertionError(f"none of {sorted(until)} seen")

    def load(self, model: Path, **fields: object) -> tuple[Event, str | None]:
        handle = self.scheduler.load(LoadOptions(str(model), **fields))  # type: ignore[arg-type]  # test kwargs
        terminal = self.next_event(LOAD_TERMINALS)
        return terminal, handle.problem

    def generate(self, model_id: str, **params: object) -> tuple[str, Finished]:
        handle, rejection = self.scheduler.generate(model_id, GenerationParams(**params))  # type: ignore[arg-type]  # test kwargs
        assert rejection is None
        assert self.scheduler.enqueue(handle) is None
        text = []
        while True:
            chunk = handle.next_chunk_blocking(WAIT_S)
            assert chunk is not None, "no terminal"
            if isinstance(chunk, TextChunk):
                text.append(chunk.text)
            elif isinstance(chunk, Finished):
                return "".join(text), chunk

    def drain(self) -> list[Event]:
        """Everything seen so far, once 0.3 s passed without a transition (the engine's link
        figures keep coming — every 50 ms here — so quiet alone would never come)."""
        quiet_until = time.monotonic() + 0.3
        while (left := quiet_until - time.monotonic()) > 0:
            item = self.watch.get(left)
            if item is None:
                break
            self.seen.append(item.event)
            if item.event.id is not EventId.STAGE_LINK_OBSERVED:
                quiet_until = time.monotonic() + 0.3
        return self.seen

    def ids(self, category: Category | None = None, figures: bool = False) -> list[EventId]:
        """The ids seen, in order; the engine's link figures (``stage_link_observed``, one per
        probe) only with ``figures``."""
        return [
            e.id
            for e in self.drain()
            if (category is None or e.category is category)
            and (figures or e.id is not EventId.STAGE_LINK_OBSERVED)
        ]

    def close(self) -> None:
        self.scheduler.shutdown()
        self.host.shutdown()


def _stage_workers() -> list[int]:
    out = []
    for pid in children_of(os.getpid()):
        with contextlib.suppress(OSError):
            if b"skippyctl.stages.stage_worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
    return out


FAST_LINK_PROBES = EngineOptions(link_probe_interval_ms=50.0)


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    before = set(_stage_workers())
    rt = Runtime(FAST_LINK_PROBES)
    try:
        yield rt
    finally:
        rt.close()
        left = [pid for pid in _stage_workers() if pid not in before]
        for pid in left:
            kill_quietly(pid)
        assert not left, "a local stage worker outlived the host"


def _serve() -> StageProcess:
    return StageProcess("--port", "0", "--threads", "1", "--json")


def _endpoint(stage: StageProcess) -> str:
    ready = stage.until("stage_ready")[-1]
    return f"127.0.0.1:{ready['summaries']['port']}"


@pytest.fixture(scope="module")
def reference(fixture_dir: Path) -> str:
    """Greedy text of tiny.gguf loaded in one engine process (no stages)."""
    rt = Runtime()
    try:
        terminal, _ = rt.load(fixture_dir / "tiny.gguf", lanes=1)
        assert terminal.id is EventId.MODEL_AVAILABLE
        text, finished = rt.generate("tiny", **GREEDY)
        assert finished.outcome == "completed" and text
        return text
    finally:
        rt.close()


def test_local_stages_split_the_model_and_give_the_same_greedy_text(
    runtime: Runtime, fixture_dir: Path, reference: str
) -> None:
    terminal, problem = runtime.load(fixture_dir / "tiny.gguf", lanes=1, local_stages=2)
    assert terminal.id is EventId.MODEL_AVAILABLE, (problem, runtime.ids())
    text, finished = runtime.generate("tiny", **GREEDY)
    assert finished.outcome == "completed"
    assert text == reference
    # Each local stage reports its client, the engine, once it stayed connected.
    upstream = {runtime.next_event({EventId.UPSTREAM_CONNECTION_ESTABLISHED}).scope.stage_id}
    upstream.add(runtime.next_event({EventId.UPSTREAM_CONNECTION_ESTABLISHED}).scope.stage_id)
    topology = [
        e
        for e in runtime.drain()
        if e.category is Category.STAGE_TOPOLOGY
        and e.id not in CLIENT_EVENTS
        and e.id is not EventId.STAGE_LINK_OBSERVED
    ]
    ids = [e.id for e in topology]
    assert ids.count(EventId.STAGE_STARTING) == 2 and ids.count(EventId.STAGE_LOADING) == 2
    assert ids.count(EventId.STAGE_READY) == 4  # each worker's own, then the split load's
    assert ids.index(EventId.TOPOLOGY_ASSEMBLING) < ids.index(EventId.STAGE_LOADING)
    assert ids[-1] is EventId.TOPOLOGY_READY
    assembling = next(e for e in topology if e.id is EventId.TOPOLOGY_ASSEMBLING)
    assert assembling.summary_value(SummaryKey.STAGES) == 2
    assert assembling.summary_value(SummaryKey.LAYERS) == 2
    loading = [e for e in topology if e.id is EventId.STAGE_LOADING]
    assert [e.summary_value(SummaryKey.LAYER_START) for e in loading] == [0, 1]
    assert [e.summary_value(SummaryKey.LAYER_COUNT) for e in loading] == [1, 1]
    assert [e.scope.stage_index for e in loading] == [0, 1]
    topology_id = assembling.scope.topology_id
    assert topology_id is not None and all(e.scope.topology_id == topology_id for e in topology)
    assert len({e.scope.stage_id for e in loading}) == 2
    assert upstream == {e.scope.stage_id for e in loading}
    state = runtime.host.pipeline.state
    assert state.topologies[topology_id].state.value == "ready"
    assert state.models[LogicalId("tiny")].topology_id == topology_id
    for event in topology:  # privacy: opaque ids only, no address
        assert "127.0.0.1" not in repr(event) and "/" not in repr(event)

    # The unload stops the stages the model owned.
    workers = _stage_workers()
    assert len(workers) == 2
    runtime.scheduler.unload("tiny")
    runtime.next_event({EventId.UNLOAD_COMPLETED})
    assert all(wait_gone(pid) for pid in workers)
    after = [e for e in runtime.ids(Category.STAGE_TOPOLOGY) if e not in CLIENT_EVENTS]
    assert after.count(EventId.STAGE_STOPPING) == 2 and after.count(EventId.STAGE_STOPPED) == 2
    assert after[-1] is EventId.TOPOLOGY_UNAVAILABLE


def test_stage_serve_workers_split_the_model_and_give_the_same_greedy_text(
    runtime: Runtime, fixture_dir: Path, reference: str
) -> None:
    serve = ("--port", "0", "--threads", "1", "--json")
    with stage_process(*serve) as one, stage_process(*serve) as two:
        stages = (_endpoint(one), _endpoint(two))
        terminal, problem = runtime.load(fixture_dir / "tiny.gguf", lanes=1, stages=stages)
        assert terminal.id is EventId.MODEL_AVAILABLE, (problem, runtime.ids())
        text, finished = runtime.generate("tiny", **GREEDY)
        assert finished.outcome == "completed"
        assert text == reference
        ids = runtime.ids(Category.STAGE_TOPOLOGY)
        assert ids.count(EventId.STAGE_READY) == 2
        assert ids[-1] is EventId.TOPOLOGY_READY


def test_an_unreachable_stage_fails_the_load_with_stage_unavailable(
    runtime: Runtime, fixture_dir: Path
) -> None:
    port = free_port()  # nothing listens there
    terminal, problem = runtime.load(fixture_dir / "tiny.gguf", stages=(f"127.0.0.1:{port}",))
    assert terminal.id is EventId.MODEL_LOAD_FAILED
    assert terminal.reason_code is ReasonCode.STAGE_UNAVAILABLE
    assert problem is not None and "stage 1" in problem
    ids = runtime.ids()
    assert EventId.STAGE_UNAVAILABLE in ids and EventId.TOPOLOGY_UNAVAILABLE in ids
    assert EventId.ENGINE_PROCESS_STARTED not in ids  # no engine was started
    assert runtime.host.engine_pids() == {}
    # The host is alive and still loads a model.
    terminal, _ = runtime.load(fixture_dir / "tiny.gguf", lanes=1)
    assert terminal.id is EventId.MODEL_AVAILABLE


def _hello_answer(major: int) -> Callable[[socket.socket], None]:
    """A connection handler of this test's own answering ggml's HELLO with `major`.0.0."""

    def serve(conn: socket.socket) -> None:
        conn.settimeout(5)
        request = b""
        while len(request) < 1 + 8 + 24:
            chunk = conn.recv(64)
            if not chunk:
                break
            request += chunk
        if request[:1] == bytes([14]):
            conn.sendall(struct.pack("<Q", 28) + bytes([major, 0, 0, 0]) + bytes(24))

    return serve


def test_a_stage_speaking_another_rpc_major_version_is_incompatible(
    runtime: Runtime, fixture_dir: Path
) -> None:
    with loopback_server(_hello_answer(major=6)) as server:
        port = server.port
        with pytest.raises(StageIncompatible):
            probe("127.0.0.1", port, 5.0)
        terminal, problem = runtime.load(fixture_dir / "tiny.gguf", stages=(f"127.0.0.1:{port}",))
    assert terminal.id is EventId.MODEL_LOAD_FAILED
    assert terminal.reason_code is ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET
    assert problem is not None and "6.0.0" in problem
    unavailable = [e for e in runtime.drain() if e.id is EventId.STAGE_UNAVAILABLE]
    assert [e.reason_code for e in unavailable] == [ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET]


def test_the_probe_reads_a_real_stage_and_closes_so_the_next_client_is_served() -> None:
    with stage_process("--port", "0", "--threads", "1", "--json", "--mem", "64") as stage:
        host, port = _endpoint(stage).split(":")
        first = probe(host, int(port), 10.0)
        second = probe(host, int(port), 10.0)  # served: the first connection was closed
        assert first.version == (7, 0, 0) and second.version == (7, 0, 0)
        assert first.total_bytes > 0 and first.free_bytes > 0
    with pytest.raises(StageUnreachable):
        probe(host, int(port), 1.0)


def test_a_plan_that_cannot_fit_is_refused_before_loading(
    runtime: Runtime, fixture_dir: Path
) -> None:
    terminal, problem = runtime.load(
        fixture_dir / "tiny.gguf", local_stages=2, local_stage_mem_mib=1
    )
    assert terminal.id is EventId.MODEL_LOAD_FAILED
    assert terminal.reason_code is ReasonCode.RESOURCE_ALLOCATION_FAILURE
    assert problem is not None and "does not fit" in problem
    ids = runtime.ids()
    assert EventId.TOPOLOGY_ASSEMBLING in ids and EventId.TOPOLOGY_UNAVAILABLE in ids
    assert EventId.STAGE_LOADING not in ids and EventId.ENGINE_PROCESS_STARTED not in ids
    # The stages it started for the load are stopped again.
    assert ids.count(EventId.STAGE_STOPPED) == 2
    assert _stage_workers() == [] or all(wait_gone(p) for p in _stage_workers())


def test_a_local_stage_that_cannot_start_fails_the_load(
    runtime: Runtime, fixture_dir: Path
) -> None:
    # More memory than any device has: the stage worker refuses to start (stage_failed).
    terminal, problem = runtime.load(
        fixture_dir / "tiny.gguf", local_stages=1, local_stage_mem_mib=2**31 - 1
    )
    assert terminal.id is EventId.MODEL_LOAD_FAILED
    assert terminal.reason_code is ReasonCode.INVALID_CONFIGURATION
    assert problem is not None and "local stage" in problem
    ids = runtime.ids()
    assert EventId.STAGE_FAILED in ids and EventId.TOPOLOGY_UNAVAILABLE in ids


def test_a_stage_killed_mid_generation_is_reported_and_the_load_works_again(
    runtime: Runtime, fixture_dir: Path
) -> None:
    # Keep the request in flight: engines told what SKIPPY_TEST_DECODE_DELAY_MS=20 tells them.
    runtime.host.options = EngineOptions(link_probe_interval_ms=50.0, test_decode_delay_ms=20)
    with stage_process("--port", "0", "--threads", "1", "--json") as one:
        stage_two = _serve()
        try:
            first, second = _endpoint(one), _endpoint(stage_two)
            stages = (first, second)
            terminal, problem = runtime.load(
                fixture_dir / "tiny.gguf", lanes=1, ctx=512, stages=stages
            )
            assert terminal.id is EventId.MODEL_AVAILABLE, problem
            engine = runtime.host.engine_pids()["tiny"]
            handle, rejection = runtime.scheduler.generate(
                "tiny", GenerationParams(prompt="Once", max_tokens=400, temperature=0.0)
            )
            assert rejection is None and runtime.scheduler.enqueue(handle) is None
            chunk = handle.next_chunk_blocking(WAIT_S)
            assert isinstance(chunk, TextChunk)  # generating
            [worker] = stage_two.worker_pids
            os.kill(worker, signal.SIGKILL)
            while not isinstance(chunk, Finished):
                chunk = handle.next_chunk_blocking(WAIT_S)
                assert chunk is not None
            assert chunk.outcome == "failed"
            assert chunk.reason is ReasonCode.STAGE_UNAVAILABLE
            assert wait_gone(engine)
            crashed = runtime.next_event({EventId.ENGINE_PROCESS_CRASHED})
            assert crashed.reason_code is ReasonCode.STAGE_UNAVAILABLE
            events = runtime.drain()
            lost = [e for e in events if e.id is EventId.STAGE_UNAVAILABLE]
            assert len(lost) == 1 and lost[0].scope.stage_index == 1
            gone = [e for e in events if e.id is EventId.DOWNSTREAM_CONNECTION_LOST]
            assert [e.scope.stage_index for e in gone] == [1]
            assert events.index(gone[0]) < events.index(lost[0])
            down = [e for e in events if e.id is EventId.TOPOLOGY_UNAVAILABLE]
            assert [e.reason_code for e in down] == [ReasonCode.STAGE_UNAVAILABLE]
            failed = [e for e in events if e.id is EventId.REQUEST_FAILED]
            assert [e.reason_code for e in failed] == [ReasonCode.STAGE_UNAVAILABLE]
            model = runtime.host.pipeline.state.models[LogicalId("tiny")]
            assert model.state.value == "unavailable"
            stage_two.cleanup()

            # The stage is back on the same port: the same load works again.
            before_reload = len(runtime.drain())
            port = second.rsplit(":", 1)[1]
            stage_two = StageProcess("--port", port, "--threads", "1", "--json")
            assert _endpoint(stage_two) == second
            runtime.host.options = FAST_LINK_PROBES
            terminal, problem = runtime.load(
                fixture_dir / "tiny.gguf", lanes=1, ctx=512, stages=stages
            )
            assert terminal.id is EventId.MODEL_AVAILABLE, problem
            _, finished = runtime.generate("tiny", **GREEDY)
            assert finished.outcome == "completed"
            after = runtime.drain()[before_reload:]
            links = [
                (e.id, e.scope.stage_index)
                for e in after
                if e.id
                in (
                    EventId.DOWNSTREAM_CONNECTION_ESTABLISHED,
                    EventId.DOWNSTREAM_CONNECTION_RECOVERED,
                )
            ]
            assert links == [  # the lost stage's link is back; the other one is a new engine's
                (EventId.DOWNSTREAM_CONNECTION_ESTABLISHED, 0),
                (EventId.DOWNSTREAM_CONNECTION_RECOVERED, 1),
            ]
        finally:
            stage_two.cleanup()
    assert alive(os.getpid())


def test_replan_leaves_an_unreachable_stage_out_and_serves_on_the_stage_that_remains(
    runtime: Runtime, fixture_dir: Path, reference: str
) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    with stage_process("--port", "0", "--threads", "1", "--json") as one:
        stages = (dead, _endpoint(one))
        terminal, problem = runtime.load(
            fixture_dir / "tiny.gguf", lanes=1, stages=stages, replan=True
        )
        assert terminal.id is EventId.MODEL_AVAILABLE, (problem, runtime.ids())
        text, finished = runtime.generate("tiny", **GREEDY)
        assert finished.outcome == "completed" and text == reference
        topology = [
            e
            for e in runtime.drain()
            if e.category is Category.STAGE_TOPOLOGY and e.id is not EventId.STAGE_LINK_OBSERVED
        ]
        lost = [e for e in topology if e.id is EventId.STAGE_UNAVAILABLE]
        assert [(e.scope.stage_index, e.reason_code) for e in lost] == [
            (0, ReasonCode.STAGE_UNAVAILABLE)
        ]
        assembling = next(e for e in topology if e.id is EventId.TOPOLOGY_ASSEMBLING)
        assert assembling.summary_value(SummaryKey.STAGES) == 1  # the plan that remains
        loading = [e for e in topology if e.id is EventId.STAGE_LOADING]
        assert [e.scope.stage_index for e in loading] == [1]  # its place in the list
        assert loading[0].scope.stage_id != lost[0].scope.stage_id
        assert [e.summary_value(SummaryKey.LAYER_COUNT) for e in loading] == [2]
        assert [e.id for e in topology][-1] is EventId.TOPOLOGY_READY
        assert EventId.TOPOLOGY_UNAVAILABLE not in [e.id for e in topology]
        state = runtime.host.pipeline.state
        assert state.stages[lost[0].scope.stage_id].state.value == "unavailable"  # type: ignore[index]  # checked above
        assert state.stages[loading[0].scope.stage_id].layer_count == 2  # type: ignore[index]  # checked above


def test_replan_with_no_stage_left_fails_as_without_it(runtime: Runtime, fixture_dir: Path) -> None:
    dead = (f"127.0.0.1:{free_port()}",)
    terminal, problem = runtime.load(fixture_dir / "tiny.gguf", stages=dead, replan=True)
    assert terminal.id is EventId.MODEL_LOAD_FAILED
    assert terminal.reason_code is ReasonCode.STAGE_UNAVAILABLE
    assert problem is not None and "stage 1" in problem
    ids = runtime.ids()
    assert EventId.STAGE_UNAVAILABLE in ids and EventId.TOPOLOGY_UNAVAILABLE in ids
    assert runtime.host.engine_pids() == {}


SERVE = ("--port", "0", "--threads", "1", "--json")
SLOW_WIRE: dict[str, Any] = {"delay_ms": 30.0, "jitter_ms": 10.0, "seed": 9}


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def test_a_split_load_through_jittery_relays_gives_the_same_greedy_text(
    runtime: Runtime, fixture_dir: Path, reference: str
) -> None:
    serve = ("--port", "0", "--threads", "1", "--json")
    with stage_process(*serve) as one, stage_process(*serve) as two:
        wire = {"delay_ms": 2.0, "jitter_ms": 2.0, "stall_ms": 20.0, "stall_p": 0.02, "seed": 5}
        with (
            relay_to(_port(_endpoint(one)), **wire) as (first, _),
            relay_to(_port(_endpoint(two)), **wire) as (second, records),
        ):
            stages = (f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}")
            terminal, problem = runtime.load(fixture_dir / "tiny.gguf", lanes=1, stages=stages)
            assert terminal.id is EventId.MODEL_AVAILABLE, (problem, runtime.ids())
            text, finished = runtime.generate("tiny", **GREEDY)
            assert finished.outcome == "completed"
            assert text == reference
            # The host's probe and the engine's connection both went through the relay.
            assert sum(r["state"] == "connection_opened" for r in records) >= 2
            runtime.scheduler.unload("tiny")
            runtime.next_event({EventId.UNLOAD_COMPLETED})


def _link_events(runtime: Runtime, event_id: EventId) -> list[Event]:
    return [e for e in runtime.drain() if e.id is event_id]


def _wait_for_probes(runtime: Runtime, stage: int, samples: int) -> None:
    """Until the engine's probes of `stage` filled `samples` of its window (the decode thread
    probes on while idle)."""
    engine = runtime.host._engines[LogicalId("tiny")]
    assert isinstance(engine.topology, Topology)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        link = engine.topology.links()[stage]
        if link is not None and link.samples >= samples:
            return
        time.sleep(0.05)
    raise AssertionError("the engine did not probe the link")


def _link_rows(runtime: Runtime) -> dict[int, dict[str, Any]]:
    """The state document's rows of the served topology's stages, by stage index."""
    engine = runtime.host._engines[LogicalId("tiny")]
    assert isinstance(engine.topology, Topology)
    topology_id = str(engine.topology.topology_id)
    document = state_document(runtime.host.pipeline.state)
    return {
        row["stage_index"]: row
        for row in document["stages"]
        if row.get("topology_id") == topology_id
    }


def test_link_figures_reach_the_state_and_a_low_threshold_degrades_only_the_relayed_stage(
    runtime: Runtime, fixture_dir: Path
) -> None:
    with (
        stage_process(*SERVE) as one,
        stage_process(*SERVE) as two,
        relay_to(_port(_endpoint(two)), **SLOW_WIRE) as (slow, _),
    ):
        stages = (_endpoint(one), f"127.0.0.1:{slow.port}")
        # Every relayed round trip crosses the relay twice: its p95 is above 60 ms.
        terminal, problem = runtime.load(
            fixture_dir / "tiny.gguf", lanes=1, stages=stages, stage_link_p95_ms=45.0
        )
        assert terminal.id is EventId.MODEL_AVAILABLE, (problem, runtime.ids())
        seen = [e for e in runtime.seen if e.id is EventId.STAGE_DEGRADED]
        degraded = seen[0] if seen else runtime.next_event({EventId.STAGE_DEGRADED})
        assert degraded.scope.stage_index == 1
        assert degraded.reason_code is ReasonCode.TIMEOUT
        p95 = degraded.summary_value(SummaryKey.LINK_P95_MS)
        assert p95 is not None and p95 >= 60.0
        assert degraded.summary_value(SummaryKey.LINK_RTT_MS) is not None
        assert degraded.summary_value(SummaryKey.LINK_JITTER_MS) is not None
        assert degraded.summary_value(SummaryKey.LINK_P95_THRESHOLD_MS) == 45.0
        _wait_for_probes(runtime, 1, samples=6)
        events = runtime.drain()
        established = [e for e in events if e.id is EventId.DOWNSTREAM_CONNECTION_ESTABLISHED]
        assert sorted(e.scope.stage_index or 0 for e in established) == [0, 1]
        assert [e.scope.stage_index for e in events if e.id is EventId.STAGE_DEGRADED] == [1]
        # The first slow stage degrades the topology, and with it the model, which still serves.
        degraded_topology = [e for e in events if e.id is EventId.TOPOLOGY_DEGRADED]
        assert [(e.reason_code, e.scope.topology_id) for e in degraded_topology] == [
            (ReasonCode.TIMEOUT, degraded.scope.topology_id)
        ]
        for event in events:  # privacy: no address in any event
            assert "127.0.0.1" not in repr(event)

        state = runtime.host.pipeline.state
        rows = _link_rows(runtime)
        assert set(rows) == {0, 1}
        assert rows[0]["link_rtt_ms"] < rows[1]["link_rtt_ms"]
        assert rows[0]["link_p95_ms"] < rows[1]["link_p95_ms"]
        assert "link_jitter_ms" in rows[0] and "link_jitter_ms" in rows[1]
        assert rows[1]["state"] == "degraded" and rows[0]["state"] == "ready"
        assert rows[0]["downstream_connected"] is True
        model = state.models[LogicalId("tiny")]
        assert model.state.value == "degraded"  # serving, over a slow link
        assert EventId.MODEL_DEGRADED in [e.id for e in runtime.drain()]
        _, finished = runtime.generate("tiny", **GREEDY)
        assert finished.outcome == "completed"
        runtime.scheduler.unload("tiny")
        runtime.next_event({EventId.UNLOAD_COMPLETED})


def test_a_high_link_threshold_leaves_a_relayed_stage_ready(
    runtime: Runtime, fixture_dir: Path
) -> None:
    with (
        stage_process(*SERVE) as one,
        stage_process(*SERVE) as two,
        relay_to(_port(_endpoint(two)), **SLOW_WIRE) as (slow, _),
    ):
        stages = (_endpoint(one), f"127.0.0.1:{slow.port}")
        terminal, problem = runtime.load(
            fixture_dir / "tiny.gguf", lanes=1, stages=stages, stage_link_p95_ms=60_000.0
        )
        assert terminal.id is EventId.MODEL_AVAILABLE, (problem, runtime.ids())
        _wait_for_probes(runtime, 1, samples=6)
        ids = runtime.ids(Category.STAGE_TOPOLOGY)
        assert EventId.STAGE_DEGRADED not in ids and EventId.TOPOLOGY_DEGRADED not in ids
        assert EventId.STAGE_LINK_OBSERVED in runtime.ids(Category.STAGE_TOPOLOGY, figures=True)
        # The state's figures are live: they follow each probe, not only link transitions.
        before = _link_rows(runtime)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            now = _link_rows(runtime)
            if all(
                (now.get(i, {}).get("link_probes") or 0)
                >= (before.get(i, {}).get("link_probes") or 0) + 2
                for i in (0, 1)
            ):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the state's link figures stood still: {before} -> {now}")
        assert now[1]["link_rtt_ms"] > now[0]["link_rtt_ms"]  # the relayed link is slower
        assert ids.count(EventId.DOWNSTREAM_CONNECTION_ESTABLISHED) == 2
        assert runtime.host.pipeline.state.models[LogicalId("tiny")].state.value == "available"
        runtime.scheduler.unload("tiny")
        runtime.next_event({EventId.UNLOAD_COMPLETED})
