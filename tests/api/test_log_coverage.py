"""Log-coverage evidence for retiring native log parsing (the spec's "Native Log Parser
Retirement"): a real runtime captures llama.cpp's raw log (``SKIPPY_CAPTURE_NATIVE_LOG=1``),
loads real fixture models, generates, and for every fact a log line tells an operator this
module checks that a structured event carried the same fact, comparing the figures.

Contract:

- Only this test reads log text. The regexes below are evidence, never a producer: nothing in
  ``skippyctl/`` parses a log line, and no event here is derived from one.
- The loads: ``tiny.gguf`` on the CPU, the 3-part split set, and ``tiny.gguf`` again with
  ``gpu_layers=99`` on a machine without a GPU (the CPU fallback). One lane of 256 tokens each,
  so every figure is deterministic.
- Every :class:`Fact` is either carried (its event ids must carry it, with the log's figure) or a
  known gap (``gap`` says why no event carries it). A carried fact that no event carries any more
  fails its test, and so does a gap that some event now carries: both need the table updated.
  ``absent`` facts are areas llama.cpp logs nothing for on this path; a line appearing fails.
- ``docs/LOG_COVERAGE.md`` is rendered from these results (between its markers) and the last
  test fails when the committed table differs. To regenerate it:

      SKIPPY_WRITE_LOG_COVERAGE=1 .venv/bin/pytest tests/api/test_log_coverage.py

Figures that vary between runs (free memory, timings) are never rendered.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from tests.api.conftest import Server, start_server, stop_server

DOC: Final = Path(__file__).resolve().parents[2] / "docs" / "LOG_COVERAGE.md"
WRITE_ENV: Final = "SKIPPY_WRITE_LOG_COVERAGE"
BEGIN: Final = "<!-- log-coverage:begin -->\n"
END: Final = "<!-- log-coverage:end -->"
CONTEXT_TOKENS: Final = 256
MIB: Final = 1 << 20
LOG_ROUNDING_MIB: Final = 0.005
"""llama.cpp prints buffer sizes in MiB with two decimals: each printed figure is off by at most
half a hundredth of a MiB."""

LOADS: Final[dict[str, tuple[str, dict[str, Any]]]] = {
    "tiny": ("tiny.gguf", {}),
    "split": ("tiny-split-00001-of-00003.gguf", {}),
    "gpu": ("tiny.gguf", {"gpu_layers": 99}),
}
"""Model id → (fixture file, extra load fields)."""

Event = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Run:
    """One model's evidence: its engine's raw log lines and its events."""

    model_id: str
    lines: tuple[str, ...]
    events: tuple[Event, ...]

    def matches(self, pattern: re.Pattern[str]) -> list[re.Match[str]]:
        return [m for m in map(pattern.search, self.lines) if m is not None]

    def of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e["kind"] in kinds]

    @property
    def load_events(self) -> list[Event]:
        """The events of the model's load (not of a request, not the log counter)."""
        return [
            e
            for e in self.events
            if "request_id" not in e["scope"] and e["kind"] != "native_log_summary"
        ]


@dataclass(frozen=True, slots=True)
class Finding:
    """What one fact's check found in one run: whether the log stated it, whether an event
    carried it (and which ids), and the comparison in words."""

    lines: int
    carried_by: tuple[str, ...]
    compared: str

    @property
    def carried(self) -> bool:
        return bool(self.carried_by)


@dataclass(frozen=True, slots=True)
class Evidence:
    """One fact over every run."""

    lines_seen: int
    carried_by: tuple[str, ...]
    compared: str
    uncarried: tuple[str, ...]
    """Runs whose log stated the fact without an event carrying it, or whose events stated it
    without a log line (a fallback the log does not show)."""

    @property
    def covered(self) -> bool:
        return self.lines_seen > 0 and not self.uncarried


Check = Callable[[Run], Finding | None]
"""A fact's check for one run: None when the run's log does not state the fact."""


@dataclass(frozen=True, slots=True)
class Fact:
    """One row: a fact of `area` that lines matching `pattern` state. Carried facts name the
    `event_ids` that must carry it; a `gap` says why no event does; an `absent` fact is one
    llama.cpp logs no line for on this path."""

    area: str
    name: str
    pattern: re.Pattern[str]
    check: Check
    event_ids: tuple[str, ...] = ()
    gap: str | None = None
    absent: bool = False

    @property
    def key(self) -> str:
        return f"{self.area}: {self.name}"


# ---- reading events ----


def _value(event: Event, key: str) -> Any:
    return next((s["value"] for s in event.get("numeric_summaries", []) if s["key"] == key), None)


def _state(event: Event) -> Any:
    return event.get("state", {}).get("current")


def _device(event: Event) -> Any:
    return event["scope"].get("device_id")


_NOT_FACTS: Final = frozenset({"summary", "ts", "kind", "category", "producer", "severity"})


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in _NOT_FACTS:
                yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _carrying_string(run: Run, text: str) -> tuple[str, ...]:
    """Load events with a structured string field equal to `text` (case-insensitive)."""
    wanted = text.casefold()
    return _ids(e for e in run.load_events if any(s.casefold() == wanted for s in _strings(e)))


def _carrying_number(
    run: Run, value: float, keys: tuple[str, ...] | None = None
) -> tuple[str, ...]:
    """Load events with a numeric summary equal to `value` (under one of `keys` if given)."""
    return _ids(
        e
        for e in run.load_events
        if any(
            (keys is None or s["key"] in keys) and s["value"] == value
            for s in e.get("numeric_summaries", [])
        )
    )


def _ids(events: Iterable[Event]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e["kind"] for e in events))


def _near_mib(mib: float, value: Any, terms: int = 1) -> bool:
    """`value` bytes are the printed `mib` (a sum of `terms` printed figures)."""
    return isinstance(value, int) and abs(value / MIB - mib) <= terms * LOG_ROUNDING_MIB + 1e-9


def _host_device(buffer: str) -> str:
    """A buffer type's device: ``CPU``, ``CPU_Mapped``, ``CPU_REPACK`` and pinned host buffers
    (``CUDA_Host``) hold host memory (native/backends.py's HOST_DEVICE); others name theirs."""
    if buffer.startswith("CPU") or buffer.endswith("_Host"):
        return "CPU"
    return buffer.split("_", 1)[0]


# ---- the facts: file open, architecture, tokenizer ----

FILE_OPEN: Final = re.compile(
    r"^llama_model_loader: loaded meta data with \d+ key-value pairs and (\d+) tensors from "
)


def _file_open(run: Run) -> Finding | None:
    opens = run.matches(FILE_OPEN)
    if not opens:
        return None
    started = run.of("model_load_started")
    completed = [e for e in run.of("native_model_load_completed") if e.get("outcome") == "success"]
    ok = len(opens) == 1 and len(started) == 1 and len(completed) == 1
    return Finding(
        len(opens),
        _ids(started + completed) if ok else (),
        f"{len(opens)} open ↔ model_load_started ×{len(started)}, "
        f"native_model_load_completed ×{len(completed)}",
    )


SPLIT_PARTS: Final = re.compile(r"^llama_model_loader: additional (\d+) GGUFs metadata loaded")


def _split_parts(run: Run) -> Finding | None:
    found = run.matches(SPLIT_PARTS)
    if not found:
        return None
    parts = 1 + int(found[0].group(1))
    events = run.of("native_model_load_completed")
    files = _value(events[0], "files") if events else None
    carried = _ids(events) if files == parts else ()
    return Finding(len(found), carried, f"{parts} files ↔ files {files}")


FILE_SIZE: Final = re.compile(r"^print_info: file size\s+=\s+([\d.]+) MiB")


def _file_size(run: Run) -> Finding | None:
    found = run.matches(FILE_SIZE)
    if not found:
        return None
    mib = float(found[0].group(1))
    events = run.of("native_model_load_completed")
    size = _value(events[0], "model_size_bytes") if events else None
    carried = _ids(events) if _near_mib(mib, size) else ()
    return Finding(len(found), carried, f"{mib:.2f} MiB ↔ model_size_bytes {size}")


TENSOR_COUNT: Final = FILE_OPEN


def _tensor_count(run: Run) -> Finding | None:
    found = run.matches(TENSOR_COUNT)
    if not found:
        return None
    tensors = int(found[0].group(1))
    return Finding(len(found), _carrying_number(run, tensors), f"{tensors} tensors")


ARCH: Final = re.compile(r"^print_info: arch\s+=\s+(\S+)")
FILE_TYPE: Final = re.compile(r"^print_info: file type\s+=\s+(\S+)")
KV_TYPES: Final = re.compile(r"^llama_kv_cache: size = .*, K \((\w+)\):.*, V \((\w+)\):")
BUFFER_FALLBACK: Final = re.compile(
    r"cannot be used with preferred buffer type (\S+), using \S+ instead"
)
"""The preferred type is the fact (the one used instead, ``CPU``, is also a device id)."""


def _named(pattern: re.Pattern[str], what: str, groups: tuple[int, ...] = (1,)) -> Check:
    """A fact that is a name (an architecture, a tensor type), in the pattern's `groups`:
    carried when a load event has it as a structured string field."""

    def check(run: Run) -> Finding | None:
        found = run.matches(pattern)
        if not found:
            return None
        names = sorted({m.group(g) for m in found for g in groups})
        carried = tuple(dict.fromkeys(i for name in names for i in _carrying_string(run, name)))
        return Finding(len(found), carried, f"{what} {', '.join(names)}")

    return check


PARAMS: Final = re.compile(r"^print_info: model params\s+=\s+([\d.]+) ([KMBT]?)")
_SCALE: Final = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def _params(run: Run) -> Finding | None:
    found = run.matches(PARAMS)
    if not found:
        return None
    figure, unit = float(found[0].group(1)), found[0].group(2)
    events = run.of("native_model_load_completed")
    count = _value(events[0], "parameters") if events else None
    scale = _SCALE[unit]
    near = isinstance(count, int) and abs(count - figure * scale) <= 0.005 * scale
    return Finding(
        len(found), _ids(events) if near else (), f"{figure} {unit} ↔ parameters {count}"
    )


def _returned(pattern: re.Pattern[str], what: str, event_id: str, key: str) -> Check:
    """A fact that is one number llama.cpp returns to the engine (a model's or a context's
    getter): carried when `event_id`, made from that return, has the log's figure as `key`."""

    def check(run: Run) -> Finding | None:
        found = run.matches(pattern)
        if not found:
            return None
        logged = int(found[0].group(1))
        events = run.of(event_id)
        value = _value(events[0], key) if events else None
        carried = _ids(events) if value == logged else ()
        return Finding(len(found), carried, f"{what} {logged} ↔ {key} {value}")

    return check


N_LAYER: Final = re.compile(r"^print_info: n_layer\s+=\s+(\d+)")
N_CTX_TRAIN: Final = re.compile(r"^print_info: n_ctx_train\s+=\s+(\d+)")
N_VOCAB: Final = re.compile(r"^print_info: n_vocab\s+=\s+(\d+)")
N_BATCH: Final = re.compile(r"^llama_context: n_batch\s+=\s+(\d+)")

# ---- tensor loading, offload/device ----

TENSORS_LOADING: Final = re.compile(r"^load_tensors: loading model tensors")


def _tensors_loaded(run: Run) -> Finding | None:
    found = run.matches(TENSORS_LOADING)
    if not found:
        return None
    progress = run.of("model_load_progress")
    last = progress[-1].get("progress", {}) if progress else {}
    done = bool(last) and last.get("current") == last.get("total")
    phase = [e for e in run.of("model_load_phase_changed") if _state(e) == "weights loaded"]
    carried = _ids(progress[-1:] + phase) if done and phase else ()
    return Finding(
        len(found),
        carried,
        f"tensors loaded ↔ progress {last.get('current')}/{last.get('total')} "
        f"{last.get('unit')}, phase `weights loaded` ×{len(phase)}",
    )


LAYER_DEVICE: Final = re.compile(r"^load_tensors: layer\s+\d+ assigned to device (\w+)")
DEVICE_EVENTS: Final = ("device_selected", "backend_device_selected")


def _layer_device(run: Run) -> Finding | None:
    found = run.matches(LAYER_DEVICE)
    if not found:
        return None
    logged = sorted({m.group(1) for m in found})
    events = run.of(*DEVICE_EVENTS)
    selected = sorted({_device(e) for e in events})
    carried = _ids(events) if logged == selected and len(_ids(events)) == 2 else ()
    return Finding(len(found), carried, f"layers on {', '.join(logged)} ↔ device_id {selected}")


OFFLOADED: Final = re.compile(r"^load_tensors: offloaded (\d+)/(\d+) layers to GPU")


def _offloaded(run: Run) -> Finding | None:
    found = run.matches(OFFLOADED)
    if not found:
        return None
    done, total = int(found[0].group(1)), int(found[0].group(2))
    # Not `layers`: that is the model's n_layer (native_model_load_completed), not an offload.
    carried = _carrying_number(run, done, ("gpu_layers", "layer_count"))
    return Finding(len(found), carried, f"{done}/{total} layers")


def _cpu_fallback(run: Run) -> Finding | None:
    """llama.cpp logs "offloaded N/M layers to GPU" even with no GPU while every layer is
    assigned to the CPU: that is the fallback. Either way the events must agree."""
    found = run.matches(OFFLOADED)
    devices = {m.group(1) for m in run.matches(LAYER_DEVICE)}
    if not found:
        return None
    wanted = int(found[0].group(1)) > 0
    fell_back = wanted and devices == {"CPU"}
    events = run.of("cpu_fallback_activated", "fallback_applied")
    on_cpu = all(
        _device(e) == "CPU" and e.get("reason_code") == "device_unavailable" for e in events
    )
    gpu_layers = sorted({_value(e, "gpu_layers") for e in events})
    if fell_back:
        carried = _ids(events) if len(_ids(events)) == 2 and on_cpu else ()
        return Finding(1, carried, f"asked offload, layers on CPU ↔ gpu_layers {gpu_layers}")
    # Fallback events without a fallback in the log: a fact the log does not state.
    return Finding(0, (), "unexplained fallback events") if events else None


# ---- memory buffers, KV cache, context ----

MODEL_BUFFER: Final = re.compile(r"^load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
KV_BUFFER: Final = re.compile(r"^llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB")
COMPUTE_BUFFER: Final = re.compile(r"^sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")
MEMORY_EVENTS: Final = ("model_memory_allocation_summary", "resource_allocation_completed")


def _buffers(pattern: re.Pattern[str], key: str) -> Check:
    """Buffer sizes llama.cpp prints per buffer type, summed per device, against the `key`
    bytes of that device's memory events (both ids must agree)."""

    def check(run: Run) -> Finding | None:
        found = run.matches(pattern)
        if not found:
            return None
        per_device: dict[str, list[float]] = {}
        for m in found:
            per_device.setdefault(_host_device(m.group(1)), []).append(float(m.group(2)))
        events = run.of(*MEMORY_EVENTS)
        parts = []
        ok = bool(events)
        for device, figures in sorted(per_device.items()):
            on_device = [e for e in events if _device(e) == device]
            values = {_value(e, key) for e in on_device}
            value = next(iter(values)) if len(values) == 1 else None
            ok = ok and len(_ids(on_device)) == 2 and _near_mib(sum(figures), value, len(figures))
            printed = "+".join(f"{f:.2f}" for f in figures)
            parts.append(f"{device} {printed} MiB ↔ {key} {value}")
        return Finding(len(found), _ids(events) if ok else (), "; ".join(parts))

    return check


KV_CELLS: Final = re.compile(
    r"^llama_kv_cache: size =\s+[\d.]+ MiB \(\s*(\d+) cells,\s+\d+ layers,\s+\d+/(\d+) seqs\)"
)


def _kv_cells(run: Run) -> Finding | None:
    found = run.matches(KV_CELLS)
    if not found:
        return None
    cells, seqs = int(found[0].group(1)), int(found[0].group(2))
    kv = run.of("kv_cache_initialization_completed")
    serving = run.of("serving_backend_initialization_completed")
    total = _value(kv[0], "kv_cells_total") if kv else None
    lanes = _value(serving[0], "lanes") if serving else None
    ok = total == cells and lanes == seqs
    return Finding(
        len(found),
        _ids(kv + serving) if ok else (),
        f"{cells} cells, {seqs} seqs ↔ kv_cells_total {total}, lanes {lanes}",
    )


def _context(pattern: re.Pattern[str], key: str) -> Check:
    def check(run: Run) -> Finding | None:
        found = run.matches(pattern)
        if not found:
            return None
        logged = int(found[0].group(1))
        events = run.of("serving_backend_initialization_completed", "model_available")
        values = sorted({_value(e, key) for e in events}, key=str)
        ok = len(_ids(events)) == 2 and values == [logged]
        return Finding(len(found), _ids(events) if ok else (), f"{logged} ↔ {key} {values}")

    return check


N_CTX: Final = re.compile(r"^llama_context: n_ctx\s+=\s+(\d+)")
N_CTX_SEQ: Final = re.compile(r"^llama_context: n_ctx_seq\s+=\s+(\d+)")
N_SEQ_MAX: Final = re.compile(r"^llama_context: n_seq_max\s+=\s+(\d+)")

# ---- warm-up, warnings ----

GRAPH_RESERVE: Final = re.compile(r"^(?:sched|graph)_reserve: reserv")


def _graph_reserved(run: Run) -> Finding | None:
    found = run.matches(GRAPH_RESERVE)
    if not found:
        return None
    phases = [_state(e) for e in run.of("model_load_phase_changed")]
    want = ["allocating ctx", "context ready"]
    ordered = [p for p in phases if p in want] == want
    return Finding(
        len(found),
        ("model_load_phase_changed",) if ordered else (),
        f"graph reserved ↔ phases {' → '.join(p for p in phases if p in want)}",
    )


WARM_UP: Final = re.compile(r"(?i)warm(?:ing)?[ _-]?up")


def _warm_up(run: Run) -> Finding | None:
    found = run.matches(WARM_UP)
    return Finding(len(found), (), "no warm-up line") if found else None


CTX_BELOW_TRAIN: Final = re.compile(r"n_ctx_seq \((\d+)\) < n_ctx_train \((\d+)\)")


CTX_BELOW_TRAIN_EVENTS: Final = (
    "native_model_load_completed",
    "serving_backend_initialization_completed",
)


def _ctx_below_train(run: Run) -> Finding | None:
    """llama.cpp warns whenever a sequence's context is below the training context: the
    events' `context_tokens_per_lane` and `context_train_tokens` must say the same, and events
    that say it without the warning are a fact the log does not state."""
    found = run.matches(CTX_BELOW_TRAIN)
    model = run.of(CTX_BELOW_TRAIN_EVENTS[0])
    serving = run.of(CTX_BELOW_TRAIN_EVENTS[1])
    train = _value(model[0], "context_train_tokens") if model else None
    per_lane = _value(serving[0], "context_tokens_per_lane") if serving else None
    below = train is not None and per_lane is not None and per_lane < train
    if not found:
        return Finding(0, (), f"{per_lane} < {train} without a warning") if below else None
    logged_seq, logged_train = int(found[0].group(1)), int(found[0].group(2))
    ok = below and (per_lane, train) == (logged_seq, logged_train)
    return Finding(
        len(found),
        _ids(model + serving) if ok else (),
        f"{logged_seq} < {logged_train} ↔ context_tokens_per_lane {per_lane}, "
        f"context_train_tokens {train}",
    )


FACTS: Final[tuple[Fact, ...]] = (
    Fact(
        "file open",
        "model file opened",
        FILE_OPEN,
        _file_open,
        ("model_load_started", "native_model_load_completed"),
    ),
    Fact(
        "file open",
        "model size",
        FILE_SIZE,
        _file_size,
        ("native_model_load_completed",),
    ),
    Fact(
        "file open",
        "split set: files opened",
        SPLIT_PARTS,
        _split_parts,
        ("native_model_load_completed",),
    ),
    Fact(
        "architecture",
        "architecture name",
        ARCH,
        _named(ARCH, "arch"),
        gap="a name (`general.architecture`): events carry no free text by design, only "
        "numeric summaries under closed keys and enum values",
    ),
    Fact(
        "architecture",
        "file type (quantization)",
        FILE_TYPE,
        _named(FILE_TYPE, "type"),
        gap="a type name: events carry no free text by design (llama.h's "
        "`llama_model_ftype` is a number, but no summary key or published vocabulary of "
        "its values exists yet)",
    ),
    Fact(
        "architecture",
        "parameters",
        PARAMS,
        _params,
        ("native_model_load_completed",),
    ),
    Fact(
        "architecture",
        "layers",
        N_LAYER,
        _returned(N_LAYER, "n_layer", "native_model_load_completed", "layers"),
        ("native_model_load_completed",),
    ),
    Fact(
        "architecture",
        "training context",
        N_CTX_TRAIN,
        _returned(
            N_CTX_TRAIN, "n_ctx_train", "native_model_load_completed", "context_train_tokens"
        ),
        ("native_model_load_completed",),
    ),
    Fact(
        "tokenizer/vocab",
        "vocabulary size",
        N_VOCAB,
        _returned(N_VOCAB, "n_vocab", "native_model_load_completed", "vocab_size"),
        ("native_model_load_completed",),
    ),
    Fact(
        "tensor loading",
        "tensors loaded",
        TENSORS_LOADING,
        _tensors_loaded,
        ("model_load_progress", "model_load_phase_changed"),
    ),
    Fact(
        "tensor loading",
        "tensor count",
        TENSOR_COUNT,
        _tensor_count,
        gap="llama.h has no tensor count (a split set's `split.tensors.count` metadata is "
        "the only one, and a single file has none)",
    ),
    Fact(
        "offload/device",
        "device the layers are on",
        LAYER_DEVICE,
        _layer_device,
        DEVICE_EVENTS,
    ),
    Fact(
        "offload/device",
        "layers offloaded",
        OFFLOADED,
        _offloaded,
        gap="llama.h reports no applied offload, and the logged N is min(`n_gpu_layers`, "
        "n_layer + 1) of n_layer + 1, printed with or without a GPU (`gpu` logs 3/3 with "
        "every layer on the CPU), so an event could only restate the request. Where the "
        "layers are is `device_selected`, a fallback's request `gpu_layers` of "
        "`cpu_fallback_activated`, n_layer `layers`",
    ),
    Fact(
        "memory buffers",
        "model (weights) buffers",
        MODEL_BUFFER,
        _buffers(MODEL_BUFFER, "weights_bytes"),
        MEMORY_EVENTS,
    ),
    Fact(
        "memory buffers",
        "compute buffers",
        COMPUTE_BUFFER,
        _buffers(COMPUTE_BUFFER, "compute_bytes"),
        MEMORY_EVENTS,
    ),
    Fact("KV cache", "KV buffers", KV_BUFFER, _buffers(KV_BUFFER, "kv_bytes"), MEMORY_EVENTS),
    Fact(
        "KV cache",
        "KV cells and sequences",
        KV_CELLS,
        _kv_cells,
        ("kv_cache_initialization_completed", "serving_backend_initialization_completed"),
    ),
    Fact(
        "KV cache",
        "KV cache types",
        KV_TYPES,
        _named(KV_TYPES, "K/V", (1, 2)),
        gap="type names: events carry no free text by design",
    ),
    Fact(
        "context",
        "context size",
        N_CTX,
        _context(N_CTX, "context_tokens"),
        ("serving_backend_initialization_completed", "model_available"),
    ),
    Fact(
        "context",
        "context per sequence",
        N_CTX_SEQ,
        _context(N_CTX_SEQ, "context_tokens_per_lane"),
        ("serving_backend_initialization_completed", "model_available"),
    ),
    Fact(
        "context",
        "sequences (lanes)",
        N_SEQ_MAX,
        _context(N_SEQ_MAX, "lanes"),
        ("serving_backend_initialization_completed", "model_available"),
    ),
    Fact(
        "context",
        "batch size",
        N_BATCH,
        _returned(N_BATCH, "n_batch", "serving_backend_initialization_completed", "batch_tokens"),
        ("serving_backend_initialization_completed",),
    ),
    Fact(
        "warm-up",
        "graph reservation",
        GRAPH_RESERVE,
        _graph_reserved,
        ("model_load_phase_changed",),
    ),
    Fact(
        "warm-up",
        "warm-up run",
        WARM_UP,
        _warm_up,
        absent=True,
    ),
    Fact(
        "warnings/fallbacks",
        "CPU fallback for GPU layers",
        OFFLOADED,
        _cpu_fallback,
        ("cpu_fallback_activated", "fallback_applied"),
    ),
    Fact(
        "warnings/fallbacks",
        "buffer type fallback",
        BUFFER_FALLBACK,
        _named(BUFFER_FALLBACK, "preferred buffer type"),
        gap="a buffer type name, per tensor: llama.h reports no buffer type choice and events "
        "carry no free text by design (the bytes each device holds are in "
        "`model_memory_allocation_summary`)",
    ),
    Fact(
        "warnings/fallbacks",
        "context below training context",
        CTX_BELOW_TRAIN,
        _ctx_below_train,
        CTX_BELOW_TRAIN_EVENTS,
    ),
)


# ---- the run ----


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, fixture_dir: Path) -> dict[str, Run]:
    server = start_server(
        tmp_path_factory.mktemp("log-coverage"), env={"SKIPPY_CAPTURE_NATIVE_LOG": "1"}
    )
    try:
        return _collect(server, fixture_dir)
    finally:
        stop_server(server)


def _collect(server: Server, fixture_dir: Path) -> dict[str, Run]:
    for model_id, (name, extra) in LOADS.items():
        answer = server.load(
            fixture_dir / name, alias=model_id, lanes=1, ctx=CONTEXT_TOKENS, **extra
        )
        assert answer["state"] == "available", answer
    with server.http() as http:
        for model_id in LOADS:
            body = {"model": model_id, "prompt": "a b", "max_tokens": 4, "temperature": 0}
            assert http.post("/v1/completions", json=body).status_code == 200
        log = http.get("/api/runtime/diagnostics/native-log", params={"limit": 4096}).json()
    events = server.events()
    lines = {engine["model_id"]: engine for engine in log["engines"]}
    assert set(lines) == set(LOADS), lines.keys()
    runs = {}
    for model_id in LOADS:
        engine = lines[model_id]
        # The whole log from the first line: a ring that dropped the start would hide facts.
        assert engine["cut"] == 0 and engine["lines"][0].startswith("llama_model_loader:")
        mine = tuple(e for e in events if e["scope"].get("model_id") == model_id)
        runs[model_id] = Run(model_id, tuple(engine["lines"]), mine)
    return runs


def _evidence(fact: Fact, runs: dict[str, Run]) -> Evidence:
    findings = {model_id: fact.check(run) for model_id, run in runs.items()}
    stated = {m: f for m, f in findings.items() if f is not None and f.lines > 0}
    by_text: dict[str, list[str]] = {}
    for model_id, finding in stated.items():
        by_text.setdefault(finding.compared, []).append(model_id)
    compared = "; ".join(f"{text} ({', '.join(ids)})" for text, ids in by_text.items())
    carried = tuple(dict.fromkeys(i for f in stated.values() for i in f.carried_by))
    uncarried = tuple(m for m, f in stated.items() if not f.carried)
    unexpected = tuple(m for m, f in findings.items() if f is not None and f.lines == 0)
    return Evidence(
        sum(f.lines for f in stated.values()), carried, compared, uncarried + unexpected
    )


@pytest.fixture(scope="module")
def results(runs: dict[str, Run]) -> dict[str, Evidence]:
    return {fact.key: _evidence(fact, runs) for fact in FACTS}


@pytest.mark.parametrize("fact", FACTS, ids=lambda fact: fact.key)
def test_each_logged_fact_is_carried_by_a_structured_event(
    fact: Fact, results: dict[str, Evidence]
) -> None:
    evidence = results[fact.key]
    if fact.absent:
        assert evidence.lines_seen == 0, f"llama.cpp now logs {fact.key}: give it an event"
        return
    assert evidence.lines_seen > 0, f"no log line states {fact.key} any more: {fact.pattern}"
    if fact.gap is None:
        assert evidence.covered, f"no event carries {fact.key} any more: {evidence}"
        assert set(evidence.carried_by) <= set(fact.event_ids), evidence
    else:
        assert not evidence.carried_by, (
            f"{fact.key} is carried now ({evidence.carried_by}): drop its gap, name its "
            f"event ids and regenerate docs/LOG_COVERAGE.md"
        )


def test_the_fallback_load_is_the_only_one_with_fallback_events(runs: dict[str, Run]) -> None:
    fallbacks = {m for m, run in runs.items() if run.of("cpu_fallback_activated")}
    assert fallbacks == {"gpu"}


@pytest.mark.parametrize(
    "fact", [f for f in FACTS if f.gap is None and not f.absent], ids=lambda fact: fact.key
)
def test_a_fact_is_uncovered_once_its_events_are_gone(fact: Fact, runs: dict[str, Run]) -> None:
    """The checks can fail: the same run without the fact's event ids covers nothing."""
    stripped = {
        model_id: Run(
            model_id, run.lines, tuple(e for e in run.events if e["kind"] not in fact.event_ids)
        )
        for model_id, run in runs.items()
    }
    assert not _evidence(fact, stripped).covered


# ---- the document ----


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(results: dict[str, Evidence]) -> str:
    rows = [
        "| area | fact | log line pattern | lines seen | event id(s) | compared | covered |",
        "|---|---|---|---:|---|---|---|",
    ]
    for fact in FACTS:
        evidence = results[fact.key]
        if fact.absent:
            ids, covered = "none needed", "n/a (no line)"
        elif fact.gap is not None:
            ids, covered = f"none: {fact.gap}", "**no**"
        else:
            ids = ", ".join(f"`{i}`" for i in fact.event_ids)
            covered = "yes" if evidence.covered else "**no**"
        cells = (
            fact.area,
            fact.name,
            f"`{fact.pattern.pattern}`",
            str(evidence.lines_seen),
            ids,
            evidence.compared or "—",
            covered,
        )
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    gaps = [f for f in FACTS if f.gap is not None]
    rows += ["", f"Not covered: {len(gaps)} of {len(FACTS)} facts.", ""]
    rows += [f"- {fact.area}, {fact.name}: {fact.gap}." for fact in gaps]
    return "\n".join(rows) + "\n"


def test_docs_log_coverage_is_the_table_of_this_run(results: dict[str, Evidence]) -> None:
    """Regenerate with ``SKIPPY_WRITE_LOG_COVERAGE=1 .venv/bin/pytest
    tests/api/test_log_coverage.py`` after a change to the facts or to llama.cpp."""
    text = DOC.read_text(encoding="utf-8")
    found = re.search(re.escape(BEGIN) + r"(.*?)" + re.escape(END), text, re.S)
    assert found is not None, "docs/LOG_COVERAGE.md lost its markers"
    table = markdown_table(results)
    if os.environ.get(WRITE_ENV) == "1":
        DOC.write_text(text[: found.start(1)] + table + text[found.end(1) :], encoding="utf-8")
        return
    assert found.group(1) == table, f"stale: regenerate with {WRITE_ENV}=1 (see its docstring)"
