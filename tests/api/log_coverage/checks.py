"""The log line patterns of the log-coverage tests and each fact's check: for one run, whether
its llama.cpp log states the fact (None when it does not) and whether its events carry it, with
the figures compared. The patterns are test-side evidence only (package docstring)."""

from __future__ import annotations

import re
from typing import Final

from tests.api.log_coverage.evidence import (
    Check,
    Finding,
    Run,
    carrying_number,
    carrying_string,
    device_of,
    device_of_buffer_type,
    is_extra_buffer_type,
    kinds_of,
    near_mib,
    state_of,
    summary_value,
)

FILE_OPEN: Final = re.compile(
    r"^llama_model_loader: loaded meta data with \d+ key-value pairs and (\d+) tensors from "
)


def check_file_open(run: Run) -> Finding | None:
    opens = run.matches(FILE_OPEN)
    if not opens:
        return None
    started = run.of("model_load_started")
    completed = [e for e in run.of("native_model_load_completed") if e.get("outcome") == "success"]
    ok = len(opens) == 1 and len(started) == 1 and len(completed) == 1
    return Finding(
        len(opens),
        kinds_of(started + completed) if ok else (),
        f"{len(opens)} open ↔ model_load_started ×{len(started)}, "
        f"native_model_load_completed ×{len(completed)}",
    )


SPLIT_PARTS: Final = re.compile(r"^llama_model_loader: additional (\d+) GGUFs metadata loaded")


def check_split_parts(run: Run) -> Finding | None:
    found = run.matches(SPLIT_PARTS)
    if not found:
        return None
    parts = 1 + int(found[0].group(1))
    events = run.of("native_model_load_completed")
    files = summary_value(events[0], "files") if events else None
    carried = kinds_of(events) if files == parts else ()
    return Finding(len(found), carried, f"{parts} files ↔ files {files}")


FILE_SIZE: Final = re.compile(r"^print_info: file size\s+=\s+([\d.]+) MiB")


def check_file_size(run: Run) -> Finding | None:
    found = run.matches(FILE_SIZE)
    if not found:
        return None
    mib = float(found[0].group(1))
    events = run.of("native_model_load_completed")
    size = summary_value(events[0], "model_size_bytes") if events else None
    carried = kinds_of(events) if near_mib(mib, size) else ()
    return Finding(len(found), carried, f"{mib:.2f} MiB ↔ model_size_bytes {size}")


TENSOR_COUNT: Final = FILE_OPEN


def check_tensor_count(run: Run) -> Finding | None:
    found = run.matches(TENSOR_COUNT)
    if not found:
        return None
    tensors = int(found[0].group(1))
    return Finding(len(found), carrying_number(run, tensors), f"{tensors} tensors")


ARCH: Final = re.compile(r"^print_info: arch\s+=\s+(\S+)")
FILE_TYPE: Final = re.compile(r"^print_info: file type\s+=\s+(\S+)")
KV_TYPES: Final = re.compile(r"^llama_kv_cache: size = .*, K \((\w+)\):.*, V \((\w+)\):")
BUFFER_FALLBACK: Final = re.compile(
    r"cannot be used with preferred buffer type (\S+), using \S+ instead"
)
"""The preferred type is the fact (the one used instead, ``CPU``, is also a device id)."""


def check_named(pattern: re.Pattern[str], what: str, groups: tuple[int, ...] = (1,)) -> Check:
    """A fact that is a name (an architecture, a tensor type), in the pattern's `groups`:
    carried when a load event has it as a structured string field."""

    def check(run: Run) -> Finding | None:
        found = run.matches(pattern)
        if not found:
            return None
        names = sorted({m.group(g) for m in found for g in groups})
        carried = tuple(dict.fromkeys(i for name in names for i in carrying_string(run, name)))
        return Finding(len(found), carried, f"{what} {', '.join(names)}")

    return check


PARAMS: Final = re.compile(r"^print_info: model params\s+=\s+([\d.]+) ([KMBT]?)")
_SCALE: Final = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def check_params(run: Run) -> Finding | None:
    found = run.matches(PARAMS)
    if not found:
        return None
    figure, unit = float(found[0].group(1)), found[0].group(2)
    events = run.of("native_model_load_completed")
    count = summary_value(events[0], "parameters") if events else None
    scale = _SCALE[unit]
    near = isinstance(count, int) and abs(count - figure * scale) <= 0.005 * scale
    return Finding(
        len(found), kinds_of(events) if near else (), f"{figure} {unit} ↔ parameters {count}"
    )


def check_returned(pattern: re.Pattern[str], what: str, event_id: str, key: str) -> Check:
    """A fact that is one number llama.cpp returns to the engine (a model's or a context's
    getter): carried when `event_id`, made from that return, has the log's figure as `key`."""

    def check(run: Run) -> Finding | None:
        found = run.matches(pattern)
        if not found:
            return None
        logged = int(found[0].group(1))
        events = run.of(event_id)
        value = summary_value(events[0], key) if events else None
        carried = kinds_of(events) if value == logged else ()
        return Finding(len(found), carried, f"{what} {logged} ↔ {key} {value}")

    return check


N_LAYER: Final = re.compile(r"^print_info: n_layer\s+=\s+(\d+)")
N_CTX_TRAIN: Final = re.compile(r"^print_info: n_ctx_train\s+=\s+(\d+)")
N_VOCAB: Final = re.compile(r"^print_info: n_vocab\s+=\s+(\d+)")
N_BATCH: Final = re.compile(r"^llama_context: n_batch\s+=\s+(\d+)")
FLASH_ATTN: Final = re.compile(r"^llama_context: flash_attn\s+=\s+(\w+)")
FLASH_ATTN_LOGGED: Final = {"enabled": 1, "disabled": 0}


def check_flash_attention(run: Run) -> Finding | None:
    """The context's flash attention as llama.cpp logs it (``enabled``/``disabled``) ↔
    ``flash_attention`` 1/0; ``auto`` (llama.cpp decides later, on a GPU) is carried by
    nothing."""
    found = run.matches(FLASH_ATTN)
    if not found:
        return None
    logged = found[0].group(1)
    expected = FLASH_ATTN_LOGGED.get(logged)
    events = run.of("serving_backend_initialization_completed")
    value = summary_value(events[0], "flash_attention") if events else None
    carried = kinds_of(events) if expected is not None and value == expected else ()
    return Finding(len(found), carried, f"flash_attn {logged} ↔ flash_attention {value}")


TENSORS_LOADING: Final = re.compile(r"^load_tensors: loading model tensors")


def check_tensors_loaded(run: Run) -> Finding | None:
    found = run.matches(TENSORS_LOADING)
    if not found:
        return None
    progress = run.of("model_load_progress")
    last = progress[-1].get("progress", {}) if progress else {}
    done = bool(last) and last.get("current") == last.get("total")
    phase = [e for e in run.of("model_load_phase_changed") if state_of(e) == "weights loaded"]
    carried = kinds_of(progress[-1:] + phase) if done and phase else ()
    return Finding(
        len(found),
        carried,
        f"tensors loaded ↔ progress {last.get('current')}/{last.get('total')} "
        f"{last.get('unit')}, phase `weights loaded` ×{len(phase)}",
    )


LAYER_DEVICE: Final = re.compile(r"^load_tensors: layer\s+\d+ assigned to device (\w+)")
DEVICE_EVENTS: Final = ("device_selected", "backend_device_selected")


def check_layer_device(run: Run) -> Finding | None:
    found = run.matches(LAYER_DEVICE)
    if not found:
        return None
    logged = sorted({m.group(1) for m in found})
    events = run.of(*DEVICE_EVENTS)
    selected = sorted({device_of(e) for e in events})
    carried = kinds_of(events) if logged == selected and len(kinds_of(events)) == 2 else ()
    return Finding(len(found), carried, f"layers on {', '.join(logged)} ↔ device_id {selected}")


OFFLOADED: Final = re.compile(r"^load_tensors: offloaded (\d+)/(\d+) layers to GPU")


def check_offloaded(run: Run) -> Finding | None:
    found = run.matches(OFFLOADED)
    if not found:
        return None
    done, total = int(found[0].group(1)), int(found[0].group(2))
    # Not `layers`: that is the model's n_layer (native_model_load_completed), not an offload.
    carried = carrying_number(run, done, ("gpu_layers", "layer_count"))
    return Finding(len(found), carried, f"{done}/{total} layers")


def check_cpu_fallback(run: Run) -> Finding | None:
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
        device_of(e) == "CPU" and e.get("reason_code") == "device_unavailable" for e in events
    )
    gpu_layers = sorted({summary_value(e, "gpu_layers") for e in events})
    if fell_back:
        carried = kinds_of(events) if len(kinds_of(events)) == 2 and on_cpu else ()
        return Finding(1, carried, f"asked offload, layers on CPU ↔ gpu_layers {gpu_layers}")
    # Fallback events without a fallback in the log: a fact the log does not state.
    return Finding(0, (), "unexplained fallback events") if events else None


MODEL_BUFFER: Final = re.compile(r"^load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
KV_BUFFER: Final = re.compile(r"^llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB")
COMPUTE_BUFFER: Final = re.compile(r"^sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")
MEMORY_EVENTS: Final = ("model_memory_allocation_summary", "resource_allocation_completed")


def check_buffers(pattern: re.Pattern[str], key: str, *, figures_vary: bool = False) -> Check:
    """Buffer sizes llama.cpp prints per buffer type, summed per device (as ggml maps buffer
    types to devices), against the `key` bytes of that device's memory events (both ids must
    agree). `figures_vary` for the weights: which extra buffer types (``CPU_REPACK``, ``AMX``)
    hold some of them, in layouts of their own, depends on the machine, and so do the lines and
    their figures; then each device's sum counts as one statement and the figures stay in the
    finding's detail, out of the document."""

    def check(run: Run) -> Finding | None:
        found = run.matches(pattern)
        if not found:
            return None
        per_device: dict[str, list[float]] = {}
        for m in found:
            per_device.setdefault(device_of_buffer_type(m.group(1)), []).append(float(m.group(2)))
        events = run.of(*MEMORY_EVENTS)
        parts, shown = [], []
        ok = bool(events)
        for device, figures in sorted(per_device.items()):
            on_device = [e for e in events if device_of(e) == device]
            values = {summary_value(e, key) for e in on_device}
            value = next(iter(values)) if len(values) == 1 else None
            ok = (
                ok and len(kinds_of(on_device)) == 2 and near_mib(sum(figures), value, len(figures))
            )
            printed = "+".join(f"{f:.2f}" for f in figures)
            parts.append(f"{device} {printed} MiB ↔ {key} {value}")
            shown.append(f"{device} sum over its buffer types ↔ {key}")
        carried = kinds_of(events) if ok else ()
        if figures_vary:
            return Finding(len(per_device), carried, "; ".join(shown), "; ".join(parts))
        return Finding(len(found), carried, "; ".join(parts))

    return check


def check_buffer_fallback(run: Run) -> Finding | None:
    """The buffer type a tensor could not use: a device's extra one (which one depends on the
    machine: named in the detail only) or a named one."""
    found = run.matches(BUFFER_FALLBACK)
    if not found:
        return None
    names = sorted({m.group(1) for m in found})
    carried = tuple(dict.fromkeys(i for name in names for i in carrying_string(run, name)))
    shown = sorted(
        {
            f"an extra one of {device_of_buffer_type(n)}" if is_extra_buffer_type(n) else n
            for n in names
        }
    )
    return Finding(
        len(found),
        carried,
        f"preferred buffer type {', '.join(shown)}",
        f"preferred buffer type {', '.join(names)}",
    )


KV_CELLS: Final = re.compile(
    r"^llama_kv_cache: size =\s+[\d.]+ MiB \(\s*(\d+) cells,\s+\d+ layers,\s+\d+/(\d+) seqs\)"
)


def check_kv_cells(run: Run) -> Finding | None:
    found = run.matches(KV_CELLS)
    if not found:
        return None
    cells, seqs = int(found[0].group(1)), int(found[0].group(2))
    kv = run.of("kv_cache_initialization_completed")
    serving = run.of("serving_backend_initialization_completed")
    total = summary_value(kv[0], "kv_cells_total") if kv else None
    lanes = summary_value(serving[0], "lanes") if serving else None
    ok = total == cells and lanes == seqs
    return Finding(
        len(found),
        kinds_of(kv + serving) if ok else (),
        f"{cells} cells, {seqs} seqs ↔ kv_cells_total {total}, lanes {lanes}",
    )


def check_context(pattern: re.Pattern[str], key: str) -> Check:
    def check(run: Run) -> Finding | None:
        found = run.matches(pattern)
        if not found:
            return None
        logged = int(found[0].group(1))
        events = run.of("serving_backend_initialization_completed", "model_available")
        values = sorted({summary_value(e, key) for e in events}, key=str)
        ok = len(kinds_of(events)) == 2 and values == [logged]
        return Finding(len(found), kinds_of(events) if ok else (), f"{logged} ↔ {key} {values}")

    return check


N_CTX: Final = re.compile(r"^llama_context: n_ctx\s+=\s+(\d+)")
N_CTX_SEQ: Final = re.compile(r"^llama_context: n_ctx_seq\s+=\s+(\d+)")
N_SEQ_MAX: Final = re.compile(r"^llama_context: n_seq_max\s+=\s+(\d+)")


GRAPH_RESERVE: Final = re.compile(r"^(?:sched|graph)_reserve: reserv")


def check_graph_reserved(run: Run) -> Finding | None:
    found = run.matches(GRAPH_RESERVE)
    if not found:
        return None
    phases = [state_of(e) for e in run.of("model_load_phase_changed")]
    want = ["allocating ctx", "context ready"]
    ordered = [p for p in phases if p in want] == want
    return Finding(
        len(found),
        ("model_load_phase_changed",) if ordered else (),
        f"graph reserved ↔ phases {' → '.join(p for p in phases if p in want)}",
    )


WARM_UP: Final = re.compile(r"(?i)warm(?:ing)?[ _-]?up")


def check_warm_up(run: Run) -> Finding | None:
    found = run.matches(WARM_UP)
    return Finding(len(found), (), "no warm-up line") if found else None


CTX_BELOW_TRAIN: Final = re.compile(r"n_ctx_seq \((\d+)\) < n_ctx_train \((\d+)\)")


CTX_BELOW_TRAIN_EVENTS: Final = (
    "native_model_load_completed",
    "serving_backend_initialization_completed",
)


def check_ctx_below_train(run: Run) -> Finding | None:
    """llama.cpp warns whenever a sequence's context is below the training context: the
    events' `context_tokens_per_lane` and `context_train_tokens` must say the same, and events
    that say it without the warning are a fact the log does not state."""
    found = run.matches(CTX_BELOW_TRAIN)
    model = run.of(CTX_BELOW_TRAIN_EVENTS[0])
    serving = run.of(CTX_BELOW_TRAIN_EVENTS[1])
    train = summary_value(model[0], "context_train_tokens") if model else None
    per_lane = summary_value(serving[0], "context_tokens_per_lane") if serving else None
    below = train is not None and per_lane is not None and per_lane < train
    if not found:
        return Finding(0, (), f"{per_lane} < {train} without a warning") if below else None
    logged_seq, logged_train = int(found[0].group(1)), int(found[0].group(2))
    ok = below and (per_lane, train) == (logged_seq, logged_train)
    return Finding(
        len(found),
        kinds_of(model + serving) if ok else (),
        f"{logged_seq} < {logged_train} ↔ context_tokens_per_lane {per_lane}, "
        f"context_train_tokens {train}",
    )
