"""Node serving availability, derived from runtime, models, topologies, stages and devices.

runtime stopped                                   stopped
runtime stopping                                  draining
runtime starting                                  starting
some model serving (available or degraded):
    any serving model degraded, a device degraded/unavailable/lost,
    or a stage of a serving topology not ready     degraded
    otherwise                                     accepting
no model serving, some model loading              starting   (loading is never "down")
otherwise                                         unavailable
"""

from __future__ import annotations

from collections.abc import Sequence

from skippyctl.reducer.state import (
    LOADING_MODEL_STATES,
    SERVING_MODEL_STATES,
    DeviceState,
    ModelState,
    ModelView,
    NodeState,
    RuntimeState,
    RuntimeView,
    StageState,
)

_BAD_DEVICE = frozenset({DeviceState.DEGRADED, DeviceState.UNAVAILABLE, DeviceState.LOST})


def derive_node(state: RuntimeView, serving: Sequence[ModelView] | None = None) -> NodeState:
    """The table above. `serving`: the state's serving models, when the caller has them."""
    if state.runtime is RuntimeState.STOPPED:
        return NodeState.STOPPED
    if state.runtime is RuntimeState.STOPPING:
        return NodeState.DRAINING
    if state.runtime is RuntimeState.STARTING:
        return NodeState.STARTING
    if serving is None:
        serving = [m for m in state.models.values() if m.state in SERVING_MODEL_STATES]
    if serving:
        if any(m.state is ModelState.DEGRADED for m in serving) or any(
            d.state in _BAD_DEVICE for d in state.devices.values()
        ):
            return NodeState.DEGRADED
        if state.stages:  # (derived after every KV transition: skip the set when there is none)
            topologies = {m.topology_id for m in serving if m.topology_id is not None}
            if any(
                s.topology_id in topologies and s.state is not StageState.READY
                for s in state.stages.values()
            ):
                return NodeState.DEGRADED
        return NodeState.ACCEPTING
    if any(m.state in LOADING_MODEL_STATES for m in state.models.values()):
        return NodeState.STARTING
    return NodeState.UNAVAILABLE
