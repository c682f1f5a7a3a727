"""The BatchEngine test harness shared by tests/engine/test_generation_*.py and
test_observations.py: the recorder of the engine's messages (as the control-channel payloads the
host receives), the harness an engine factory returns, and greedy sampling. The fixtures that
load the model and make engines are in tests/engine/conftest.py."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import llama_cpp
import orjson

from skippyctl.engine.generation import BatchEngine, SamplingParams
from skippyctl.engine.protocol import encode
from skippyctl.engine.protocol_messages import EngineMessage

WAIT_S = 60.0
PROMPT = "The quick brown fox jumps over the lazy dog"

Message = dict[str, Any]


class Recorder:
    """The engine's ``emit``: keeps every message as its control-channel payload (what the host
    receives); tests wait on gen_done counts."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.received_at: list[float] = []
        self._cond = threading.Condition()
        self.on_message: Callable[[Message], None] | None = None

    def __call__(self, typed: EngineMessage) -> None:
        message = orjson.loads(encode(typed))
        json.dumps(message)  # JSON-ready, or the test fails loudly
        with self._cond:
            self.messages.append(message)
            self.received_at.append(time.monotonic())
            self._cond.notify_all()
        if self.on_message is not None:
            self.on_message(message)

    def done(self) -> list[Message]:
        with self._cond:
            return [m for m in self.messages if m["msg"] == "gen_done"]

    def wait_done(self, count: int, timeout_s: float = WAIT_S) -> list[Message]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while sum(m["msg"] == "gen_done" for m in self.messages) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"timed out waiting for {count} gen_done"
                self._cond.wait(left)
        return self.done()

    def wait_for(self, predicate: Callable[[Message], bool], timeout_s: float = WAIT_S) -> Message:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for message in self.messages:
                    if predicate(message):
                        return message
                left = deadline - time.monotonic()
                assert left > 0, "timed out waiting for a message"
                self._cond.wait(left)

    def of(self, request_id: str, kind: str) -> list[Message]:
        with self._cond:
            return [
                m for m in self.messages if m["msg"] == kind and m.get("request_id") == request_id
            ]

    def one(self, request_id: str, kind: str) -> Message:
        found = self.of(request_id, kind)
        assert len(found) == 1, (kind, found)
        return found[0]

    def text(self, request_id: str) -> str:
        return "".join(m["text"] for m in self.of(request_id, "gen_text"))

    def times(self, request_id: str, kind: str) -> list[float]:
        with self._cond:
            return [
                t
                for m, t in zip(self.messages, self.received_at, strict=True)
                if m["msg"] == kind and m.get("request_id") == request_id
            ]

    def kind(self, kind: str) -> list[Message]:
        with self._cond:
            return [m for m in self.messages if m["msg"] == kind]


@dataclasses.dataclass
class Harness:
    engine: BatchEngine
    recorder: Recorder
    context: Any


EngineFactory = Callable[..., Harness]


def llama_with_decode(decode: Callable[[Any, Any], int]) -> SimpleNamespace:
    """llama_cpp's functions with ``llama_decode`` replaced (a spy that calls the real one)."""
    proxy = SimpleNamespace(
        **{name: getattr(llama_cpp, name) for name in dir(llama_cpp) if name.startswith("llama_")}
    )
    proxy.llama_decode = decode
    return proxy


def greedy(eog_ban: tuple[tuple[int, float], ...] = (), **kwargs: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, logit_bias=eog_ban, **kwargs)
