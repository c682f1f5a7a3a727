"""Session KV state survives a model reload: saved by the engine at unload, restored at the next
load of the same model, reused by the session's next request. In-process host and scheduler with
a session state store, a real engine on tiny.gguf.

The control run (no reload) and the reload run are separate runtimes, so both sessions' KV is
computed the same way from the same prompts: their greedy outputs must match exactly.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from skippyctl.config.load_options import LoadOptions
from skippyctl.engine.kv_state import HEADER_BYTES
from skippyctl.engine.protocol_messages import StateExported
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, SummaryKey
from skippyctl.events.reasons import Outcome, ReasonCode
from skippyctl.output.state import state_document
from skippyctl.runtime.host import RuntimeHost
from skippyctl.runtime.requests import Finished, GenerationParams, TextChunk
from skippyctl.runtime.scheduler import Scheduler
from skippyctl.runtime.session_state import SessionStateStore

WAIT_S = 60.0
PROMPT = "The quick brown fox jumps over the lazy dog and runs far away into the woods"
FIRST_TOKENS = 12
SECOND_TOKENS = 10
KEY = "conversation-key"


class Runtime:
    def __init__(self, state_dir: Path, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.host = RuntimeHost().start()
        self.store = SessionStateStore(state_dir, max_bytes)
        self.scheduler = Scheduler(self.host, session_state=self.store).start()
        self.watch = self.host.pipeline.subscribe("test", max_queue_size=100_000, replay=True)
        self.seen: list[Event] = []
        self.returned: set[int] = set()

    def next_event(self, event_ids: set[EventId], timeout_s: float = WAIT_S) -> Event:
        """The first event of ``event_ids`` not returned yet (seen already, or arriving)."""
        for event in self.seen:
            if event.id in event_ids and id(event) not in self.returned:
                self.returned.add(id(event))
                return event
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            item = self.watch.get(0.1)
            if item is None:
                continue
            self.seen.append(item.event)
            if item.event.id in event_ids:
                self.returned.add(id(item.event))
                return item.event
        raise AssertionError(f"none of {sorted(event_ids)} seen")

    def wait(self, event_id: EventId) -> Event:
        return self.next_event({event_id})

    def load(self, artifact: Path, alias: str | None = None, lanes: int = 2) -> None:
        handle = self.scheduler.load(LoadOptions(str(artifact), alias=alias, lanes=lanes))
        assert handle.problem is None
        self.wait(EventId.MODEL_AVAILABLE)

    def unload(self) -> None:
        assert self.scheduler.unload("tiny") is not None
        self.wait(EventId.UNLOAD_COMPLETED)

    def generate(self, prompt: str, max_tokens: int) -> tuple[str, LogicalId]:
        handle, rejection = self.scheduler.generate(
            "tiny",
            GenerationParams(prompt=prompt, max_tokens=max_tokens, temperature=0.0),
            session_key=KEY,
        )
        assert rejection is None and self.scheduler.enqueue(handle) is None
        text = ""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            chunk = handle.next_chunk_blocking(0.1)
            if isinstance(chunk, TextChunk):
                text += chunk.text
            elif isinstance(chunk, Finished):
                assert chunk.outcome == "completed", chunk
                self.next_event({EventId.REQUEST_COMPLETED})
                return text, handle.request_id
        raise AssertionError("the request did not finish")

    def drain(self) -> list[Event]:
        while (item := self.watch.get(0.3)) is not None:
            self.seen.append(item.event)
        return self.seen

    def of(self, request_id: LogicalId, event_id: EventId) -> Event:
        return next(e for e in self.seen if e.scope.request_id == request_id and e.id is event_id)

    def ids(self) -> list[EventId]:
        return [e.id for e in self.seen]

    def close(self) -> None:
        self.scheduler.shutdown()
        self.host.shutdown()


def value(event: Event, key: SummaryKey) -> float | int | None:
    return event.summary_value(key)


@pytest.fixture
def make_runtime(tmp_path: Path) -> Iterator[list[Runtime]]:
    made: list[Runtime] = []
    yield made
    for runtime in made:
        runtime.close()


def start(made: list[Runtime], state_dir: Path, **kwargs: int) -> Runtime:
    runtime = Runtime(state_dir, **kwargs)
    made.append(runtime)
    return runtime


def second_turn(first: str) -> str:
    return PROMPT + first + " and then the fox sleeps"


@pytest.fixture(scope="module")
def control(fixture_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The same conversation without a reload: its texts and the second turn's reuse."""
    runtime = Runtime(tmp_path_factory.mktemp("control") / "sessions")
    try:
        runtime.load(fixture_dir / "tiny.gguf")
        first, _ = runtime.generate(PROMPT, FIRST_TOKENS)
        second, request_id = runtime.generate(second_turn(first), SECOND_TOKENS)
        runtime.drain()
        started = runtime.of(request_id, EventId.PREFILL_STARTED)
        done = runtime.of(request_id, EventId.GENERATION_COMPLETED)
        return {
            "first": first,
            "second": second,
            "reused": value(done, SummaryKey.REUSED_TOKENS),
            "prefilled": value(started, SummaryKey.PROMPT_TOKENS),
        }
    finally:
        runtime.close()


def test_a_session_survives_a_reload_and_reuses_its_restored_prefix(
    fixture_dir: Path, tmp_path: Path, make_runtime: list[Runtime], control: dict[str, object]
) -> None:
    state_dir = tmp_path / "sessions"
    runtime = start(make_runtime, state_dir)
    assert stat.S_IMODE(os.stat(state_dir).st_mode) == 0o700
    runtime.load(fixture_dir / "tiny.gguf")
    first, first_id = runtime.generate(PROMPT, FIRST_TOKENS)
    assert first == control["first"]
    session = runtime.of(first_id, EventId.REQUEST_COMPLETED).scope.session_id
    assert session is not None

    runtime.unload()
    exported = runtime.wait(EventId.CACHE_STATE_EXPORT_COMPLETED)
    assert (exported.scope.session_id, exported.scope.model_id) == (session, "tiny")
    assert exported.outcome is Outcome.SUCCESS and exported.duration_ms is not None
    saved_tokens = value(exported, SummaryKey.CONTEXT_TOKENS)
    assert saved_tokens is not None and saved_tokens > FIRST_TOKENS
    saved_bytes = value(exported, SummaryKey.STATE_BYTES)
    path = Path(runtime.store.path_for(session))
    assert path.name == f"{session}.kvs" and path.stat().st_size == saved_bytes
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert runtime.store.stored_bytes() == saved_bytes

    runtime.load(fixture_dir / "tiny.gguf")
    imported = runtime.wait(EventId.CACHE_STATE_IMPORT_COMPLETED)
    restored = runtime.wait(EventId.SESSION_RESTORED)
    assert imported.scope.session_id == restored.scope.session_id == session
    assert value(imported, SummaryKey.CONTEXT_TOKENS) == saved_tokens
    assert value(restored, SummaryKey.CONTEXT_TOKENS) == saved_tokens
    assert not path.exists() and runtime.store.stored_bytes() == 0  # used up
    view = runtime.host.pipeline.state.sessions[session]
    assert (view.state.value, view.model_id, view.context_tokens) == ("idle", "tiny", saved_tokens)

    second, request_id = runtime.generate(second_turn(first), SECOND_TOKENS)
    runtime.drain()
    assert second == control["second"]
    done = runtime.of(request_id, EventId.GENERATION_COMPLETED)
    assert done.scope.session_id == session  # the same key found its restored session
    reused = value(done, SummaryKey.REUSED_TOKENS)
    assert reused == control["reused"] and reused is not None and reused > 0
    cache = {e.id for e in runtime.seen if e.scope.request_id == request_id}
    assert cache & {EventId.PROMPT_CACHE_RESTORE_PARTIAL, EventId.PROMPT_CACHE_RESTORE_HIT}
    # Prefill skipped the restored prefix: only the rest was prefilled, as without a reload.
    prefill = runtime.of(request_id, EventId.PREFILL_STARTED)
    assert value(prefill, SummaryKey.PROMPT_TOKENS) == control["prefilled"]
    for event in runtime.seen:  # no path in any event
        assert str(tmp_path) not in repr(event) and str(fixture_dir) not in repr(event)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x40  # inside the KV state
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: HEADER_BYTES + (len(data) - HEADER_BYTES) // 2])


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("flip", ReasonCode.ARTIFACT_IO_FAILURE),
        ("truncate", ReasonCode.ARTIFACT_IO_FAILURE),
        ("other-model", ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET),
        ("other-lanes", ReasonCode.INCOMPATIBLE_ABI_OR_FEATURE_SET),
    ],
)
def test_a_damaged_or_foreign_state_file_is_refused_and_the_session_prefills_again(
    fixture_dir: Path, tmp_path: Path, make_runtime: list[Runtime], damage: str, reason: ReasonCode
) -> None:
    runtime = start(make_runtime, tmp_path / "sessions")
    runtime.load(fixture_dir / "tiny.gguf")
    first, first_id = runtime.generate(PROMPT, FIRST_TOKENS)
    session = runtime.of(first_id, EventId.REQUEST_COMPLETED).scope.session_id
    assert session is not None
    runtime.unload()
    runtime.wait(EventId.CACHE_STATE_EXPORT_COMPLETED)
    path = Path(runtime.store.path_for(session))
    artifact = fixture_dir / "tiny.gguf"
    lanes = 2
    if damage == "flip":
        _flip(path)
    elif damage == "truncate":
        _truncate(path)
    elif damage == "other-lanes":
        lanes = 3  # llama.cpp keeps one KV stream per lane: another layout
    else:
        # Same alias, another file: the same weights, but not the file the state was made with.
        artifact = tmp_path / "other.gguf"
        shutil.copyfile(fixture_dir / "tiny.gguf", artifact)
        os.utime(artifact, ns=(1_000_000_000, 1_000_000_000))

    runtime.load(artifact, alias="tiny", lanes=lanes)
    failed = runtime.wait(EventId.CACHE_STATE_IMPORT_FAILED)
    assert failed.scope.session_id == session and failed.reason_code is reason
    assert failed.outcome is Outcome.FAILURE
    assert not path.exists()

    # The runtime carries on: the session prefills its whole prompt again.
    _second, request_id = runtime.generate(second_turn(first), SECOND_TOKENS)
    runtime.drain()
    assert EventId.SESSION_RESTORED not in runtime.ids()
    assert EventId.CACHE_STATE_IMPORT_COMPLETED not in runtime.ids()
    done = runtime.of(request_id, EventId.GENERATION_COMPLETED)
    assert value(done, SummaryKey.REUSED_TOKENS) == 0
    prefill = runtime.of(request_id, EventId.PREFILL_STARTED)
    assert value(prefill, SummaryKey.PROMPT_TOKENS) == value(done, SummaryKey.PROMPT_TOKENS)


def test_a_session_over_the_cap_is_not_saved(
    fixture_dir: Path, tmp_path: Path, make_runtime: list[Runtime]
) -> None:
    state_dir = tmp_path / "sessions"
    runtime = start(make_runtime, state_dir, max_bytes=4096)
    runtime.load(fixture_dir / "tiny.gguf")
    _first, first_id = runtime.generate(PROMPT, FIRST_TOKENS)
    session = runtime.of(first_id, EventId.REQUEST_COMPLETED).scope.session_id
    assert session is not None
    runtime.unload()
    failed = runtime.wait(EventId.CACHE_STATE_EXPORT_FAILED)
    assert failed.scope.session_id == session
    assert failed.reason_code is ReasonCode.RESERVATION_EXHAUSTED
    needed = value(failed, SummaryKey.STATE_BYTES)
    assert needed is not None and needed > 4096
    assert list(state_dir.iterdir()) == [] and runtime.store.stored_bytes() == 0

    runtime.load(fixture_dir / "tiny.gguf")
    _second, request_id = runtime.generate(PROMPT + " again", SECOND_TOKENS)
    runtime.drain()
    assert EventId.CACHE_STATE_EXPORT_COMPLETED not in runtime.ids()
    assert EventId.CACHE_STATE_IMPORT_COMPLETED not in runtime.ids()
    assert EventId.CACHE_STATE_IMPORT_FAILED not in runtime.ids()
    done = runtime.of(request_id, EventId.GENERATION_COMPLETED)
    assert value(done, SummaryKey.REUSED_TOKENS) == 0


def test_a_store_removes_what_a_previous_runtime_left_and_makes_its_directory_private(
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "sessions"
    state_dir.mkdir(mode=0o755)
    os.chmod(state_dir, 0o755)
    (state_dir / "s-1.kvs").write_bytes(b"old")
    (state_dir / "s-2.kvs.tmp").write_bytes(b"half")
    (state_dir / "keep.txt").write_bytes(b"not ours")
    store = SessionStateStore(state_dir, 1024)
    assert stat.S_IMODE(os.stat(state_dir).st_mode) == 0o700
    assert sorted(p.name for p in state_dir.iterdir()) == ["keep.txt"]
    assert store.stored_bytes() == 0


def test_an_unload_parks_client_keys_and_a_restore_revives_them_under_their_ids() -> None:
    from skippyctl.runtime.sessions import SessionRegistry

    model = LogicalId("tiny")
    registry = SessionRegistry(max_sessions=2)
    a, _, _ = registry.resolve(model, "key-a")
    b, _, _ = registry.resolve(model, "key-b")
    assert [e.session_id for e in registry.drop_model(model, park=True)] == ["s-1", "s-2"]
    assert len(registry) == 0
    assert registry.revive(model, a.session_id)  # restored: live again, idle
    assert not registry.revive(model, a.session_id)  # once
    assert not registry.revive(LogicalId("other"), b.session_id)  # another model's id
    entry, new, _ = registry.resolve(model, "key-a")
    assert (entry.session_id, new) == ("s-1", False)  # the client finds its session
    registry.unpark(model, b.session_id)  # its state was not saved
    entry, new, _ = registry.resolve(model, "key-b")
    assert (entry.session_id, new) == ("s-3", True)
    # Without park (a crash), nothing is kept.
    registry.drop_model(model)
    assert not registry.revive(model, LogicalId("s-3"))


def test_a_session_saved_on_request_continues_after_the_runtime_restarts_its_crashed_engine(
    fixture_dir: Path, tmp_path: Path, make_runtime: list[Runtime], control: dict[str, object]
) -> None:
    runtime = start(make_runtime, tmp_path / "sessions")
    runtime.load(fixture_dir / "tiny.gguf")
    first, first_id = runtime.generate(PROMPT, FIRST_TOKENS)
    session = runtime.of(first_id, EventId.REQUEST_COMPLETED).scope.session_id
    assert session is not None
    assert not runtime.scheduler.save_session("s-999")  # no such live session
    assert runtime.scheduler.save_session(session)
    exported = runtime.wait(EventId.CACHE_STATE_EXPORT_COMPLETED)
    assert exported.scope.session_id == session
    assert Path(runtime.store.path_for(session)).exists()

    os.kill(runtime.host.engine_pids()["tiny"], signal.SIGKILL)  # this test's own engine
    runtime.wait(EventId.MODEL_UNAVAILABLE)
    # No one loads it again: the restart policy (on-failure by default) does.
    runtime.wait(EventId.MODEL_RECOVERY_STARTED)
    assert runtime.wait(EventId.SESSION_RESTORED).scope.session_id == session
    runtime.wait(EventId.MODEL_RECOVERY_COMPLETED)

    second, request_id = runtime.generate(second_turn(first), SECOND_TOKENS)
    runtime.drain()
    assert second == control["second"]
    done = runtime.of(request_id, EventId.GENERATION_COMPLETED)
    assert done.scope.session_id == session
    assert value(done, SummaryKey.REUSED_TOKENS) == control["reused"]


def test_saving_a_session_without_kv_on_request_says_so(
    fixture_dir: Path, tmp_path: Path, make_runtime: list[Runtime]
) -> None:
    runtime = start(make_runtime, tmp_path / "sessions")
    runtime.load(fixture_dir / "tiny.gguf")
    handle, _ = runtime.scheduler.generate(
        "tiny", GenerationParams(prompt=PROMPT, max_tokens=1), session_key=KEY
    )
    session = handle.session_id
    assert session is not None
    # Known to the registry, but no KV in the engine yet (never enqueued).
    assert runtime.scheduler.save_session(session)
    failed = runtime.wait(EventId.CACHE_STATE_EXPORT_FAILED)
    assert failed.scope.session_id == session
    assert failed.reason_code is ReasonCode.INVALID_CONFIGURATION
    assert not Path(runtime.store.path_for(session)).exists()


def test_the_state_shows_what_each_session_holds_in_kv_and_what_it_reused(
    fixture_dir: Path, tmp_path: Path, make_runtime: list[Runtime], control: dict[str, object]
) -> None:
    runtime = start(make_runtime, tmp_path / "sessions")
    runtime.load(fixture_dir / "tiny.gguf")
    first, first_id = runtime.generate(PROMPT, FIRST_TOKENS)
    _, second_id = runtime.generate(second_turn(first), SECOND_TOKENS)
    runtime.drain()
    done = runtime.of(second_id, EventId.GENERATION_COMPLETED)
    session = done.scope.session_id
    assert session is not None
    idle = [e for e in runtime.seen if e.id is EventId.SESSION_IDLE]
    assert len(idle) == 2 and {e.scope.session_id for e in idle} == {session}
    # Each request's end recorded the lane's KV for the session's next request.
    recorded = [e for e in runtime.seen if e.id is EventId.CACHE_STATE_RECORDED]
    assert [value(e, SummaryKey.CONTEXT_TOKENS) for e in recorded] == [
        value(e, SummaryKey.CONTEXT_TOKENS) for e in idle
    ]
    prompt = value(done, SummaryKey.PROMPT_TOKENS)
    generated = value(done, SummaryKey.GENERATED_TOKENS)
    assert isinstance(prompt, int) and isinstance(generated, int)
    # The lane holds the prompt and what was decoded after it: every generated token but the
    # last, which was sampled and never fed back.
    assert value(idle[-1], SummaryKey.CONTEXT_TOKENS) == prompt + generated - 1
    assert value(idle[-1], SummaryKey.REUSED_TOKENS) == control["reused"]
    assert value(idle[0], SummaryKey.REUSED_TOKENS) == 0  # a new session's first request
    first_cache = runtime.of(first_id, EventId.PROMPT_CACHE_RESTORE_MISS)  # nothing to reuse
    assert first_cache.scope.session_id == session
    requested = [e for e in runtime.seen if e.id is EventId.SESSION_REQUESTED]
    assert [e.scope.session_id for e in requested] == [session]  # once, for the new key

    document = state_document(runtime.host.pipeline.state)
    (entry,) = [s for s in document["sessions"] if s["session_id"] == str(session)]
    assert entry["context_tokens"] == prompt + generated - 1
    assert entry["reused_tokens"] == control["reused"]
    # The second prompt re-tokenizes the first turn's end differently: its KV was trimmed.
    trims = [e for e in runtime.seen if e.id is EventId.SESSION_TRIMMED]
    assert entry["trimmed"] == len(trims) == 1


def test_a_store_keeps_what_the_manifest_of_an_orderly_stop_lists_and_nothing_else(
    tmp_path: Path,
) -> None:
    from skippyctl.runtime.sessions import SessionRegistry, key_digest

    state_dir = tmp_path / "sessions"
    model = LogicalId("tiny")
    first = SessionStateStore(state_dir, 1024)
    for name, size in (("s-1", 10), ("s-2", 20), ("s-3", 30)):
        (state_dir / f"{name}.kvs").write_bytes(b"x" * size)
        first.exported(model, StateExported(name, True, 5, size, 1.0))
    registry = SessionRegistry()
    for key in ("key-a", "key-b", "key-c"):
        registry.resolve(model, key)
    registry.drop_model(model, park=True)
    registry.unpark(model, LogicalId("s-3"))  # its key is gone: nothing to come back to
    assert first.persist(registry.parked()) == 2
    manifest = state_dir / "index.json"
    assert stat.S_IMODE(os.stat(manifest).st_mode) == 0o600
    assert b"key-a" not in manifest.read_bytes()  # digests, never the keys
    (state_dir / "s-2.kvs").write_bytes(b"y" * 21)  # changed size since: not taken back

    second = SessionStateStore(state_dir, 1024)
    assert [(p.session_id, p.model_id) for p in second.persisted] == [("s-1", "tiny")]
    assert second.persisted[0].key_digest == key_digest("key-a")
    assert sorted(p.name for p in state_dir.iterdir()) == ["s-1.kvs"]  # manifest used up
    assert [f.session for f in second.restore_plan(model)[0]] == ["s-1"]

    adopted = SessionRegistry()
    saved = second.persisted[0]
    assert adopted.adopt_parked(saved.model_id, saved.key_digest, saved.session_id)
    assert not adopted.adopt_parked(model, saved.key_digest, LogicalId("s-1"))  # taken
    assert adopted.revive(model, LogicalId("s-1"))  # the next load restored it
    entry, new, _ = adopted.resolve(model, "key-a")
    assert (entry.session_id, new) == ("s-1", False)
    other, _, _ = adopted.resolve(model, "key-new")
    assert other.session_id == "s-2"  # new ids are made above the adopted ones


@pytest.mark.parametrize(
    "manifest",
    [
        b"not json",
        b"[]",
        b'{"version": 2, "sessions": []}',
        b'{"version": 1, "sessions": {}}',
        b'{"version": 1, "sessions": [{"session_id": "../../etc/passwd", "model_id": "tiny",'
        b' "size_bytes": 3, "written_unix_ns": 1, "key_sha256": "' + b"a" * 64 + b'"}]}',
        b'{"version": 1, "sessions": [{"session_id": "s-1", "model_id": "a b",'
        b' "size_bytes": 3, "written_unix_ns": 1, "key_sha256": "' + b"a" * 64 + b'"}]}',
        b'{"version": 1, "sessions": [{"session_id": "s-1", "model_id": "tiny",'
        b' "size_bytes": true, "written_unix_ns": 1, "key_sha256": "' + b"a" * 64 + b'"}]}',
        b'{"version": 1, "sessions": [{"session_id": "s-1", "model_id": "tiny",'
        b' "size_bytes": 3, "written_unix_ns": 1, "key_sha256": "not-hex"}]}',
    ],
    ids=["garbage", "list", "version", "sessions", "path", "model", "size", "digest"],
)
def test_a_damaged_or_hostile_manifest_only_loses_sessions(tmp_path: Path, manifest: bytes) -> None:
    state_dir = tmp_path / "sessions"
    state_dir.mkdir(mode=0o700)
    (state_dir / "s-1.kvs").write_bytes(b"abc")
    (state_dir / "index.json").write_bytes(manifest)
    store = SessionStateStore(state_dir, 1024)
    assert store.persisted == ()
    assert list(state_dir.iterdir()) == []
    assert (tmp_path / "etc").exists() is False


def test_a_manifest_nested_past_the_parser_a_link_or_a_fifo_is_not_read(tmp_path: Path) -> None:
    state_dir = tmp_path / "sessions"
    state_dir.mkdir(mode=0o700)
    (state_dir / "index.json").write_bytes(b"[" * 100_000)
    assert SessionStateStore(state_dir, 1024).persisted == ()  # no RecursionError
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(b'{"version": 1, "sessions": []}')
    (state_dir / "index.json").symlink_to(elsewhere)
    assert SessionStateStore(state_dir, 1024).persisted == ()
    assert elsewhere.exists()  # the link was removed, not what it names
    os.mkfifo(state_dir / "index.json")
    assert SessionStateStore(state_dir, 1024).persisted == ()  # returned: no wait on the FIFO


def test_a_session_idle_past_its_ttl_is_abandoned_with_its_reason(fixture_dir: Path) -> None:
    from skippyctl.runtime.sessions import SessionRegistry

    host = RuntimeHost().start()
    scheduler = Scheduler(host, sessions=SessionRegistry(ttl_s=0.5)).start()
    watch = host.pipeline.subscribe("test", max_queue_size=100_000, replay=True)
    try:
        assert scheduler.load(LoadOptions(str(fixture_dir / "tiny.gguf"))).problem is None
        handle, rejection = scheduler.generate(
            "tiny", GenerationParams(prompt=PROMPT, max_tokens=2), session_key=KEY
        )
        assert rejection is None and scheduler.enqueue(handle) is None
        seen: list[Event] = []
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and EventId.SESSION_RESET not in [e.id for e in seen]:
            if (item := watch.get(0.1)) is not None:
                seen.append(item.event)
    finally:
        scheduler.shutdown()
        host.shutdown()
    (abandoned,) = [e for e in seen if e.id is EventId.SESSION_ABANDONED]
    assert abandoned.scope.session_id == handle.session_id
    assert abandoned.reason_code is ReasonCode.IDLE
    # The engine drops its KV for the same reason, after the lane sat idle that long.
    (reset,) = [e for e in seen if e.id is EventId.SESSION_RESET]
    assert reset.reason_code is ReasonCode.IDLE
    assert reset.duration_ms is not None and reset.duration_ms >= 400.0
