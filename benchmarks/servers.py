"""The servers the serving benchmarks compare, started the same way every time, and stopped.

Three OpenAI-compatible servers over HTTP on 127.0.0.1, each in its own process group:

- `skippy`: `skippyctl runtime serve --port 0` with a private SKIPPY_RUNTIME_DIR, then
  `skippyctl load MODEL --alias bench --lanes S --ctx S × per-session context` (or plain
  `load MODEL --alias bench` with `defaults=True`: what an operator gets without flags).
- `skippy-base`: the same, from another checkout of skippy (`ServerSpec.skippy_base`: its
  directory, with its native library built), run with that directory first on the module
  path — the previous head side by side with this one, in the same rounds.
- `llama-server`: llama.cpp's own server, built from the llama.cpp that llama-cpp-python vendors
  (`benchmarks/llama_server_build.py`): `-np S -c S × per-session context -t T -tb T -fa on`
  (split KV: each slot its own per-session context, like skippy's lanes), warm-up off (every
  server gets the same warm-up request instead), no web UI. `llama-server-fa-off`: the same with
  `-fa off` (against skippy `--flash-attn off`).
- `llama_cpp.server`: `python -m llama_cpp.server` from the installed llama-cpp-python, one
  request at a time behind its lock (it has no parallel slots): `--n_ctx` per-session context,
  the same threads, flash attention, `--logits_all False`, `--interrupt_requests False`.

Every process a server started is stopped in `Server.stop` (SIGTERM to its group, then SIGKILL
to the ids it spawned that are still alive) — never anything this script did not start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

import httpx
import orjson

from benchmarks.models import REPO
from skippyctl.client.process_identity import pid_alive

MODEL_ALIAS: Final = "bench"
SEED: Final = 1234
START_TIMEOUT_S: Final = 180.0
STOP_TIMEOUT_S: Final = 15.0
SKIPPY: Final = "skippy"
SKIPPY_BASE: Final = "skippy-base"
SKIPPY_WATCHED: Final = "skippy-watched"
"""skippy started as `skippy` is, measured with a live SSE subscriber on its events (the
load generator's): beside `skippy` in the same rounds, what a subscriber costs."""
LLAMA_SERVER: Final = "llama-server"
LLAMA_SERVER_AGAIN: Final = "llama-server-again"
"""The same llama-server once more, in the same rounds: against the first, the benchmark's own
noise (a ratio an identical server gets)."""
LLAMA_SERVER_FA_OFF: Final = "llama-server-fa-off"
"""llama-server with `-fa off` (its own default, `auto`, turns flash attention on on a CPU):
the peer of skippy's default on a CPU (`--flash-attn auto`: off)."""
LLAMA_CPP_SERVER: Final = "llama_cpp.server"
SERVER_NAMES: Final = (
    SKIPPY,
    SKIPPY_BASE,
    SKIPPY_WATCHED,
    LLAMA_SERVER,
    LLAMA_SERVER_AGAIN,
    LLAMA_SERVER_FA_OFF,
    LLAMA_CPP_SERVER,
)


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """What every server is given: the same model, threads and context per session."""

    path: Path
    sessions: int
    """Parallel sequences: skippy's lanes, llama-server's slots (llama_cpp.server has one)."""
    context_per_session: int
    threads: int
    defaults: bool = False
    """skippy only: `load` without --lanes/--ctx (its defaults decide)."""
    skippy_load_args: tuple[str, ...] = ()
    """More `skippyctl load` arguments (e.g. `--stage HOST:PORT …`, benchmarks/stages.py)."""
    llama_server_args: tuple[str, ...] = ()
    """More `llama-server` arguments (e.g. `--rpc HOST:PORT,… -ngl 999`)."""
    skippy_base: Path | None = None
    """`skippy-base`'s checkout (e.g. a `git worktree` of the previous head)."""


def _children(pid: int) -> list[int]:
    """Ids of the live processes whose parent is `pid` (from /proc)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ")".
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


class Server:
    """A server process this script started, and the ids of the processes it spawned."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], log: IO[bytes]) -> None:
        self.name = name
        self.process = process
        self.log = log
        self.url = ""
        self.headers: dict[str, str] = {}
        self.spawned: set[int] = set()

    def note_children(self) -> None:
        self.spawned.update(_children(self.process.pid))

    def engine_pids(self) -> list[int]:
        """The processes that do the decoding: skippy's engine worker, else the server."""
        return sorted(self.spawned) if self.spawned else [self.process.pid]

    def stop(self) -> None:
        """SIGTERM to the server's group (it shuts down in order), SIGKILL to whatever is left of
        the processes it started; never anything else."""
        process = self.process
        if process.poll() is None:
            self.note_children()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for pid in self.spawned:
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.log.close()


def popen(
    name: str,
    command: list[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path = REPO,
) -> Server:
    log = open(log_path, "wb")  # noqa: SIM115 - closed by Server.stop
    try:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own process group: stopped as one, not by Ctrl-C
        )
    except BaseException:
        log.close()
        raise
    return Server(name, process, log)


def log_tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-1500:]
    except OSError:
        return ""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_ready(server: Server, log_path: Path, probe: str) -> None:
    """Until GET `probe` answers 200 (or the server exits / the start times out)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=5.0) as client:
        while True:
            if server.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{server.name} did not start: {log_tail(log_path)}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(probe).status_code == 200:
                    return
            time.sleep(0.1)


def start_skippy(
    spec: ServerSpec,
    directory: Path,
    env: dict[str, str] | None = None,
    checkout: Path | None = None,
    serve_args: tuple[str, ...] = (),
    load: bool = True,
) -> Server:
    """skippy from this checkout, or from `checkout` (its code first on the module path, in the
    runtime, the engine and the CLI alike); `serve_args`: more `runtime serve` arguments;
    `load`: False leaves the runtime without a model."""
    runtime_dir = directory / "runtime"
    runtime_dir.mkdir()
    environment = dict(os.environ if env is None else env, SKIPPY_RUNTIME_DIR=str(runtime_dir))
    cwd = REPO if checkout is None else checkout
    if checkout is not None:
        environment["PYTHONPATH"] = str(checkout)
    log_path = directory / "skippy.log"
    command = [sys.executable, "-m", "skippyctl", "runtime", "serve", "--port", "0", *serve_args]
    name = SKIPPY if checkout is None else SKIPPY_BASE
    server = popen(name, command, log_path, environment, cwd)
    try:
        discovery = runtime_dir / "runtime.json"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not discovery.exists():
            if server.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"skippy runtime did not start: {log_tail(log_path)}")
            time.sleep(0.05)
        data = orjson.loads(discovery.read_bytes())
        server.url = str(data["url"])
        server.headers = {"Authorization": f"Bearer {data['token']}"}
        if not load:
            return server
        load_command = [
            sys.executable,
            "-m",
            "skippyctl",
            "load",
            str(spec.path),
            "--alias",
            MODEL_ALIAS,
        ]
        if not spec.defaults:
            load_command += ["--lanes", str(spec.sessions)]
            load_command += ["--ctx", str(spec.sessions * spec.context_per_session)]
        load_command += spec.skippy_load_args
        result = subprocess.run(
            load_command,
            cwd=cwd,
            env=environment,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
        if result.returncode != 0:
            raise RuntimeError(f"skippyctl load failed: {result.stderr.strip()[-800:]}")
        server.note_children()  # the engine worker
    except BaseException:
        server.stop()
        raise
    return server


def start_llama_server(
    spec: ServerSpec, directory: Path, flash_attn: str = "on", invariant_kernels: bool = False
) -> Server:
    """`invariant_kernels`: on the ggml CPU library skippy's engines without flash attention
    use (batch-invariant products; skippyctl/engine/kernels.py), in place of its own."""
    from benchmarks.llama_server_build import binary, is_built
    from skippyctl.engine.kernels import INVARIANT_KERNELS_DIR

    if not is_built():
        raise RuntimeError(
            "llama-server is not built: run `.venv/bin/python -m benchmarks.llama_server_build`"
        )
    port = free_port()
    threads = str(spec.threads)
    command = [str(binary("llama-server")), "-m", str(spec.path), "-a", MODEL_ALIAS]
    command += ["-np", str(spec.sessions), "-c", str(spec.sessions * spec.context_per_session)]
    command += ["-t", threads, "-tb", threads, "-fa", flash_attn, "--no-kv-unified"]
    command += ["--no-warmup", "--no-webui", "--seed", str(SEED)]
    command += ["--host", "127.0.0.1", "--port", str(port), *spec.llama_server_args]
    log_path = directory / "llama-server.log"
    env = None
    if invariant_kernels:
        # Its libraries' run path yields to LD_LIBRARY_PATH: libggml-cpu comes from there.
        search = [str(INVARIANT_KERNELS_DIR), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(search))
    server = popen(LLAMA_SERVER, command, log_path, env)
    server.url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(server, log_path, "/health")
        maps = Path(f"/proc/{server.process.pid}/maps")
        if invariant_kernels and str(INVARIANT_KERNELS_DIR) not in maps.read_text():
            raise RuntimeError("llama-server did not take the invariant kernels")
    except BaseException:
        server.stop()
        raise
    return server


def start_llama_cpp_server(spec: ServerSpec, directory: Path) -> Server:
    port = free_port()
    threads = str(spec.threads)
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(spec.path)]
    command += ["--model_alias", MODEL_ALIAS, "--n_ctx", str(spec.context_per_session)]
    command += ["--n_threads", threads, "--n_threads_batch", threads, "--seed", str(SEED)]
    command += ["--flash_attn", "True", "--logits_all", "False"]
    command += ["--interrupt_requests", "False", "--verbose", "False"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    log_path = directory / "llama_cpp_server.log"
    server = popen(LLAMA_CPP_SERVER, command, log_path)
    server.url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(server, log_path, "/v1/models")
    except BaseException:
        server.stop()
        raise
    return server


def start(name: str, spec: ServerSpec, directory: Path) -> Server:
    if name in (SKIPPY, SKIPPY_WATCHED):
        return start_skippy(spec, directory)
    if name == SKIPPY_BASE:
        if spec.skippy_base is None:
            raise ValueError("skippy-base needs a checkout (--skippy-base DIR)")
        return start_skippy(spec, directory, checkout=spec.skippy_base)
    if name in (LLAMA_SERVER, LLAMA_SERVER_AGAIN):
        return start_llama_server(spec, directory)
    if name == LLAMA_SERVER_FA_OFF:
        return start_llama_server(spec, directory, flash_attn="off")
    if name == LLAMA_CPP_SERVER:
        return start_llama_cpp_server(spec, directory)
    raise ValueError(f"unknown server {name!r} ({', '.join(SERVER_NAMES)})")
