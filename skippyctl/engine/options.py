"""What an engine worker is told at spawn: its options, as command-line arguments.

The host decides these once — the composition root makes them from the runtime's settings
(``config/runtime_settings.py``: SKIPPY_SERVING_EVENTS, SKIPPY_STAGE_LINK_PROBE_MS,
SKIPPY_CAPTURE_NATIVE_LOG and the SKIPPY_TEST_* fault injections) and ``--debug-token-events``
(:meth:`EngineOptions.from_settings`) — and every engine it starts gets them as arguments
(``--serving-events on|off --debug-token-events on|off …``). Nothing here reads or writes the
environment, and the worker reads none: the options are values, so the engine and the scheduler
cannot disagree about them. Defaults are the operator defaults; a worker started without the
flags (a test) gets them. The test fault injections are rendered only when set.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final

from skippyctl.config.runtime_settings import (
    DEFAULT_DEVICE_LOW_FREE_PCT,
    DEFAULT_LINK_PROBE_INTERVAL_MS,
    MIN_LINK_PROBE_INTERVAL_MS,
    RuntimeSettings,
)

_ON: Final = "on"
_OFF: Final = "off"


@dataclass(frozen=True, slots=True)
class EngineOptions:
    serving_events: bool = True
    """False only for the events-off benchmark baseline (SKIPPY_SERVING_EVENTS=off). The engine
    sends only text and terminals and the host submits no serving events (request, prefill,
    generation, session, KV); model lifecycle events still flow."""
    debug_token_events: bool = False
    """Opt-in debug evidence: one `gen_token` observation per sampled token, which the host
    maps to the debug-class `generation_token_observed` (never the token id or text)."""
    link_probe_interval_ms: float = DEFAULT_LINK_PROBE_INTERVAL_MS
    device_low_free_pct: float = DEFAULT_DEVICE_LOW_FREE_PCT
    """A serving device below this % free is degraded (engine/device_watch.py)."""
    """A split model's engine probes each stage link at most this often (engine/links.py)."""
    capture_debug_log: bool = False
    """llama.cpp's raw log lines go to the engine's opt-in debug ring (with a native ring only;
    SKIPPY_CAPTURE_NATIVE_LOG)."""
    compute_turns: str | None = None
    """A file every engine of the runtime opens to compute one at a time
    (engine/compute_turns.py); None: this engine computes whenever it likes."""
    omp_spin_count: int | None = None
    """How long the engine's OpenMP threads spin before they sleep (libgomp's spin count, which
    it reads once, from GOMP_SPINCOUNT; an operator's own setting wins); None: libgomp's
    default. With compute turns, short: an engine's idle team must not spin through another's
    turn (engine/compute_turns.py)."""
    invariant_kernels: bool = False
    """Compute with the ggml CPU library with batch-invariant products (engine/kernels.py):
    the host asks for it for a load without flash attention, whose rows then decode the same
    whatever is beside them."""
    test_progress_delay_us: int = 0
    """Test fault injection: the native load-progress callback waits this long each call."""
    test_decode_delay_ms: float = 0.0
    test_template_date: str | None = None
    """Test fault injection: the day chat templates read as today (YYYY-MM-DD)."""
    """Test fault injection: every llama_decode takes at least this long."""
    test_address_space_limit_mib: int | None = None
    """Test fault injection: the engine runs under an RLIMIT_AS this many MiB above what it
    maps once llama.cpp is loaded."""

    @classmethod
    def from_settings(cls, settings: RuntimeSettings, *, debug_token_events: bool) -> EngineOptions:
        """What a host with these settings tells its engines (``debug_token_events``: the
        ``--debug-token-events`` flag, or its setting)."""
        return cls(
            serving_events=settings.serving_events,
            debug_token_events=debug_token_events,
            link_probe_interval_ms=settings.stage_link_probe_ms,
            device_low_free_pct=settings.device_low_free_pct,
            capture_debug_log=settings.capture_native_log,
            test_progress_delay_us=settings.test_progress_delay_us,
            test_decode_delay_ms=settings.test_decode_delay_ms,
            test_template_date=settings.test_template_date,
            test_address_space_limit_mib=settings.test_engine_as_limit_mib,
        )

    def argv(self) -> list[str]:
        """These options as the worker's command-line arguments."""
        args = [
            "--serving-events",
            _ON if self.serving_events else _OFF,
            "--debug-token-events",
            _ON if self.debug_token_events else _OFF,
            "--link-probe-interval-ms",
            repr(float(self.link_probe_interval_ms)),
            "--device-low-free-pct",
            repr(float(self.device_low_free_pct)),
        ]
        if self.capture_debug_log:
            args.append("--capture-debug-log")
        if self.compute_turns is not None:
            args += ["--compute-turns", self.compute_turns]
        if self.omp_spin_count is not None:
            args += ["--omp-spin-count", str(self.omp_spin_count)]
        if self.invariant_kernels:
            args.append("--invariant-kernels")
        if self.test_progress_delay_us:
            args += ["--test-progress-delay-us", str(self.test_progress_delay_us)]
        if self.test_decode_delay_ms:
            args += ["--test-decode-delay-ms", repr(float(self.test_decode_delay_ms))]
        if self.test_template_date is not None:
            args += ["--test-template-date", self.test_template_date]
        if self.test_address_space_limit_mib is not None:
            args += ["--test-address-space-limit-mib", str(self.test_address_space_limit_mib)]
        return args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The worker's flags for :class:`EngineOptions` (parsed back by :func:`from_arguments`)."""
    defaults = EngineOptions()
    parser.add_argument(
        "--serving-events", choices=(_ON, _OFF), default=_ON if defaults.serving_events else _OFF
    )
    parser.add_argument(
        "--debug-token-events",
        choices=(_ON, _OFF),
        default=_ON if defaults.debug_token_events else _OFF,
    )
    parser.add_argument(
        "--link-probe-interval-ms", type=float, default=defaults.link_probe_interval_ms
    )
    parser.add_argument("--device-low-free-pct", type=float, default=defaults.device_low_free_pct)
    parser.add_argument("--capture-debug-log", action="store_true")
    parser.add_argument("--compute-turns", default=None)
    parser.add_argument("--omp-spin-count", type=int, default=None)
    parser.add_argument("--invariant-kernels", action="store_true")
    parser.add_argument("--test-progress-delay-us", type=int, default=0)
    parser.add_argument("--test-decode-delay-ms", type=float, default=0.0)
    parser.add_argument("--test-template-date", default=None)
    parser.add_argument("--test-address-space-limit-mib", type=int, default=None)


def from_arguments(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(
        serving_events=args.serving_events == _ON,
        debug_token_events=args.debug_token_events == _ON,
        link_probe_interval_ms=max(MIN_LINK_PROBE_INTERVAL_MS, args.link_probe_interval_ms),
        device_low_free_pct=args.device_low_free_pct
        if args.device_low_free_pct > 0
        else DEFAULT_DEVICE_LOW_FREE_PCT,
        capture_debug_log=args.capture_debug_log,
        compute_turns=args.compute_turns,
        omp_spin_count=None if args.omp_spin_count is None else max(0, args.omp_spin_count),
        invariant_kernels=args.invariant_kernels,
        test_progress_delay_us=max(0, args.test_progress_delay_us),
        test_decode_delay_ms=max(0.0, args.test_decode_delay_ms),
        test_template_date=args.test_template_date,
        test_address_space_limit_mib=args.test_address_space_limit_mib,
    )
