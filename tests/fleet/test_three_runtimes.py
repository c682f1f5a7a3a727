"""Three real runtimes on loopback (distinct ports and runtime directories) as one fleet:
`ps --fleet`, `--node` steering, and the merged `events --follow --fleet --json` stream across a
forced disconnect and a node that dies and comes back.

The local member is runtime `a` (SKIPPY_RUNTIME_DIR), `b` is reached with a key file, `c` with
a key in an environment variable and through a loopback TCP proxy the test controls: cutting
the proxy's connections is a disconnect the runtime did not choose (a network fault cannot be
produced otherwise on one machine), and pointing it at a new runtime is a node that came back
at the same address.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from skippyctl.config.fleet import Fleet, FleetEntry, write_fleet
from tests.api.conftest import Server, start_server, stop_server, wait_for
from tests.cli.helpers import ndjson_objects, run_cli

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


class TcpProxy:
    """Forwards loopback connections to `target`; `cut()` closes every open one."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                self._drop(end)

    def _drop(self, end: socket.socket) -> None:
        with self._lock:
            self._open.discard(end)
        with contextlib.suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)
        end.close()

    def cut(self) -> int:
        with self._lock:
            ends = list(self._open)
        for end in ends:
            self._drop(end)
        return len(ends)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()


@dataclass
class Trio:
    servers: dict[str, Server]
    proxy: TcpProxy
    env: dict[str, str]
    root: Path
    restarts: list[Server] = field(default_factory=list)

    def cli(self, *args: str, timeout: float = 120) -> Any:
        return run_cli(*args, env=self.env, timeout=timeout)


def _port(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trio]:
    root = tmp_path_factory.mktemp("fleet")
    servers: dict[str, Server] = {}
    proxy: TcpProxy | None = None
    trio_: Trio | None = None
    try:
        for name in ("a", "b", "c"):
            servers[name] = start_server(root / name)
        proxy = TcpProxy(("127.0.0.1", _port(servers["c"])))
        key_file = root / "b.key"
        key_file.write_text(servers["b"].discovery.token)
        fleet_file = root / "fleet.toml"
        write_fleet(
            Fleet(
                (
                    FleetEntry("b", servers["b"].url, key_file=key_file),
                    FleetEntry("c", f"http://127.0.0.1:{proxy.port}", key_env="C_KEY"),
                )
            ),
            fleet_file,
        )
        env = {
            "SKIPPY_RUNTIME_DIR": str(root / "a"),
            "SKIPPY_FLEET_FILE": str(fleet_file),
            "C_KEY": servers["c"].discovery.token,
        }
        trio_ = Trio(servers, proxy, env, root)
        yield trio_
    finally:
        if proxy is not None:
            proxy.close()
        for server in [*servers.values(), *(trio_.restarts if trio_ else [])]:
            stop_server(server)


class Follower:
    """`skippyctl events --follow --fleet --json` in the background, its stdout in a file."""

    def __init__(self, trio: Trio, *args: str) -> None:
        self.out = trio.root / f"follow-{time.monotonic_ns()}.ndjson"
        self._handle = self.out.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "skippyctl", "events", "--follow", "--fleet", "--json", *args],
            stdout=self._handle,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, **trio.env),
        )

    def records(self) -> list[dict[str, Any]]:
        data = self.out.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        return ndjson_objects(complete)

    def wait_for(self, check: Any, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        return wait_for(lambda: check(self.records()) and self.records(), timeout_s)  # type: ignore[no-any-return]

    def stop(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGINT)
        try:
            _, err = self.process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate()
        self._handle.close()
        return self.process.returncode, err.decode()


def statuses(records: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("record") == "node_status" and r["node"] == node]


def events_of(records: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    return [r for r in records if "event" in r and r["node"] == node]


def retained_sequences(server: Server) -> int:
    """How many events `server` retained up to now (its replay from the start, to the edge)."""
    return len(server.events())


def test_ps_fleet_shows_every_node(trio: Trio) -> None:
    result = trio.cli("ps", "--fleet", "--json")
    assert result.code == 0, result.stderr
    (document,) = result.records()
    assert document["record"] == "fleet_state"
    nodes = {n["node"]: n for n in document["nodes"]}
    assert list(nodes) == ["local", "b", "c"]
    assert all(n["reachable"] for n in nodes.values())
    assert all(n["state"]["schema_version"] == 1 for n in nodes.values())
    assert nodes["b"]["url"] == trio.servers["b"].url
    assert trio.servers["b"].discovery.token not in result.stdout
    people = trio.cli("ps", "--fleet")
    assert people.code == 0
    assert all(name in people.stdout for name in ("local", "b", "c"))


def test_node_steering_acts_on_that_runtime_only(trio: Trio) -> None:
    tiny = str(FIXTURES / "tiny.gguf")
    loaded = trio.cli("load", tiny, "--node", "b", "--alias", "steered", "--json")
    assert loaded.code == 0, loaded.stderr
    assert loaded.events()[-1] == "model_available"
    states = {
        name: [m["model_id"] for m in server.client().state()["models"]]
        for name, server in trio.servers.items()
    }
    assert states == {"a": [], "b": ["steered"], "c": []}
    waited = trio.cli("wait", "--node", "b", "--for", "model_available=steered", "--json")
    assert waited.code == 0, waited.stderr
    made = trio.cli("generate", "steered", "Once", "--node", "b", "--max-tokens", "3", "--json")
    assert made.code == 0, made.stderr
    assert made.records()[-1]["record"] == "receipt"
    elsewhere = trio.cli("generate", "steered", "Once", "--node", "c", "--json")
    assert elsewhere.code != 0  # c has no such model
    unloaded = trio.cli("unload", "steered", "--node", "b", "--json")
    assert unloaded.code == 0, unloaded.stderr
    assert [m["state"] for m in trio.servers["b"].client().state()["models"]] == ["unloaded"]


def test_a_wrong_key_or_a_dead_address_is_a_reason_not_a_crash(trio: Trio) -> None:
    bad_key = trio.root / "bad.key"
    bad_key.write_text("not-the-key")
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    fleet_file = trio.root / "broken-fleet.toml"
    write_fleet(
        Fleet(
            (
                FleetEntry("wrongkey", trio.servers["b"].url, key_file=bad_key),
                FleetEntry("nobody", f"http://127.0.0.1:{dead_port}"),
            )
        ),
        fleet_file,
    )
    result = run_cli(
        "ps", "--fleet", "--json", env={**trio.env, "SKIPPY_FLEET_FILE": str(fleet_file)}
    )
    assert result.code == 3
    (document,) = result.records()
    nodes = {n["node"]: n for n in document["nodes"]}
    assert nodes["local"]["reachable"]
    assert (nodes["wrongkey"]["reachable"], nodes["wrongkey"]["reason_code"]) == (
        False,
        "node_unauthorized",
    )
    assert (nodes["nobody"]["reachable"], nodes["nobody"]["reason_code"]) == (
        False,
        "node_unreachable",
    )
    assert "not-the-key" not in result.stdout + result.stderr
    steered = run_cli(
        "load",
        "x.gguf",
        "--node",
        "nobody",
        "--json",
        env={**trio.env, "SKIPPY_FLEET_FILE": str(fleet_file)},
    )
    assert steered.code == 3
    assert steered.records()[-1]["reason_code"] == "node_unreachable"


def _generate(trio: Trio, node: str, count: int) -> None:
    for _ in range(count):
        made = trio.cli("generate", "m", "Hello", "--node", node, "--max-tokens", "2")
        assert made.code == 0, made.stderr


def test_the_merged_stream_has_every_record_once_across_a_forced_disconnect(trio: Trio) -> None:
    tiny = FIXTURES / "tiny.gguf"
    for server in trio.servers.values():
        assert server.load(tiny, alias="m", ctx=512, lanes=2)["state"] == "available"
    follower = Follower(trio)
    try:
        follower.wait_for(
            lambda rs: (
                {s["node"] for s in rs if s.get("record") == "node_status"} == {"local", "b", "c"}
            )
        )
        _generate(trio, "c", 2)
        _generate(trio, "b", 1)
        assert trio.proxy.cut() > 0  # c's stream breaks under the follower
        follower.wait_for(lambda rs: len(statuses(rs, "c")) >= 3)  # up, down, up again
        _generate(trio, "c", 2)
        _generate(trio, "local", 1)
        expected = {name: retained_sequences(server) for name, server in trio.servers.items()}
        node_of = {"a": "local", "b": "b", "c": "c"}
        follower.wait_for(
            lambda rs: all(
                len(events_of(rs, node_of[name])) >= count for name, count in expected.items()
            )
        )
    finally:
        code, err = follower.stop()
    assert code == 130, err
    records = follower.records()
    for name, count in expected.items():
        node = node_of[name]
        sequences = [r["seq"] for r in events_of(records, node)]
        # every record the node retained, once, in its cursor order
        assert sequences[:count] == list(range(1, count + 1)), node
        cursors = [r["cursor"] for r in events_of(records, node)]
        assert len(set(cursors)) == len(cursors)
    c_states = [(s["state"], s.get("restarted")) for s in statuses(records, "c")]
    assert c_states[0] == ("reachable", False)
    assert ("unreachable", None) in c_states
    assert c_states[-1] == ("reachable", False)  # the same runtime: resumed, not restarted
    down = next(s for s in statuses(records, "c") if s["state"] == "unreachable")
    assert down["reason_code"] in ("node_stream_closed", "node_unreachable")
    assert "resume with --since local=rt1:" in err
    assert not any(r.get("record") == "replay_gap" for r in records)


def test_a_node_that_dies_and_comes_back(trio: Trio) -> None:
    follower = Follower(trio, "--since", "1s")
    try:
        follower.wait_for(lambda rs: len(statuses(rs, "c")) >= 1)
        stop_server(trio.servers["c"])
        follower.wait_for(
            lambda rs: (
                statuses(rs, "c")[-1]["state"] == "unreachable"
                and statuses(rs, "c")[-1]["reason_code"]
                in ("node_unreachable", "node_stream_closed")
            )
        )
        # without --follow: the replay ends, and exit 3 says a node was not reached
        once = trio.cli("events", "--fleet", "--json", timeout=60)
        assert once.code == 3, once.stderr
        down = [r for r in once.records() if r.get("record") == "node_status" and r["node"] == "c"]
        assert down and down[-1]["state"] == "unreachable"
        assert {r["node"] for r in once.records() if "event" in r} >= {"local", "b"}
        reborn = start_server(trio.root / "c-again", env={"SKIPPY_API_KEY": trio.env["C_KEY"]})
        trio.restarts.append(reborn)
        trio.proxy.target = ("127.0.0.1", _port(reborn))
        back = follower.wait_for(
            lambda rs: statuses(rs, "c")[-1]["state"] == "reachable", timeout_s=40
        )
        assert statuses(back, "c")[-1]["restarted"] is True
        assert reborn.load(FIXTURES / "tiny.gguf", alias="again")["state"] == "available"
        after = follower.wait_for(
            lambda rs: any(
                r["node"] == "c" and r.get("event") == "model_available" for r in events_of(rs, "c")
            )
        )
    finally:
        follower.stop()
    new_instance = reborn.discovery.process_instance_id
    fresh = [r for r in events_of(after, "c") if new_instance in r["cursor"]]
    assert fresh, "no event of the new instance"
    assert [r["seq"] for r in fresh] == sorted(r["seq"] for r in fresh)


def test_events_fleet_refuses_a_bad_since(trio: Trio) -> None:
    result = trio.cli("events", "--fleet", "--since", "yesterday")
    assert result.code == 2
    assert "NODE=CURSOR" in result.stderr


def _followers_of(parent: int) -> list[int]:
    """The `skippyctl events` processes whose parent is `parent` (one per node)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[-1].split()[1]) == parent and b"events" in cmdline:
            found.append(int(entry.name))
    return found


def test_limit_and_people_lines_and_no_follower_outlives_the_command(trio: Trio) -> None:
    limited = trio.cli("events", "--fleet", "--json", "--limit", "5")
    assert limited.code == 0, limited.stderr
    assert len([r for r in limited.records() if "event" in r]) == 5
    people = trio.cli("events", "--fleet", "--node", "local", "--node", "b")
    assert people.code == 0, people.stderr
    lines = people.stdout.splitlines()
    assert any(" local " in line for line in lines) and any(" b " in line for line in lines)
    assert not any(" c " in line for line in lines)
    assert "resume with --since local=rt1:" in people.stderr
    follower = Follower(trio)
    try:
        children = wait_for(
            lambda: (
                len(_followers_of(follower.process.pid)) == 3
                and _followers_of(follower.process.pid)
            )
        )
        follower.process.kill()  # no chance to stop its children: they must go by themselves
        follower.process.wait()
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), 10)
    finally:
        follower.stop()


def test_an_unread_stream_holds_a_bounded_queue_and_still_closes(
    trio: Trio, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skippyctl.client import fleet as fleet_module

    monkeypatch.setattr(fleet_module, "MAX_PENDING", 3)
    b = trio.servers["b"]
    entry = FleetEntry("b", b.url, key_file=trio.root / "b.key")
    stream = fleet_module.FleetStream({"b": lambda: fleet_module.remote_client(entry)})
    try:
        # b retained far more than 3 records: its reader fills the queue, then waits
        wait_for(lambda: stream._queue.full(), 10)
        time.sleep(0.5)
        assert stream._queue.qsize() == 3
    finally:
        started = time.monotonic()
        stream.close()
        assert time.monotonic() - started < 3
        assert not stream.followers["b"].thread.is_alive()


def test_a_frame_reader_holds_a_bounded_queue_and_lets_go_when_closed(trio: Trio) -> None:
    from skippyctl.client.http import FrameReader

    server = trio.servers["b"]
    client = server.client()
    reader = FrameReader(client, f"rt1:{server.discovery.process_instance_id}:0", max_pending=3)
    try:
        wait_for(lambda: reader.queue.full(), 10)  # b retained far more than 3 frames
        time.sleep(0.5)
        assert reader.queue.qsize() == 3
        assert reader._thread.is_alive()  # waiting for room, not dropping frames
        frames = [reader.get(1.0) for _ in range(3)]
        assert all(getattr(frame, "name", None) for frame in frames)
    finally:
        reader.close()
        client.close()
        reader._thread.join(5)
    assert not reader._thread.is_alive()
