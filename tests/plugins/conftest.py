"""Real plugins for the plugin tests: the C example and the fault plugins built with gcc, Python
plugins registered as real entry points (a ``*.dist-info`` directory on the sidecars'
PYTHONPATH), and links that are always closed."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from skippyctl.plugins.api import ENTRY_POINT_GROUP
from skippyctl.plugins.link import PluginLink
from skippyctl.plugins.sidecar_supervisor import PluginReport

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "native" / "include"
HERE = Path(__file__).resolve().parent
EXAMPLES = ROOT / "examples" / "plugins"
CFLAGS = ["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
CFLAGS += ["-fvisibility=hidden", f"-I{INCLUDE}"]
FAULT_MODES = {"sleepy": 1, "garbage": 2, "crashy": 3, "erring": 4, "old_abi": 5}


def _project_entry_points() -> dict[str, str]:
    """The checkout's own plugins as pyproject.toml declares them (an install registers them;
    the venv's metadata may come from another checkout, or predate them)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {}))


# Python plugins registered for the tests: entry-point name → object reference.
TEST_ENTRY_POINTS = {
    **_project_entry_points(),
    "ngram-py": "skippy_ngram_plugin:NgramPlugin",
    "raising": "plugin_faults:RaisingPlugin",
    "raising-lifecycle": "plugin_faults:RaisingLifecyclePlugin",
    "receipt-recorder": "plugin_recorders:ReceiptRecorder",
    "contract-recorder": "plugin_recorders:ContractRecorder",
}


def _cc(source: Path, out: Path, *extra: str) -> Path:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    subprocess.run([compiler, *CFLAGS, *extra, "-o", str(out), str(source)], check=True)
    return out


@dataclass(frozen=True)
class Built:
    ngram: Path
    faults: dict[str, Path]


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    out = tmp_path_factory.mktemp("plugins")
    ngram = _cc(EXAMPLES / "c" / "ngram_plugin.c", out / "ngram_plugin.so")
    faults = {
        name: _cc(HERE / "fault_plugin.c", out / f"{name}.so", f"-DFAULT_MODE={mode}")
        for name, mode in FAULT_MODES.items()
    }
    return Built(ngram, faults)


def write_entry_points(site: Path) -> Path:
    """``site`` made a directory holding a real distribution's metadata with the test entry
    points (put it on a sidecar's PYTHONPATH with :func:`plugin_path`)."""
    dist = site / "skippy_test_plugins-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: skippy-test-plugins\nVersion: 0\n")
    lines = ["[skippyctl.plugins]"] + [f"{k} = {v}" for k, v in TEST_ENTRY_POINTS.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return site


def plugin_path(entry_points: Path) -> str:
    """A PYTHONPATH with the checkout, the test entry points, the example package and the
    test plugins' modules importable."""
    path = [str(ROOT), str(entry_points), str(EXAMPLES / "python" / "src"), str(HERE)]
    return os.pathsep.join(path)


@pytest.fixture(scope="session")
def entry_points_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_entry_points(tmp_path_factory.mktemp("site"))


@pytest.fixture
def plugin_env(entry_points_dir: Path, tmp_path: Path) -> dict[str, str]:
    """The sidecars' environment (:func:`plugin_path`); the plugins record their streams in
    tmp_path."""
    return dict(
        os.environ,
        PYTHONPATH=plugin_path(entry_points_dir),
        SKIPPY_PLUGIN_RECORD=str(tmp_path / "record.txt"),
        FAULT_SLEEP_MS="300",
    )


@dataclass
class Reports:
    items: list[PluginReport] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def __call__(self, report: PluginReport) -> None:
        with self.changed:
            self.items.append(report)
            self.changed.notify_all()

    def of(self, plugin: str, kind: str | None = None) -> list[PluginReport]:
        with self.changed:
            return [r for r in self.items if r.plugin == plugin and kind in (None, r.kind)]

    def wait_for(self, plugin: str, kind: str, count: int = 1, timeout_s: float = 60.0) -> None:
        """Block until ``count`` reports of ``kind`` arrived (a timeout is a test failure, not a
        timing assertion: it only bounds a hang)."""
        with self.changed:
            ok = self.changed.wait_for(lambda: len(self.of(plugin, kind)) >= count, timeout_s)
        assert ok, (plugin, kind, self.items)


@pytest.fixture
def reports() -> Reports:
    return Reports()


LinkFactory = Callable[..., PluginLink]


@pytest.fixture
def make_link(plugin_env: dict[str, str], reports: Reports) -> Iterator[LinkFactory]:
    links: list[PluginLink] = []

    def make(specs: Sequence[str | Path], **kwargs: Any) -> PluginLink:
        kwargs.setdefault("n_vocab", 1000)
        kwargs.setdefault("deadline_ms", 2000.0)
        kwargs.setdefault("on_report", reports)
        kwargs.setdefault("env", plugin_env)
        link = PluginLink.start([str(s) for s in specs], **kwargs)
        links.append(link)
        return link

    yield make
    for link in links:
        link.close()
    assert_no_sidecars()


def _children() -> list[tuple[int, str, str]]:
    """(pid, state, cmdline) of this process' children."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its last ')'
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == me:
            found.append((int(entry), state, cmdline))
    return found


def assert_no_sidecars() -> None:
    """Every sidecar was reaped: no zombie child, no live sidecar child."""
    leftovers = [c for c in _children() if c[1] == "Z" or "skippyctl.plugins.sidecar" in c[2]]
    assert leftovers == []


# ---- the commit stream a recording plugin saw ----


@dataclass
class Stream:
    prompt_count: int = 0
    tokens: list[int] = field(default_factory=list)
    runs: list[tuple[str, int, int]] = field(default_factory=list)
    finished: bool = False
    aborted: bool = False
    generated: int = -1
    outcomes: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(kind, discard reason, proposed, accepted) of each outcome, in order (ABI codes)."""


def read_streams(path: Path) -> dict[int, Stream]:
    """The record file → per request id its stream, checking as it goes that every run starts
    where the previous one ended (contiguous, prefix-consistent) and nothing follows the end."""
    streams: dict[int, Stream] = {}
    if not path.exists():
        return streams
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            continue  # a Python recorder's JSON line in the same file
        what, request, *rest = line.split()
        if what == "activate":
            continue  # read_activations
        rid = int(request)
        if what == "begin":
            assert rid not in streams, line
            streams[rid] = Stream(prompt_count=int(rest[0]))
            continue
        stream = streams[rid]
        assert not (stream.finished or stream.aborted), ("after the end", line)
        if what in ("commit", "pending", "suffix"):
            start, count, ids = int(rest[0]), int(rest[1]), [int(t) for t in rest[2:]]
            assert start == len(stream.tokens), ("not contiguous", what, start)
            assert len(ids) == count
            stream.tokens += ids
            stream.runs.append((what, start, count))
        elif what == "outcome":
            kind, reason, proposed, accepted = (int(v) for v in rest)
            stream.outcomes.append((kind, reason, proposed, accepted))
        elif what == "finish":
            stream.finished = True
            stream.generated = int(rest[0])
        elif what == "abort":
            stream.aborted = True
    return streams


@dataclass(frozen=True)
class Activation:
    model_id: str
    n_vocab: int
    n_ctx_per_lane: int
    lanes: int
    spec_mode: int
    config: str


def read_activations(path: Path) -> list[Activation]:
    """The ``activate`` lines of a record file (one per sidecar process), in order."""
    found = []
    if not path.exists():
        return found
    for line in path.read_text().splitlines():
        if line.startswith("activate "):
            _, model_id, n_vocab, n_ctx, lanes, mode, config_len, *config = line.split(" ")
            text = " ".join(config)
            assert len(text.encode()) == int(config_len), line
            found.append(
                Activation(model_id, int(n_vocab), int(n_ctx), int(lanes), int(mode), text)
            )
    return found
