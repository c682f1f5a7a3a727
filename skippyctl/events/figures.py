"""A request's generation figures: one type the engine fills, and the one table of where each goes.

:class:`GenerationFigures` is what the engine measured about one request — counts, timings and
the speculation counters. The engine fills it in the request's terminal (``GenDone.figures``,
``engine/request_state.py``) and it travels unchanged from there: to the host's ``Finished``
and the request's receipt (``runtime/receipts.py``: ``GET /api/runtime/requests/{id}/receipt``,
``generate --json``'s ``receipt`` record), to the numeric summaries of the request's terminal
events (``runtime/observations.py``; OTLP copies those onto its spans), and to the serving
plugins (``PluginReceipt.figures``, and the ``skippy_plugin_receipt_v1`` fields the C ABI has).
Every terminal path has a figures value: a request the engine never ended (rejected, ended
while queued, timed out on the host, its engine gone) has :data:`NO_FIGURES`.

:data:`FIGURES` is the table: per figure, its summary key, its key in the receipt document and
the plugin ABI field that carries it. Those names are contracts older than this type
(``batch_size``, ``time_to_first_token_ms``, ``speculative.proposed``, the C struct's
``queue_ms``), so they are mapped here, in one place, and never restated: the event producer,
the receipt, the API schema, the plugin wire and its readers all read this table. A figure
added to the type needs a row (the module refuses to import without one), and then reaches
every one of them.

Each figure is either a count (``int``, 0 when nothing was counted) or a measure
(``float | None``, None when it was not measured); nothing else.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Final, get_type_hints

from skippyctl.events.envelope import NumericSummary, SummaryKey


@dataclass(frozen=True, slots=True)
class GenerationFigures:
    """What the engine measured about one request (the module docstring says where it goes).

    Times are ms, rounded to µs; rates are tokens/s, rounded to 0.01. The engine's clock starts
    when the request reached it (``submitted``), so two waits have two names:

    - ``engine_wait_ms`` — **the engine's wait**: the request reached the engine → its prefill
      began (it waited for a free lane). The plugin ABI's ``queue_ms`` field carries it.
    - the receipt's ``queue_ms`` — **the host's queue**: the runtime received the request → it
      handed it to the engine (admission's queue), measured by the host, not a field here (the
      engine cannot see it): ``runtime/receipts.py`` keeps it beside the figures, with
      ``total_ms`` (received → terminal).
    """

    prompt_tokens: int = 0
    """Tokens of the prompt (after the chat template)."""
    reused_tokens: int = 0
    """Prompt tokens whose KV was already there (a session's or another request's prefix)."""
    generated_tokens: int = 0
    """Tokens generated, without an end-of-generation token."""
    engine_wait_ms: float | None = None
    """The request reached the engine → its prefill began; None if it never began."""
    prefill_ms: float | None = None
    """Prefill began → prefill ended (0 when the engine prefilled nothing)."""
    ttft_ms: float | None = None
    """The request reached the engine → its first sampled token; None if none was sampled."""
    decode_ms: float | None = None
    """First to last sampled token (0 with fewer than two)."""
    prefill_tokens_per_s: float | None = None
    """Prompt tokens prefilled (reuse excluded) over ``prefill_ms``; None when it is 0."""
    decode_tokens_per_s: float | None = None
    """The inter-token rate: tokens after the first over ``decode_ms``; None when it is 0."""
    shared_decode_steps: int = 0
    """This request's decode steps whose batch held another request too."""
    max_batch: int = 0
    """The most sequences in one of its batches."""
    spec_windows: int = 0
    """Decode steps in which it verified proposed tokens (``engine/speculation.py``)."""
    spec_proposed: int = 0
    """Proposed tokens it verified (every proposer)."""
    spec_accepted: int = 0
    """Of them committed: each saved a decode step."""
    spec_rejected: int = 0
    """``spec_proposed - spec_accepted``: their KV was dropped."""
    spec_late: int = 0
    """Plugin proposal queries answered after their deadline, dropped unused."""
    spec_discarded: int = 0
    """Run-ahead proposals dropped unexecuted after the window before them diverged."""

    @property
    def speculated(self) -> bool:
        """It verified proposals, or asked for some (a late answer, a discarded run-ahead)."""
        return bool(self.spec_windows or self.spec_late or self.spec_discarded)


NO_FIGURES: Final = GenerationFigures()
"""The figures of a request no engine ended: nothing counted, nothing measured."""


@dataclass(frozen=True, slots=True)
class Figure:
    """One row of :data:`FIGURES`: where one field of :class:`GenerationFigures` goes."""

    name: str
    """The field of :class:`GenerationFigures`."""
    summary: SummaryKey
    """Its key in the numeric summaries of the request's generation terminal (and, for a
    speculative figure, of ``speculation_summarized``)."""
    receipt: str
    """Its key in the receipt document (inside ``speculative`` for a speculative figure)."""
    plugin_abi: str | None
    """The ``skippy_plugin_receipt_v1`` field that carries it to C plugins, or None where the
    v1 struct has none (append-only: a new field needs an appended C field). Python plugins
    read every figure from ``PluginReceipt.figures``."""
    help: str
    """What it means, for people (the API schema's description)."""
    speculative: bool = False
    """A proposal figure: in the receipt's ``speculative`` object, and in the request's
    summaries only when it :attr:`~GenerationFigures.speculated`."""
    count: bool = False
    """An ``int`` count (else a ``float | None`` measure); set from the type, not by hand."""

    def number(self, figures: GenerationFigures) -> int | float:
        """This figure of ``figures`` as a plain number, NaN for a measure not taken: the form
        the binary layouts hold (the plugin wire, the C receipt struct)."""
        value: int | float | None = getattr(figures, self.name)
        return math.nan if value is None else value

    def from_number(self, number: int | float) -> int | float | None:
        """:meth:`number` read back (ValueError for a count that is not one)."""
        if self.count:
            return int(number)
        return None if math.isnan(number) else float(number)


_K = SummaryKey
_ROWS: Final = (
    Figure("prompt_tokens", _K.PROMPT_TOKENS, "prompt_tokens", "prompt_tokens", "Prompt tokens."),
    Figure(
        "reused_tokens",
        _K.REUSED_TOKENS,
        "reused_tokens",
        "reused_tokens",
        "Prompt tokens whose KV was already there (not prefilled).",
    ),
    Figure(
        "generated_tokens",
        _K.GENERATED_TOKENS,
        "generated_tokens",
        "generated_tokens",
        "Tokens generated, without an end-of-generation token.",
    ),
    Figure(
        "engine_wait_ms",
        _K.ENGINE_WAIT_MS,
        "engine_wait_ms",
        "queue_ms",
        "The engine's wait: the request reached the engine → its prefill began (null if it "
        "never did). Not `queue_ms`, the host's queue before it.",
    ),
    Figure("prefill_ms", _K.PREFILL_MS, "prefill_ms", "prefill_ms", "Prefill time."),
    Figure(
        "ttft_ms",
        _K.TIME_TO_FIRST_TOKEN_MS,
        "ttft_ms",
        "ttft_ms",
        "The request reached the engine → its first sampled token.",
    ),
    Figure("decode_ms", _K.DECODE_MS, "decode_ms", "decode_ms", "First to last sampled token."),
    Figure(
        "prefill_tokens_per_s",
        _K.PREFILL_TOKENS_PER_S,
        "prefill_tokens_per_s",
        None,
        "Prompt tokens prefilled (reuse excluded) per second of prefill.",
    ),
    Figure(
        "decode_tokens_per_s",
        _K.DECODE_TOKENS_PER_S,
        "decode_tokens_per_s",
        None,
        "The inter-token rate: tokens after the first per second of decode.",
    ),
    Figure(
        "shared_decode_steps",
        _K.SHARED_DECODE_STEPS,
        "shared_decode_steps",
        None,
        "Decode steps whose batch held another request too.",
    ),
    Figure(
        "max_batch", _K.BATCH_SIZE, "max_batch", None, "The most sequences in one of its batches."
    ),
    Figure(
        "spec_windows",
        _K.SPEC_WINDOWS,
        "windows",
        None,
        "Decode steps that verified proposed tokens.",
        speculative=True,
    ),
    Figure(
        "spec_proposed",
        _K.SPEC_PROPOSED_TOKENS,
        "proposed",
        "spec_proposed",
        "Proposed tokens verified.",
        speculative=True,
    ),
    Figure(
        "spec_accepted",
        _K.SPEC_ACCEPTED_TOKENS,
        "accepted",
        "spec_accepted",
        "Proposed tokens committed (each a decode step saved).",
        speculative=True,
    ),
    Figure(
        "spec_rejected",
        _K.SPEC_REJECTED_TOKENS,
        "rejected",
        "spec_rejected",
        "Proposed minus accepted: their KV was dropped.",
        speculative=True,
    ),
    Figure(
        "spec_late",
        _K.SPEC_LATE_QUERIES,
        "late",
        "spec_late",
        "Plugin proposal queries answered after their deadline, dropped unused.",
        speculative=True,
    ),
    Figure(
        "spec_discarded",
        _K.SPEC_DISCARDED_TOKENS,
        "discarded",
        "spec_discarded",
        "Run-ahead proposals dropped unexecuted after the window before them diverged.",
        speculative=True,
    ),
)


def _typed(rows: tuple[Figure, ...]) -> tuple[Figure, ...]:
    """The rows with ``count`` set from the type; TypeError at import for a field without a
    row (or a row without a field), a type that is neither kind, or a key used twice."""
    hints = get_type_hints(GenerationFigures)
    names = [f.name for f in dataclasses.fields(GenerationFigures)]
    if [row.name for row in rows] != names:
        raise TypeError("FIGURES must have one row per GenerationFigures field, in field order")
    for keys in (
        [row.summary for row in rows],
        [(row.speculative, row.receipt) for row in rows],
        [row.plugin_abi for row in rows if row.plugin_abi is not None],
    ):
        if len(keys) != len(set(keys)):
            raise TypeError("a FIGURES key is used twice")
    typed = []
    for row in rows:
        hint = hints[row.name]
        if hint not in (int, float | None):
            raise TypeError(f"{row.name}: a figure is an int count or a float | None measure")
        typed.append(dataclasses.replace(row, count=hint is int))
    return tuple(typed)


FIGURES: Final[tuple[Figure, ...]] = _typed(_ROWS)
"""Every figure, in :class:`GenerationFigures`' field order."""
SUMMARY_KEYS: Final[tuple[SummaryKey, ...]] = tuple(row.summary for row in FIGURES)
"""The summary keys that carry figures (a reader's list: OTLP's span numbers, for one)."""


def terminal_summaries(figures: GenerationFigures) -> tuple[NumericSummary, ...]:
    """The numeric summaries of a request's generation terminal: every measured figure;
    speculative ones only when the request :attr:`~GenerationFigures.speculated` (absent, not
    0, without speculation)."""
    speculated = figures.speculated
    found = []
    for row in FIGURES:
        value = getattr(figures, row.name)
        if value is not None and (speculated or not row.speculative):
            found.append(NumericSummary(row.summary, value))
    return tuple(found)


def speculation_summaries(figures: GenerationFigures) -> tuple[NumericSummary, ...]:
    """The numeric summaries of ``speculation_summarized``: the speculative figures."""
    return tuple(
        NumericSummary(row.summary, getattr(figures, row.name))
        for row in FIGURES
        if row.speculative
    )


def receipt_figures(figures: GenerationFigures, speculation_mode: str) -> dict[str, Any]:
    """The figures as the receipt document lays them out: each at its key, the speculative
    ones in ``speculative`` after its ``mode`` (the load's ``--spec``: ``off``, ``ngram`` …)."""
    document: dict[str, Any] = {}
    speculative: dict[str, Any] = {"mode": speculation_mode}
    for row in FIGURES:
        (speculative if row.speculative else document)[row.receipt] = getattr(figures, row.name)
    document["speculative"] = speculative
    return document
