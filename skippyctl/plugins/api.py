"""The Python serving plugin interface: the C ABI's contracts (skippy_plugin.h) in Python terms.

A Python plugin is an object with the methods of :class:`Plugin` (subclass :class:`BasePlugin`
to get no-op defaults), made by a zero-argument callable registered in the entry-point group
``skippyctl.plugins``::

    [project.entry-points."skippyctl.plugins"]
    ngram-py = "skippy_ngram_plugin:NgramPlugin"

It runs in the plugin sidecar process (``python -m skippyctl.plugins.sidecar``), never in the
engine. The contracts are the C ones:

- :meth:`BasePlugin.activate` (optional: a plugin without it is not asked) comes first, once
  per plugin process, with the :class:`ActivationContext`: the model (its id, never a path),
  its geometry, its speculation mode, the proposal deadline and the operator's configuration
  for the plugin (``load --plugin-config``); raising there is a load failure;
- callbacks are called from one thread, one at a time; an exception from one is counted as a
  failure of the plugin (reason ``raised``) and never reaches the engine — repeated failures
  disable the plugin;
- the committed stream of a request (index 0 = its first generated token) arrives contiguous,
  prefix-consistent and complete: :meth:`Plugin.commit` runs, the ``pending`` run of each
  :class:`ProposalQuery` (apply it as a commit BEFORE proposing) and the ``suffix`` of
  :meth:`Plugin.finish`, by ``start``, are each committed token exactly once, in order;
- :meth:`Plugin.propose` returns at most ``query.capacity`` token ids in ``0 <= id < n_vocab``,
  or ``None``/``[]`` for no proposal; anything else is discarded (``invalid_token_count``,
  ``invalid_token_id``) and an answer after ``query.deadline_mono_ns`` (``time.monotonic_ns()``)
  too (``deadline_exceeded``): counted by reason, never a failure of the plugin;
- how each proposal ended is a :class:`ProposalOutcome` (:meth:`BasePlugin.proposal_outcome`,
  optional): ``full_accept``, ``first_mismatch``, ``stopped`` (the request ended inside the
  window; it comes before the request's finish or abort) or ``discarded`` with a
  :class:`DiscardReason`. A plugin without ``proposal_outcome`` gets
  :meth:`Plugin.outcome` for the verified windows only;
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
from typing import Any, Final, Protocol, runtime_checkable

from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import FIGURES, NO_FIGURES, GenerationFigures
from skippyctl.plugins.abi import (
    AbortReasonCode,
    DiscardReasonCode,
    OutcomeKindCode,
    SpecModeCode,
    StopReasonCode,
    skippy_plugin_receipt_v1,
)

__all__ = [
    "ABORT_REASON_CODES",
    "ActivationContext",
    "DiscardReason",
    "OutcomeKind",
    "ProposalOutcome",
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


class OutcomeKind(StrEnum):
    """How a proposal ended (``skippy_plugin_outcome_kind``); the values are the JSON."""

    FULL_ACCEPT = "full_accept"
    FIRST_MISMATCH = "first_mismatch"
    STOPPED = "stopped"
    """The request stopped inside the window (end of generation, a stop string, max tokens)."""
    DISCARDED = "discarded"
    """Never verified: :class:`DiscardReason` says why."""


class DiscardReason(StrEnum):
    """Why a proposal was discarded unverified (``skippy_plugin_discard_reason``). A discard is
    counted per plugin by reason and is never a failure of the plugin."""

    DEADLINE_EXCEEDED = "deadline_exceeded"
    INVALID_TOKEN_COUNT = "invalid_token_count"
    INVALID_TOKEN_ID = "invalid_token_id"
    POSITION_MISMATCH = "position_mismatch"
    EXECUTION_FAILED = "execution_failed"


OUTCOME_KIND_CODES: Final[dict[OutcomeKind, OutcomeKindCode]] = {
    kind: OutcomeKindCode[kind.name] for kind in OutcomeKind
}
DISCARD_REASON_CODES: Final[dict[DiscardReason, DiscardReasonCode]] = {
    reason: DiscardReasonCode[reason.name] for reason in DiscardReason
}
SPEC_MODE_CODES: Final[dict[str, SpecModeCode]] = {
    code.name.lower(): code for code in SpecModeCode if code is not SpecModeCode.UNKNOWN
}
"""``load --spec`` values → ABI codes (a mode this table lacks is ``UNKNOWN``)."""


@dataclass(frozen=True, slots=True)
class ProposalOutcome:
    """``skippy_plugin_outcome_v1``: how one proposal for a request ended. A discard has
    ``accepted`` 0 and ``proposed`` the tokens the answer had (0 when none arrived)."""

    kind: OutcomeKind
    proposed: int
    accepted: int
    discard_reason: DiscardReason | None = None

    @property
    def rejected(self) -> int:
        return max(0, self.proposed - self.accepted)


@dataclass(frozen=True, slots=True)
class ActivationContext:
    """``skippy_plugin_activation_v1``: what a plugin learns once, before any request, about
    the model it serves. ``model_id`` is an alias or a file's basename, never a path;
    ``config`` is the operator's text for the plugins of this model (``load --plugin-config``,
    a preset's ``plugin_config``), given unchanged ("" when none): its syntax is the plugin's."""

    model_id: str
    n_vocab: int
    n_ctx_per_lane: int
    lanes: int
    spec_mode: str
    """``load --spec``'s value (``off``, ``ngram``, ``plugin``, ``draft``, ...)."""
    proposal_deadline_ms: float
    config: str = ""


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
    when a timing does not apply. ``queue_ms`` is the C field's name for the engine's wait
    (``figures.engine_wait_ms``: the request reached the engine → its prefill began).

    ``figures`` holds every figure by its one name (``skippyctl.events.figures``), those the
    v1 struct has no field for too; the other fields are the struct's, filled from it by
    :meth:`of` (the engine's way to make one)."""

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
    figures: GenerationFigures = NO_FIGURES

    @classmethod
    def of(cls, stop_reason: StopReasonCode, figures: GenerationFigures) -> PluginReceipt:
        """The receipt of a request that stopped for ``stop_reason`` with ``figures``: each
        struct field is its figure's (:data:`~skippyctl.events.figures.FIGURES`), NaN for
        None."""
        fields: dict[str, Any] = {
            f.plugin_abi: f.number(figures) for f in FIGURES if f.plugin_abi is not None
        }
        return cls(stop_reason=stop_reason, figures=figures, **fields)


ABI_RECEIPT_FIELDS: Final = tuple(
    field[0]
    for field in skippy_plugin_receipt_v1._fields_
    if field[0] not in ("abi_version", "struct_size", "stop_reason", "reserved")
)
"""The struct's figure fields in ABI order (:func:`receipt_fields`, :func:`receipt_from_fields`)."""
_FIGURE_OF_FIELD: Final = {f.plugin_abi: f for f in FIGURES if f.plugin_abi is not None}
if set(_FIGURE_OF_FIELD) != set(ABI_RECEIPT_FIELDS):
    raise TypeError("every skippy_plugin_receipt_v1 field is one figure's (events/figures.py)")


def stop_reason_code(value: int) -> StopReasonCode:
    """The ABI code of ``value``; ``UNKNOWN`` for a number the ABI does not have."""
    known = value in StopReasonCode._value2member_map_
    return StopReasonCode(value) if known else StopReasonCode.UNKNOWN


def receipt_from_fields(fields: Sequence[int | float]) -> PluginReceipt:
    """A receipt from its fields in the ABI's order (stop reason, then
    :data:`ABI_RECEIPT_FIELDS`: prompt, reused, generated, queue/prefill/ttft/decode ms, spec
    proposed/accepted/rejected/late/discarded; :func:`receipt_fields`); an unknown stop
    reason is ``UNKNOWN``, and the figures the struct has no field for are 0 / None."""
    values: dict[str, Any] = {}  # each value typed by its row
    for name, value in zip(ABI_RECEIPT_FIELDS, fields[1:], strict=True):
        figure = _FIGURE_OF_FIELD[name]
        values[figure.name] = figure.from_number(value)
    return PluginReceipt.of(stop_reason_code(int(fields[0])), GenerationFigures(**values))


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
    """No-op defaults for every :class:`Plugin` method, and the optional ones
    (:meth:`activate`, :meth:`proposal_outcome`): override what the plugin needs."""

    def activate(self, context: ActivationContext) -> None:
        """Once, before any request: the model and the operator's configuration. Raising
        here fails the plugin's load (the model serves without it)."""
        return None

    def proposal_outcome(self, ids: RequestIds, outcome: ProposalOutcome) -> None:
        """How a proposal ended, discards included. The default hands a verified window to
        :meth:`outcome`, as hosts did before outcome kinds existed."""
        if outcome.kind is not OutcomeKind.DISCARDED:
            self.outcome(ids, outcome.proposed, outcome.accepted, outcome.rejected)

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
    """A receipt mapping → the receipt's fields in the ABI's order (:func:`receipt_from_fields`):
    each struct field read by its own name (``spec_proposed``), a speculative one also from a
    ``speculative`` object by its receipt key (``Receipt.document()``'s ``proposed``). Missing
    or unusable values: 0 for counts, NaN for times. The engine does not use it: it gives
    plugins :meth:`PluginReceipt.of` the request's figures."""
    spec = receipt.get("speculative")
    spec_map: Mapping[str, object] = spec if isinstance(spec, Mapping) else {}
    stop = receipt.get("stop_reason")
    code = STOP_REASON_CODES.get(str(stop), StopReasonCode.UNKNOWN) if stop is not None else 0
    values: list[int | float] = [int(code)]
    for name in ABI_RECEIPT_FIELDS:
        figure = _FIGURE_OF_FIELD[name]
        value = receipt.get(name)
        if figure.speculative:
            value = spec_map.get(figure.receipt, value)
        values.append(_count(value) if figure.count else _number(value, math.nan))
    return tuple(values)


def plugin_stop_reason(stop_reason: StopReason) -> StopReasonCode:
    """The ABI code of the engine's stop reason."""
    return STOP_REASON_CODES.get(stop_reason.value, StopReasonCode.UNKNOWN)
