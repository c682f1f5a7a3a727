"""A request's way in: its prompt as tokens when accepted, its sampler and text tools at start.

:class:`RequestIntake` checks and tokenizes a submitted request for the decode core (the chat
rendered by the model's own Jinja template, ``engine/chat_template.py``, or a raw prompt; bounded
by a lane's size, ``engine/text.py``) and, once the request has a lane, equips it with its
sampler chain (``engine/sampling.py``), detokenizer and stop matcher.

Which template serves a chat (llama-server's rule, common/chat.cpp): the load's override when it
has one; else the GGUF's ``tokenizer.chat_template``, or its ``tokenizer.chat_template.tool_use``
for a request with tools (or when it has only that one); llama.cpp's ChatML only for a GGUF with
neither. The default template compiles with the intake (at load), the tool_use one at the
first chat with tools.

Threads: :meth:`RequestIntake.prepare` runs on the thread that submits a request (the engine's
command thread), as llama-server's HTTP threads render and tokenize: the decode thread does
not spend a step's gap on a chat's template or a long prompt's tokens, and the command thread
does that work while a step's ``llama_decode`` runs (it holds no GIL). It reads the vocabulary
only (read-only in llama.cpp) and is called from one thread at a time. :meth:`equip` runs on
the decode thread. Nothing here emits: the core answers a refusal with the reason prepared.
"""

from __future__ import annotations

import contextlib
import ctypes
from types import ModuleType

from skippyctl.engine.chat_template import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from skippyctl.engine.request_state import RequestState
from skippyctl.engine.sampling import build_sampler_chain, grammar_sampler
from skippyctl.engine.text import (
    Detokenizer,
    StopMatcher,
    model_chat_template,
    token_text,
    tokenize_at_most,
)
from skippyctl.events.reasons import ReasonCode


class RequestIntake:
    """Prompt tokenization and per-request text tools for one model (see the module docstring)."""

    def __init__(
        self,
        llama: ModuleType,
        model: int | ctypes.c_void_p,
        *,
        tokens_per_lane: int,
        chat_template: str | None = None,
    ) -> None:
        self._llama = llama
        self.vocab = llama.llama_model_get_vocab(model)
        self.n_vocab = int(llama.llama_vocab_n_tokens(self.vocab))
        self._tokens_per_lane = tokens_per_lane
        default = chat_template if chat_template is not None else model_chat_template(llama, model)
        tool_use = (
            None if chat_template is not None else model_chat_template(llama, model, "tool_use")
        )
        if not default or default == "chatml":
            default = tool_use or CHATML_TEMPLATE
        self._sources = {"default": default, "tool_use": tool_use}
        self._templates: dict[str, ChatTemplate | ChatTemplateError] = {}
        vocab = self.vocab
        self._bos_text = token_text(llama, vocab, int(llama.llama_vocab_bos(vocab)))
        self._eos_text = token_text(llama, vocab, int(llama.llama_vocab_eos(vocab)))
        self._add_bos_text = bool(llama.llama_vocab_get_add_bos(vocab))
        self._add_eos_text = bool(llama.llama_vocab_get_add_eos(vocab))
        self._add_bos = True  # llama_tokenize adds BOS only if the vocabulary asks for it
        self._pieces: dict[int, bytes] = {}
        # Compiled now, at load (~20 ms with its probe renders), not by the first chat on the
        # decode thread; a template that does not compile refuses each chat with its error.
        with contextlib.suppress(ChatTemplateError):
            self.template_for(with_tools=False)

    def template_for(self, with_tools: bool) -> ChatTemplate:
        """The compiled template serving a chat (with or without tools); compiled once.
        :class:`ChatTemplateError` when that template does not compile."""
        key = "tool_use" if with_tools and self._sources["tool_use"] else "default"
        compiled = self._templates.get(key)
        if compiled is None:
            source = self._sources[key]
            assert source is not None
            try:
                compiled = ChatTemplate(
                    source,
                    bos_token=self._bos_text,
                    eos_token=self._eos_text,
                    add_bos=self._add_bos_text,
                    add_eos=self._add_eos_text,
                )
            except ChatTemplateError as error:
                compiled = error
            self._templates[key] = compiled
        if isinstance(compiled, ChatTemplateError):
            raise compiled
        return compiled

    def prepare(self, r: RequestState) -> None:
        """``r.prompt`` from its prompt or messages (and ``r.gbnf`` from its constraint), or
        ``r.refusal`` (a prompt longer than a lane is refused before any lane or session is
        touched, with ``r.prompt_count`` set)."""
        r.refusal = self._tokenize(r)

    def _tokenize(self, r: RequestState) -> tuple[ReasonCode, str | None] | None:
        spec = r.spec
        try:
            if spec.messages is not None:
                template = self.template_for(bool(spec.tools))
                text = template.render(
                    spec.messages, tools=spec.tools, chat_template_kwargs=spec.chat_template_kwargs
                )
            else:
                assert spec.prompt is not None  # validated: exactly one of prompt/messages
                text = spec.prompt
            prompt, counted = tokenize_at_most(
                self._llama, self.vocab, text, self._tokens_per_lane, add_special=self._add_bos
            )
        except ChatTemplateError as error:
            return ReasonCode.INVALID_CONFIGURATION, str(error)
        except (ValueError, UnicodeError):
            return ReasonCode.INVALID_CONFIGURATION, None
        except Exception:  # noqa: BLE001 - one request's failure must not stop the engine
            return ReasonCode.INTERNAL_RUNTIME_FAILURE, None
        if prompt is None:
            r.prompt_count = counted
            return ReasonCode.CONTEXT_EXHAUSTED, None
        r.prompt = prompt
        bias_outside_vocab = any(t >= self.n_vocab for t, _b in spec.sampling.logit_bias)
        if not r.prompt or bias_outside_vocab:
            return ReasonCode.INVALID_CONFIGURATION, None
        if spec.sampling.constraint is not None:
            # Parsed now, so a bad grammar is refused before the request takes a lane.
            try:
                r.gbnf = spec.sampling.gbnf()
                assert r.gbnf is not None
                self._llama.llama_sampler_free(grammar_sampler(self._llama, self.vocab, r.gbnf))
            except ValueError as error:
                return ReasonCode.INVALID_CONFIGURATION, str(error)
        return None

    def equip(self, r: RequestState) -> None:
        """``r``'s sampler chain (fed its prompt's tail when it penalizes repeats), detokenizer
        and stop matcher."""
        params = r.spec.sampling
        r.sampler = build_sampler_chain(
            self._llama,
            self.vocab,
            params,
            history=r.prompt if params.penalizes else (),
            gbnf=r.gbnf,
        )
        r.detok = Detokenizer(self._llama, self.vocab, self._pieces)
        r.stops = StopMatcher(r.spec.stop)
