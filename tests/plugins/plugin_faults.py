"""Python plugins that misbehave, registered as entry points by tests/plugins/conftest.py and
loaded in a real sidecar."""

from __future__ import annotations

from collections.abc import Sequence

from skippyctl.plugins.api import BasePlugin, ProposalQuery, RequestIds


class RaisingPlugin(BasePlugin):
    """Every proposal raises, quoting the tokens it got (which must never leave the sidecar)."""

    def propose(self, query: ProposalQuery) -> list[int] | None:
        raise RuntimeError(f"canary tokens {list(query.pending)}")


class RaisingLifecyclePlugin(BasePlugin):
    """Every commit raises; proposals answer fine."""

    def commit(self, ids: RequestIds, start: int, tokens: Sequence[int]) -> None:
        raise ValueError(f"canary tokens {list(tokens)}")

    def propose(self, query: ProposalQuery) -> list[int] | None:
        return [7]
