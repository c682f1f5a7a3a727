"""The seams of an engine process on the host: what its supervisor
(``runtime/engine_supervisor.py``) needs from the pipeline, and whom it tells what the engine
reports.

Contract: these are protocols only, so the supervisor never depends on the concrete pipeline,
model server or topology, and they never depend on it.

- :class:`EnginePipeline` (``skippyctl.pipeline.pipeline.Pipeline`` is one): the engine's ring
  registered and drained in order before its authoritative items (:class:`AuthoritySink`), and
  a place for its events.
- :class:`EngineListener` (the scheduler): the engine's serving messages and its exit.
- :class:`EngineTopology` (``runtime/topology.py``): a split model's stages, told the load and
  context returns, the link figures, and asked why the engine crashed.

Listeners and topologies are called on the engine's reader thread: implementations hand work
off and never block (a topology's crash attribution may probe its stages, bounded).
"""

from __future__ import annotations

from typing import Protocol

from skippyctl.config.tool_call_format import ToolCallFormat
from skippyctl.engine.protocol_messages import Link, ServingMessage
from skippyctl.events.envelope import Event, LogicalId
from skippyctl.events.reasons import ReasonCode
from skippyctl.native.ingress import SharedIngress
from skippyctl.pipeline.authority import Authoritative


class AuthoritySink(Protocol):
    def submit_authority(self, item: Authoritative) -> None:
        """Queue an authoritative item (after every native fact drained so far)."""
        ...


class EnginePipeline(AuthoritySink, Protocol):
    """What an engine needs from the pipeline (``skippyctl.pipeline.pipeline.Pipeline`` is one):
    its ring drained in order before its authoritative items, and a place for its events."""

    def submit(self, event: Event) -> object: ...
    def attach_engine(
        self, key: str, ring: SharedIngress, model_id: LogicalId | None = None
    ) -> AuthoritySink: ...
    def detach_engine(self, key: str) -> None: ...


class EngineListener(Protocol):
    """Receives an engine's serving messages (generation observations) and its exit.

    Called on the engine's reader thread: implementations hand work off, never block.
    """

    def on_engine_serving(
        self,
        engine: object,
        lanes: int,
        tool_call_format: ToolCallFormat | None = None,
        pooling: str | None = None,
    ) -> None: ...
    def on_engine_message(self, engine: object, message: ServingMessage) -> None: ...
    def on_engine_exit(
        self, engine: object, crashed: bool, reason: ReasonCode | None = None
    ) -> None: ...


class EngineTopology(Protocol):
    """The stages a split model's engine uses (``runtime/topology.py``), told what the engine
    reports. Called on the engine's reader thread."""

    def engine_loaded(self, ok: bool) -> None:
        """The model load returned (``ok``: the split weights are on the stages)."""
        ...

    def engine_serving(self, ok: bool) -> None:
        """The serving context was created (``ok``) or not."""
        ...

    def engine_link(self, link: Link) -> None:
        """The engine measured its connection to one stage (``engine/links.py``)."""
        ...

    def engine_crashed(self) -> ReasonCode | None:
        """The engine died unasked: the reason to report instead of ``process_crash`` (it may
        probe the stages, bounded), None for none."""
        ...

    def close(self) -> None:
        """The engine is done with the stages (its owner calls this; idempotent)."""
        ...
