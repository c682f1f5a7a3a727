"""What an engine worker is told at spawn: its options, as command-line arguments.

The host decides these once, from its own options (the composition root reads
`SKIPPY_SERVING_EVENTS` and `--debug-token-events`), and every engine it starts gets them as
arguments (`--serving-events on|off --debug-token-events on|off`). Nothing here reads or writes
the environment: the options are values, so the engine and the scheduler cannot disagree about
them. Defaults are the operator defaults; a worker started without the flags (a test) gets them.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Final

SERVING_EVENTS_ENV: Final = "SKIPPY_SERVING_EVENTS"
"""`off`: a benchmark baseline, not an operator feature. The engine sends only text and terminals
and the host submits no serving events (request, prefill, generation, session, KV); model
lifecycle events still flow. Read once by the composition root (:func:`serving_events_from`)."""

LINK_PROBE_INTERVAL_ENV: Final = "SKIPPY_STAGE_LINK_PROBE_MS"
"""How often a split model's engine probes each stage link, in ms (default 1000). Read once by
the composition root (:func:`link_probe_interval_from`); tests set a short one."""
DEFAULT_LINK_PROBE_INTERVAL_MS: Final = 1000.0
MIN_LINK_PROBE_INTERVAL_MS: Final = 10.0

_ON: Final = "on"
_OFF: Final = "off"


@dataclass(frozen=True, slots=True)
class EngineOptions:
    serving_events: bool = True
    """False only for the events-off benchmark baseline (see :data:`SERVING_EVENTS_ENV`)."""
    debug_token_events: bool = False
    """Opt-in debug evidence: one `gen_token` observation per sampled token, which the host
    maps to the debug-class `generation_token_observed` (never the token id or text)."""
    link_probe_interval_ms: float = DEFAULT_LINK_PROBE_INTERVAL_MS
    """A split model's engine probes each stage link at most this often (engine/links.py)."""

    def argv(self) -> list[str]:
        """These options as the worker's command-line arguments."""
        return [
            "--serving-events",
            _ON if self.serving_events else _OFF,
            "--debug-token-events",
            _ON if self.debug_token_events else _OFF,
            "--link-probe-interval-ms",
            repr(float(self.link_probe_interval_ms)),
        ]


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


def from_arguments(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(
        serving_events=args.serving_events == _ON,
        debug_token_events=args.debug_token_events == _ON,
        link_probe_interval_ms=max(MIN_LINK_PROBE_INTERVAL_MS, args.link_probe_interval_ms),
    )


def serving_events_from(value: str | None) -> bool:
    """The `SKIPPY_SERVING_EVENTS` convention: only `off` (any case, padded) turns them off."""
    return (value or _ON).strip().lower() != _OFF


def link_probe_interval_from(value: str | None) -> float:
    """The `SKIPPY_STAGE_LINK_PROBE_MS` convention: a number of ms (at least
    ``MIN_LINK_PROBE_INTERVAL_MS``); unset or unusable: the default."""
    try:
        interval = float(value) if value else DEFAULT_LINK_PROBE_INTERVAL_MS
    except ValueError:
        return DEFAULT_LINK_PROBE_INTERVAL_MS
    if not math.isfinite(interval):
        return DEFAULT_LINK_PROBE_INTERVAL_MS
    return max(MIN_LINK_PROBE_INTERVAL_MS, interval)
