"""The Python serving plugin interface: the C ABI's contracts (skippy_plugin.h) in Python terms.

A Python plugin is an object with the methods of :class:`Plugin` (subclass :class:`BasePlugin`
to get no-op defaults), made by a zero-argument callable registered in the entry-point group
``skippyctl.plugins``::

    [project.entry-points."skippyctl.plugins"]
    ngram-py = "skippy_ngram_plugin:NgramPlugin"

It runs in the plugin sidecar process (``python -m skippyctl.plugins.sidecar``), never in the
engine. The contracts are the C ones:

- callbacks are called from one thread, one at a time; an exception from one is counted as a
  failure of the plugin (reason ``raised``) and never reaches the engine — repeated failures
  disable the plugin;
- the committed stream of a request (index 0 = its first generated token) arrives contiguous,
  prefix-consistent and complete: :meth:`Plugin.commit` runs, the ``pending`` run of each
  :class:`ProposalQuery` (apply it as a commit BEFORE proposing) and the ``suffix`` of
  :meth:`Plugin.finish`, by ``start``, are each committed token exactly once, in order;
- :meth:`Plugin.propose` returns at most ``query.capacity`` token ids in ``0 <= id < n_vocab``,
  or ``None``/``[]`` for no proposal; anything else is dropped and counted (``invalid_tokens``);
  an answer after ``query.deadline_mono_ns`` (``time.monotonic_ns()``) is dropped as late;
- :meth:`Plugin.finish` or :meth:`Plugin.abort` is the last call for a request.

Plugin specs: a string selects one plugin — a path ending ``.so`` is a C plugin (its short name
is the file's basename), anything else is an entry-point name in the group.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib import metadata
from typing import Final, Protocol, runtime_checkable

from skippyctl.plugins.abi import AbortReasonCode, StopReasonCode

__all__ = [
    "ABORT_REASON_CODES",
    "ENTRY_POINT_GROUP",
    "STOP_REASON_CODES",
    "AbortReasonCode",
    "BasePlugin",
    "Plugin",
    "PluginNotFound",
    "PluginReceipt",
    "PluginSpec",
    "ProposalQuery",
    "RequestIds",
    "SpecKind",
    "StopReasonCode",
    "load_entry_point",
    "parse_spec",
    "receipt_fields",
    "receipt_from_fields",
]

ENTRY_POINT_GROUP: Final = "skippyctl.plugins"


@dataclass(frozen=True, slots=True)
class RequestIds:
    """Who a callback is about: opaque ids (``skippy_plugin_ids_v1``)."""

    request: int
    session: int | None = None


@dataclass(frozen=True, slots=True)
class ProposalQuery:
    """``skippy_plugin_query_v1``: apply ``pending`` (committed tokens ``pending_start`` ...)
    as a commit, then propose at most ``capacity`` tokens before ``deadline_mono_ns``."""

    ids: RequestIds
    capacity: int
    deadline_mono_ns: int
    pending_start: int
    pending: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PluginReceipt:
    """``skippy_plugin_receipt_v1``: a request's generation receipt. Timings in ms; ``nan``
    when a timing does not apply."""

    stop_reason: StopReasonCode = StopReasonCode.UNKNOWN
    prompt_tokens: int = 0
    reused_tokens: int = 0
    generated_tokens: int = 0
    queue_ms: float = math.nan
    prefill_ms: float = math.nan
    ttft_ms: float = math.nan
    decode_ms: float = math.nan
    spec_proposed: int = 0
    spec_accepted: int = 0
    spec_rejected: int = 0
    spec_late: int = 0
    spec_discarded: int = 0


def receipt_from_fields(fields: Sequence[int | float]) -> PluginReceipt:
    """A receipt from its fields in the ABI's order (stop reason, prompt, reused, generated,
    queue/prefill/ttft/decode ms, spec proposed/accepted/rejected/late/discarded: the wire's
    FINISH header, :func:`receipt_fields`); an unknown stop reason is ``UNKNOWN``."""
    stop = int(fields[0])
    return PluginReceipt(
        stop_reason=StopReasonCode(stop)
        if stop in StopReasonCode._value2member_map_
        else StopReasonCode.UNKNOWN,
        prompt_tokens=int(fields[1]),
        reused_tokens=int(fields[2]),
        generated_tokens=int(fields[3]),
        queue_ms=float(fields[4]),
        prefill_ms=float(fields[5]),
        ttft_ms=float(fields[6]),
        decode_ms=float(fields[7]),
        spec_proposed=int(fields[8]),
        spec_accepted=int(fields[9]),
        spec_rejected=int(fields[10]),
        spec_late=int(fields[11]),
        spec_discarded=int(fields[12]),
    )


@runtime_checkable
class Plugin(Protocol):
    """A serving plugin (module docstring). Every method may raise; the sidecar counts it."""

    def begin(self, ids: RequestIds, prompt: Sequence[int], reused: int) -> None: ...

    def commit(self, ids: RequestIds, start: int, tokens: Sequence[int]) -> None: ...

    def propose(self, query: ProposalQuery) -> list[int] | None: ...

    def outcome(self, ids: RequestIds, proposed: int, accepted: int, rejected: int) -> None: ...

    def finish(
        self, ids: RequestIds, start: int, suffix: Sequence[int], receipt: PluginReceipt
    ) -> None: ...

    def abort(self, ids: RequestIds, reason: AbortReasonCode) -> None: ...

    def close(self) -> None: ...


class BasePlugin:
    """No-op defaults for every :class:`Plugin` method: override what the plugin needs."""

    def begin(self, ids: RequestIds, prompt: Sequence[int], reused: int) -> None:
        return None

    def commit(self, ids: RequestIds, start: int, tokens: Sequence[int]) -> None:
        return None

    def propose(self, query: ProposalQuery) -> list[int] | None:
        return None

    def outcome(self, ids: RequestIds, proposed: int, accepted: int, rejected: int) -> None:
        return None

    def finish(
        self, ids: RequestIds, start: int, suffix: Sequence[int], receipt: PluginReceipt
    ) -> None:
        return None

    def abort(self, ids: RequestIds, reason: AbortReasonCode) -> None:
        return None

    def close(self) -> None:
        return None


class SpecKind(StrEnum):
    C = "c"
    PYTHON = "python"


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """A resolved plugin spec string. ``name`` is safe to report (a basename or an
    entry-point name, never a path); ``target`` is the path or the entry-point name."""

    kind: SpecKind
    name: str
    target: str


def parse_spec(spec: str) -> PluginSpec:
    """A path ending ``.so`` is a C plugin; anything else names an entry point."""
    if spec.endswith(".so"):
        return PluginSpec(SpecKind.C, os.path.basename(spec), spec)
    return PluginSpec(SpecKind.PYTHON, spec, spec)


class PluginNotFound(LookupError):
    """No entry point of that name in the group."""


def load_entry_point(name: str) -> Plugin:
    """The plugin the entry point ``name`` makes (its object is called with no arguments)."""
    found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        raise PluginNotFound(name)
    factory: Callable[[], object] = found[0].load()
    plugin = factory()
    if not isinstance(plugin, Plugin):
        raise TypeError("the entry point did not make a Plugin")
    return plugin


STOP_REASON_CODES: Final[dict[str, StopReasonCode]] = {
    "eos": StopReasonCode.EOS,
    "stop": StopReasonCode.STRING,
    "length": StopReasonCode.LENGTH,
    "cancelled": StopReasonCode.CANCELLED,
    "timeout": StopReasonCode.TIMEOUT,
    "error": StopReasonCode.ERROR,
}
"""The engine's ``StopReason`` values (events/envelope.py) → ABI codes."""

ABORT_REASON_CODES: Final[dict[str, AbortReasonCode]] = {
    "cancelled": AbortReasonCode.CANCELLED,
    "timeout": AbortReasonCode.TIMEOUT,
    "error": AbortReasonCode.ERROR,
    "shutdown": AbortReasonCode.SHUTDOWN,
}


def _number(value: object, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value)


def _count(value: object) -> int:
    n = _number(value, 0.0)
    return int(n) if math.isfinite(n) and 0 <= n < 2**63 else 0


def receipt_fields(receipt: Mapping[str, object]) -> tuple[int | float, ...]:
    """A receipt mapping (``Receipt.document()``'s keys, or flat ``spec_*`` keys) → the
    receipt's fields in the ABI's order (the wire's FINISH header, :func:`receipt_from_fields`).
    Missing or unusable values: 0 for counts, NaN for times."""
    spec = receipt.get("speculative")
    spec_map: Mapping[str, object] = spec if isinstance(spec, Mapping) else {}

    def spec_count(key: str) -> int:
        return _count(spec_map.get(key, receipt.get(f"spec_{key}")))

    stop = receipt.get("stop_reason")
    code = STOP_REASON_CODES.get(str(stop), StopReasonCode.UNKNOWN) if stop is not None else 0
    return (
        int(code),
        _count(receipt.get("prompt_tokens")),
        _count(receipt.get("reused_tokens")),
        _count(receipt.get("generated_tokens")),
        *(
            _number(receipt.get(k), math.nan)
            for k in ("queue_ms", "prefill_ms", "ttft_ms", "decode_ms")
        ),
        *(spec_count(k) for k in ("proposed", "accepted", "rejected", "late", "discarded")),
    )
