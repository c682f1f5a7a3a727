"""A request's way in: its prompt as tokens when accepted, its sampler and text tools at start.

:class:`RequestIntake` checks and tokenizes a submitted request for the decode core (chat
template or raw prompt, bounded by a lane's size, ``engine/text.py``) and, once the request has a
lane, equips it with its sampler chain (``engine/sampling.py``), detokenizer and stop matcher.
Decode thread only; nothing here emits: the core answers a refusal with the reason returned.
"""

from __future__ import annotations

import ctypes
from types import ModuleType

from skippyctl.engine.request_state import RequestState
from skippyctl.engine.sampling import build_sampler_chain
from skippyctl.engine.text import (
    ChatTemplateError,
    Detokenizer,
    StopMatcher,
    apply_chat_template,
    model_chat_template,
    tokenize_at_most,
)
from skippyctl.events.reasons import ReasonCode


class RequestIntake:
    """Prompt tokenization and per-request text tools for one model (see the module docstring)."""

    def __init__(
        self, llama: ModuleType, model: int | ctypes.c_void_p, *, tokens_per_lane: int
    ) -> None:
        self._llama = llama
        self.vocab = llama.llama_model_get_vocab(model)
        self.n_vocab = int(llama.llama_vocab_n_tokens(self.vocab))
        self._tokens_per_lane = tokens_per_lane
        self._template = model_chat_template(llama, model)
        self._add_bos = True  # llama_tokenize adds BOS only if the vocabulary asks for it
        self._pieces: dict[int, bytes] = {}

    def tokenize(self, r: RequestState) -> ReasonCode | None:
        """Set ``r.prompt`` from its prompt or messages; the reason to refuse ``r``, if any (a
        prompt longer than a lane is refused before any lane or session is touched, with
        ``r.prompt_count`` set)."""
        spec = r.spec
        try:
            if spec.messages is not None:
                text = apply_chat_template(self._llama, self._template, spec.messages)
            else:
                assert spec.prompt is not None  # validated: exactly one of prompt/messages
                text = spec.prompt
            prompt, counted = tokenize_at_most(
                self._llama, self.vocab, text, self._tokens_per_lane, add_special=self._add_bos
            )
        except (ChatTemplateError, ValueError, UnicodeError):
            return ReasonCode.INVALID_CONFIGURATION
        except Exception:  # noqa: BLE001 - one request's failure must not stop the engine
            return ReasonCode.INTERNAL_RUNTIME_FAILURE
        if prompt is None:
            r.prompt_count = counted
            return ReasonCode.CONTEXT_EXHAUSTED
        r.prompt = prompt
        bias_outside_vocab = any(t >= self.n_vocab for t, _b in spec.sampling.logit_bias)
        if not r.prompt or bias_outside_vocab:
            return ReasonCode.INVALID_CONFIGURATION
        return None

    def equip(self, r: RequestState) -> None:
        """``r``'s sampler chain (fed its prompt's tail when it penalizes repeats), detokenizer
        and stop matcher."""
        params = r.spec.sampling
        r.sampler = build_sampler_chain(self._llama, self.vocab, params)
        if params.penalizes:
            r.sampler.accept(r.prompt[-params.repeat_last_n :])
        r.detok = Detokenizer(self._llama, self.vocab, self._pieces)
        r.stops = StopMatcher(r.spec.stop)
