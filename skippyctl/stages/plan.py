"""The layer plan of a topology (pure functions, no I/O; its endpoints are
``skippyctl.config.endpoints``).

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

from dataclasses import dataclass
from typing import Final

WEIGHT_MARGIN: Final = 0.10
STAGE_RESERVE_BYTES: Final = 32 * 2**20


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
