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

from skippyctl.reducer.state import (
    LOADING_MODEL_STATES,
    SERVING_MODEL_STATES,
    DeviceState,
    ModelState,
    NodeState,
    RuntimeState,
    RuntimeView,
    StageState,
)

_BAD_DEVICE = frozenset({DeviceState.DEGRADED, DeviceState.UNAVAILABLE, DeviceState.LOST})


def derive_node(state: RuntimeView) -> NodeState:
    if state.runtime is RuntimeState.STOPPED:
        return NodeState.STOPPED
    if state.runtime is RuntimeState.STOPPING:
        return NodeState.DRAINING
    if state.runtime is RuntimeState.STARTING:
        return NodeState.STARTING
    serving = [m for m in state.models.values() if m.state in SERVING_MODEL_STATES]
    if serving:
        topologies = {m.topology_id for m in serving if m.topology_id is not None}
        degraded = (
            any(m.state is ModelState.DEGRADED for m in serving)
            or any(d.state in _BAD_DEVICE for d in state.devices.values())
            or any(
                s.topology_id in topologies and s.state is not StageState.READY
                for s in state.stages.values()
            )
        )
        return NodeState.DEGRADED if degraded else NodeState.ACCEPTING
    if any(m.state in LOADING_MODEL_STATES for m in state.models.values()):
        return NodeState.STARTING
    return NodeState.UNAVAILABLE
