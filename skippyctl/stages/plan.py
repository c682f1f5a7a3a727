"""Stage endpoints and the layer plan of a topology (pure functions, no I/O).

Endpoints: ``HOST:PORT`` with a dotted IPv4 host (ggml's RPC client is IPv4 only) and a port
1–65535; at most ``MAX_STAGES`` (``GGML_RPC_MAX_SERVERS``) per topology, no duplicates.

The plan rule (``plan_layers``):

- Each stage offers memory: what it was started with (``stage serve --mem`` / ``--mem`` of a
  local stage, carried by its ``stage_ready``) when known, else what its device reports free.
- The model's ``n_layer`` repeating layers are split into contiguous ranges in stage order, in
  proportion to the offered memory (largest remainder; every stage gets at least one layer, so
  there can be at most ``n_layer`` stages). The output layer goes with the last stage (llama.cpp
  puts it on the last device); the token embeddings stay in the engine process (llama.cpp keeps
  the input layer on its CPU).
- Bytes per stage are estimated as the model's file size spread evenly over the ``n_layer + 1``
  offloaded units (repeating layers + output layer): an over-estimate, since the embeddings
  never leave the engine.
- A stage *fits* when ``offered >= planned * (1 + WEIGHT_MARGIN) + STAGE_RESERVE_BYTES`` — the
  margin covers uneven layer sizes, the reserve ggml's compute buffers and the stage's share of
  the KV cache for small contexts. A plan with a stage that does not fit is refused
  (``resource_allocation_failure``) before any weight moves.

``tensor_split`` turns the ranges into the proportions llama.cpp's layer split needs to place
exactly those ranges (see its docstring).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

MAX_STAGES: Final = 16
"""``GGML_RPC_MAX_SERVERS`` in ggml-rpc.h."""
MAX_PORT: Final = 65535
WEIGHT_MARGIN: Final = 0.10
STAGE_RESERVE_BYTES: Final = 32 * 2**20


class EndpointError(ValueError):
    """An endpoint (or the list of them) is not acceptable; the message says why."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise EndpointError(f"{text!r} is not HOST:PORT")
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError as error:
        raise EndpointError(f"{host!r} is not an IPv4 address") from error
    if not port_text.isdigit() or not 1 <= int(port_text) <= MAX_PORT:
        raise EndpointError(f"port {port_text!r} is not 1-{MAX_PORT}")
    return Endpoint(str(address), int(port_text))


def parse_endpoints(texts: list[str] | tuple[str, ...]) -> tuple[Endpoint, ...]:
    """Every endpoint parsed; at most ``MAX_STAGES``, no duplicates (``EndpointError``)."""
    if len(texts) > MAX_STAGES:
        raise EndpointError(f"at most {MAX_STAGES} stages (GGML_RPC_MAX_SERVERS)")
    endpoints = tuple(parse_endpoint(t) for t in texts)
    if len(set(endpoints)) != len(endpoints):
        raise EndpointError("the same stage is listed twice")
    return endpoints


@dataclass(frozen=True, slots=True)
class StageShare:
    layer_start: int
    layer_count: int
    planned_bytes: int
    offered_bytes: int
    output_layer: bool

    @property
    def layer_end(self) -> int:
        return self.layer_start + self.layer_count

    @property
    def needed_bytes(self) -> int:
        return int(self.planned_bytes * (1 + WEIGHT_MARGIN)) + STAGE_RESERVE_BYTES

    @property
    def fits(self) -> bool:
        return self.offered_bytes >= self.needed_bytes


@dataclass(frozen=True, slots=True)
class LayerPlan:
    n_layer: int
    model_bytes: int
    shares: tuple[StageShare, ...]

    @property
    def fits(self) -> bool:
        return all(share.fits for share in self.shares)


class PlanRefused(ValueError):
    """No plan can be made (more stages than layers, a stage that offers nothing)."""


def _apportion(total: int, weights: list[int]) -> list[int]:
    """``total`` items in proportion to ``weights``, at least one each (largest remainder)."""
    count = len(weights)
    spare = total - count
    weight_sum = sum(weights)
    exact = [spare * w / weight_sum for w in weights]
    out = [int(x) for x in exact]
    order = sorted(range(count), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: spare - sum(out)]:
        out[i] += 1
    return [1 + x for x in out]


def plan_layers(n_layer: int, model_bytes: int, offered_bytes: list[int]) -> LayerPlan:
    """The layer ranges for stages offering ``offered_bytes`` (in stage order)."""
    if not offered_bytes:
        raise PlanRefused("a topology needs at least one stage")
    if n_layer < len(offered_bytes):
        raise PlanRefused(f"the model has {n_layer} layers: at most {n_layer} stages")
    if any(b <= 0 for b in offered_bytes):
        raise PlanRefused("a stage offers no memory")
    counts = _apportion(n_layer, offered_bytes)
    per_unit = model_bytes / (n_layer + 1)
    shares = []
    start = 0
    for index, (count, offered) in enumerate(zip(counts, offered_bytes, strict=True)):
        last = index == len(counts) - 1
        units = count + (1 if last else 0)
        shares.append(StageShare(start, count, round(per_unit * units), offered, last))
        start += count
    return LayerPlan(n_layer, model_bytes, tuple(shares))


def tensor_split(plan: LayerPlan) -> tuple[float, ...]:
    """Proportions for ``llama_model_params.tensor_split`` that put exactly ``plan``'s ranges on
    the devices, with every layer offloaded (``n_gpu_layers >= n_layer + 1``).

    llama.cpp normalises the proportions into cumulative split points ``s[d]`` and puts layer
    ``il`` (``0..n_layer``, ``n_layer`` being the output layer) on the first device with
    ``s[d] > il / (n_layer + 1)``. A split point half a layer before each range's end,
    ``(end - 0.5) / (n_layer + 1)``, and 1 for the last device, places every boundary exactly."""
    units = plan.n_layer + 1
    points = [(share.layer_end - 0.5) / units for share in plan.shares[:-1]] + [1.0]
    return tuple(p - q for p, q in zip(points, [0.0, *points[:-1]], strict=True))


def device_of_layer(split: tuple[float, ...], n_layer: int, layer: int) -> int:
    """Which device llama.cpp's layer split puts ``layer`` on (a replica of its rule in
    ``llama_model::load_tensors``, for tests and for checking ``tensor_split``)."""
    total = sum(split)
    cumulative = 0.0
    points = []
    for value in split:
        cumulative += value
        points.append(cumulative / total)
    fraction = layer / (n_layer + 1)
    for device, point in enumerate(points):
        if point > fraction:
            return device
    return len(points)


def stage_options_problem(
    endpoints: tuple[str, ...],
    local_stages: int,
    local_stage_mem_mib: int | None = None,
    replan: bool = False,
    link_p95_ms: float | None = None,
    gpu_layers: int = 0,
) -> str | None:
    """Why a load's stage options are invalid, in the CLI's flag names, or None: one rule for
    the CLI (before any runtime is reached) and the host (before anything starts)."""
    try:
        parse_endpoints(endpoints)
    except EndpointError as error:
        return f"--stage: {error}"
    if not 0 <= local_stages <= MAX_STAGES:
        return f"--local-stages must be 0-{MAX_STAGES}"
    if len(endpoints) + local_stages > MAX_STAGES:
        return f"at most {MAX_STAGES} stages in all (GGML_RPC_MAX_SERVERS)"
    split = bool(endpoints) or local_stages > 0
    if local_stage_mem_mib is not None:
        if local_stages == 0:
            return "--mem applies to local stages only (with --local-stages)"
        if local_stage_mem_mib < 1:
            return "--mem must be at least 1 MiB"
    if link_p95_ms is not None:
        if not split:
            return "--stage-link-p95-ms applies to a split load only (with --stage/--local-stages)"
        if not 0 < link_p95_ms < float("inf"):
            return "--stage-link-p95-ms must be a positive number of ms"
    if split and gpu_layers != 0:
        return "--gpu-layers does not apply to a split load (every layer goes to the stages)"
    if replan and not endpoints:
        return "--replan needs --stage"
    return None
