"""The runtimes `benchmarks/decode_events.py` compares: one `skippyctl runtime serve` per
variant, each in a private runtime directory, alive for the whole run.

Contract: a :class:`Runtime` starts with the environment of this process less every runtime
knob (serving events, native layer, OTEL_*, test and runtime-directory settings), plus its
:class:`Variant`'s own; it is ready once its discovery file names its URL
and token (``START_TIMEOUT_S``), and ``load`` loads the model as ``MODEL_ALIAS`` with the
benchmark's lanes and context through `skippyctl load`, then starts the variant's live SSE
subscriber (``benchmarks/decode_events_children.py``). An exporter variant's runtime exports
OTLP (``OTEL_EXPORTER_OTLP_ENDPOINT``) to its stub receiver, with ``exporter_knobs``
(``EXPORTER_RETRY_FAST`` or none) in its environment. ``stop`` ends the subscriber (returning
what it saw) and the runtime (SIGTERM, SIGKILL after 30 s). ``cpu_ms`` reads the host's and
its engine's CPU time from /proc schedstat.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from benchmarks.decode_events_children import Child
from benchmarks.models import REPO

MODEL_ALIAS: Final = "bench"
START_TIMEOUT_S: Final = 60.0
REQUEST_TIMEOUT_S: Final = 600.0
EXPORTER_RETRY_FAST: Final = {
    # Batches every 100 ms, metrics every 200 ms, each export given up after 200 ms (the SDK
    # retries a 503 with backoff only within that): the exporter keeps trying, a worst case.
    "OTEL_BLRP_SCHEDULE_DELAY": "100",
    "OTEL_BSP_SCHEDULE_DELAY": "100",
    "OTEL_METRIC_EXPORT_INTERVAL": "200",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "0.2",
}
_INHERITED_KNOBS: Final = re.compile(
    r"SKIPPY_(SERVING_EVENTS|NATIVE_DISABLE|DEBUG_TOKEN_EVENTS|TEST_.*|RUNTIME_DIR|"
    r"API_KEY|CAPTURE_NATIVE_LOG|ENGINE_STDERR)|OTEL_.*"
)


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()
    collector: str | None = None
    subscribed: bool = True
    target: bool = True
    """Whether the issue's on/off targets apply (not to the opt-in debug class)."""


VARIANTS: Final = (
    Variant(
        "off",
        "events off",
        env=(("SKIPPY_SERVING_EVENTS", "off"), ("SKIPPY_NATIVE_DISABLE", "1")),
        subscribed=False,
        target=False,
    ),
    Variant("on", "events on"),
    Variant("debug", "on + per-token debug", args=("--debug-token-events",), target=False),
    Variant("slow", "on + stalled OTLP receiver", collector="slow"),
    Variant("failing", "on + failing OTLP receiver", collector="failing"),
)
MULTI_VARIANTS: Final = ("off", "on")


def _cpu_ms(pid: int) -> float:
    """On-CPU time of every live thread of `pid` (schedstat, ns precision); 0 if it is gone."""
    total = 0
    if pid <= 0:
        return 0.0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                open(f"/proc/{pid}/task/{task}/schedstat") as stat,
            ):
                total += int(stat.read().split()[0])
    return total / 1e6


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not _INHERITED_KNOBS.fullmatch(k)}


class Runtime:
    """One `skippyctl runtime serve` for one variant, in a private runtime directory."""

    def __init__(
        self,
        variant: Variant,
        root: Path,
        collectors: dict[str, int],
        exporter_knobs: Mapping[str, str],
    ) -> None:
        self.variant = variant
        self.directory = root / variant.name
        self.directory.mkdir(parents=True)
        self.env = dict(_clean_env(), SKIPPY_RUNTIME_DIR=str(self.directory), **dict(variant.env))
        args = ["--port", "0", *variant.args]
        if variant.collector is not None:
            port = collectors[variant.collector]
            self.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
            self.env.update(exporter_knobs)
        self._log = open(self.directory / "serve.log", "wb")  # noqa: SIM115 - the server's life
        self.process = subprocess.Popen(
            [sys.executable, "-m", "skippyctl", "runtime", "serve", *args],
            cwd=REPO,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
        )
        try:
            self.url, self.token = self._discover()
        except BaseException:
            self.process.kill()
            self.process.wait()
            raise
        self.headers = {"Authorization": f"Bearer {self.token}"}
        self.client = httpx.Client(
            base_url=self.url, headers=self.headers, timeout=REQUEST_TIMEOUT_S
        )
        self.subscriber: Child | None = None
        self.engine_pid = 0

    def _discover(self) -> tuple[str, str]:
        deadline = time.monotonic() + START_TIMEOUT_S
        path = self.directory / "runtime.json"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.variant.name} runtime exited: {self._tail()}")
            if path.exists():
                with contextlib.suppress(orjson.JSONDecodeError):
                    data = orjson.loads(path.read_bytes())
                    return str(data["url"]), str(data["token"])
            time.sleep(0.05)
        raise RuntimeError(f"{self.variant.name} runtime did not start: {self._tail()}")

    def _tail(self) -> str:
        return (self.directory / "serve.log").read_text(errors="replace")[-1500:]

    def load(self, path: Path, lanes: int, context_tokens: int) -> None:
        command = [sys.executable, "-m", "skippyctl", "load", str(path), "--alias", MODEL_ALIAS]
        command += ["--lanes", str(lanes), "--ctx", str(context_tokens), "--timeout", "300"]
        result = subprocess.run(
            command, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=360
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{self.variant.name}: load failed ({result.returncode}): {result.stderr[-800:]}"
            )
        engines = self.client.get("/api/runtime/state").json().get("engines", [])
        self.engine_pid = int(engines[0]["pid"]) if engines else 0
        if self.variant.subscribed:
            env = dict(os.environ, SKIPPY_BENCH_TOKEN=self.token)
            self.subscriber = Child(["--subscriber", self.url], env=env)

    def cpu_ms(self) -> tuple[float, float]:
        """CPU time so far of the host and of its engine (ms, every live thread)."""
        return _cpu_ms(self.process.pid), _cpu_ms(self.engine_pid)

    def health(self) -> dict[str, Any]:
        state = self.client.get("/api/runtime/state").json()
        health: dict[str, Any] = state.get("health", {})
        return health

    def telemetry(self) -> dict[str, float]:
        """The OTLP exporter's counters from /metrics (skippy_otlp_*), summed over labels."""
        out: dict[str, float] = {}
        for line in self.client.get("/metrics").text.splitlines():
            if line.startswith("skippy_otlp_"):
                name, _, value = line.rpartition(" ")
                key = name.split("{")[0]
                with contextlib.suppress(ValueError):
                    out[key] = out.get(key, 0.0) + float(value)
        return out

    def stop(self) -> dict[str, Any]:
        seen = self.subscriber.finish() if self.subscriber is not None else {}
        self.client.close()
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()
        return seen
