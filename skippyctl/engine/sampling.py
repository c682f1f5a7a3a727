"""Sampling parameters and the llama.cpp sampler chain built from them.

Contract:

- :class:`SamplingParams` is validated on construction: an out-of-range value raises
  ``ValueError`` naming the field, so a bad request is refused before it touches llama.cpp (some
  bad values, such as a negative penalty window, would crash native code).
- :func:`build_sampler_chain` makes one chain per request, in llama.cpp's usual order:
  grammar -> logit bias -> penalties (repeat, frequency, presence) -> top-k -> top-p -> min-p ->
  temperature -> dist(seed). The grammar (a request's GBNF, or its JSON schema turned into GBNF)
  comes first so every later stage, greedy included, picks among the tokens it allows; the
  penalties are fed the prompt's tail, the grammar only the output.
  Temperature 0 replaces everything after the penalties with greedy selection, so it is exactly
  argmax of the biased, penalised logits. Stages that would be no-ops are left out (cheaper per
  token). A fixed seed makes the chain deterministic: same seed, same logits -> same tokens.
- The caller owns the returned :class:`SamplerChain` and must ``close`` it exactly once
  (``close`` is idempotent); it is not thread-safe and belongs to the decode thread.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

LLAMA_DEFAULT_SEED: Final = 0xFFFFFFFF
"""llama.cpp's "pick a random seed" value; a request seed must therefore be below it."""

MAX_SEED: Final = LLAMA_DEFAULT_SEED - 1
_PORT_SPACE_RULE: Final = 'space ::= " "?\n'
_LLAMA_CPP_SPACE_RULE: Final = 'space ::= | " " | "\\n"{1,2} [ \\t]{0,20}\n'
MAX_TOP_LOGPROBS: Final = 20
"""OpenAI's bound on top_logprobs."""
MIN_KEEP_CANDIDATES: Final = 1
"""top-p/min-p keep at least this many candidates, so a chain always has something to pick."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick each next token. Defaults match llama.cpp's common defaults.

    ``temperature`` 0 means greedy. ``top_k`` 0 disables top-k; ``top_p`` 1 and ``min_p`` 0
    disable theirs. ``repeat_penalty`` 1 or ``repeat_last_n`` 0 disables the penalty (the window
    counts the request's prompt tail and its completion). ``seed`` ``None`` draws a random seed.
    ``logit_bias`` pairs a token id with an additive bias; ``-inf`` bans the token.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    grammar: str | None = None
    """A GBNF grammar (root rule ``root``) the output must match."""
    json_schema: str | None = None
    """A JSON schema (JSON text) the output must satisfy, turned into GBNF as llama.cpp does."""
    json_schema_tags: tuple[str, str] | None = None
    """Literal text before and after the JSON ``json_schema`` constrains (a Hermes tool call's
    ``<tool_call>`` tags); None: the JSON alone."""
    logprobs: int | None = None
    """Report each token's log-probability with this many top candidates; None: off."""

    def __post_init__(self) -> None:
        _check_real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        _check_int("top_k", self.top_k)
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        for name in ("top_p", "min_p"):
            value = getattr(self, name)
            _check_real(name, value)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        _check_real("repeat_penalty", self.repeat_penalty)
        if self.repeat_penalty <= 0:
            raise ValueError(
                f"repeat_penalty must be > 0 (1 disables it), got {self.repeat_penalty}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_real(name, value)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if self.grammar is not None and self.json_schema is not None:
            raise ValueError("give either a grammar or a JSON schema")
        if self.json_schema_tags is not None and self.json_schema is None:
            raise ValueError("json_schema_tags need a JSON schema")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs)
            if not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
                raise ValueError(
                    f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}"
                )
        _check_int("repeat_last_n", self.repeat_last_n)
        if self.repeat_last_n < 0:
            raise ValueError(
                f"repeat_last_n must be >= 0 (0 disables it), got {self.repeat_last_n}"
            )
        if self.seed is not None:
            _check_int("seed", self.seed)
            if not 0 <= self.seed <= MAX_SEED:
                raise ValueError(f"seed must be in [0, {MAX_SEED}], got {self.seed}")
        if not isinstance(self.logit_bias, tuple):
            raise ValueError("logit_bias must be a tuple of (token, bias) pairs")
        for pair in self.logit_bias:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ValueError("logit_bias must be a tuple of (token, bias) pairs")
            token, bias = pair
            _check_int("logit_bias token", token)
            if token < 0:
                raise ValueError(f"logit_bias token must be >= 0, got {token}")
            if not isinstance(bias, int | float) or isinstance(bias, bool) or math.isnan(bias):
                raise ValueError("logit_bias bias must be a number")
            if bias == math.inf:
                raise ValueError("logit_bias bias must not be +inf (use a large finite value)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalizes(self) -> bool:
        """Whether the penalty stage is active (and prompt tokens must be fed)."""
        return self.repeat_last_n > 0 and (
            self.repeat_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    @property
    def constraint(self) -> str | None:
        """What constrains the output: ``grammar``, ``json_schema`` or None."""
        if self.grammar is not None:
            return "grammar"
        return "json_schema" if self.json_schema is not None else None

    def gbnf(self) -> str | None:
        """The grammar the output must match (a JSON schema converted by llama-cpp-python's port
        of llama.cpp's json-schema-to-grammar); ``ValueError`` for a schema it cannot convert."""
        if self.json_schema is None:
            return self.grammar
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        try:
            gbnf = str(json_schema_to_gbnf(self.json_schema))
        except Exception as error:  # noqa: BLE001 - the converter raises many kinds
            raise ValueError(f"the JSON schema cannot be turned into a grammar: {error}") from None
        # The port predates llama.cpp's whitespace rule (common/json-schema-to-grammar.cpp),
        # which lets a model lay JSON out over lines as it was trained to; without it greedy
        # replies differ from llama-server's.
        gbnf = gbnf.replace(_PORT_SPACE_RULE, _LLAMA_CPP_SPACE_RULE)
        if self.json_schema_tags is None:
            return gbnf
        before, after = self.json_schema_tags
        rule = _TAGGED_JSON_RULE
        while re.search(rf"^{rule} ::=", gbnf, flags=re.M):  # a schema's own rule of that name
            rule += "-"
        renamed = re.sub(r"^root ::=", f"{rule} ::=", gbnf, count=1, flags=re.M)
        return f"root ::= {_gbnf_literal(before)} {rule} {_gbnf_literal(after)}\n" + renamed


_TAGGED_JSON_RULE: Final = "tagged-json"
"""The JSON's rule when tags surround it (lengthened while the schema has a rule so named)."""


def _gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") + '"'


def _check_real(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _check_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")


class SamplerChain:
    """An owned ``llama_sampler`` chain. ``pointer`` is valid until :meth:`close`."""

    __slots__ = ("_llama", "pointer")

    def __init__(self, llama: ModuleType, pointer: Any) -> None:
        self._llama = llama
        self.pointer = pointer

    def accept(self, tokens: Sequence[int]) -> None:
        """Feed tokens the model has seen (prompt tail) so penalties take them into account."""
        accept = self._llama.llama_sampler_accept
        for token in tokens:
            accept(self.pointer, token)

    def close(self) -> None:
        if self.pointer is not None:
            self._llama.llama_sampler_free(self.pointer)
            self.pointer = None


class GrammarError(ValueError):
    """llama.cpp did not accept the request's grammar (it parses it when the sampler is made)."""


def grammar_sampler(llama: ModuleType, vocab: Any, gbnf: str) -> Any:
    """An owned grammar sampler for ``gbnf``; :class:`GrammarError` when llama.cpp refuses it."""
    if "\x00" in gbnf:
        raise GrammarError("the grammar contains a NUL character")
    sampler = llama.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
    if not sampler:
        raise GrammarError(
            "llama.cpp could not parse the grammar (GBNF, starting at a rule named `root`)"
        )
    return sampler


def build_sampler_chain(
    llama: ModuleType,
    vocab: Any,
    params: SamplingParams,
    history: Sequence[int] = (),
    gbnf: str | None = None,
) -> SamplerChain:
    """A fresh chain for ``params``; ``ValueError`` for a bias on a token outside ``vocab``,
    :class:`GrammarError` for a grammar llama.cpp refuses.

    ``history`` (the prompt's tail) is fed to the penalty stage only — never to the grammar,
    which must see the output alone. ``gbnf`` is ``params.gbnf()`` when the caller made it
    already (a JSON schema is converted once per request)."""
    n_vocab = int(llama.llama_vocab_n_tokens(vocab))
    for token, _bias in params.logit_bias:
        if token >= n_vocab:
            raise ValueError(f"logit_bias token {token} is outside the vocabulary ({n_vocab})")
    chain_params = llama.llama_sampler_chain_default_params()
    chain_params.no_perf = True
    chain = SamplerChain(llama, llama.llama_sampler_chain_init(chain_params))
    if not chain.pointer:
        raise RuntimeError("llama_sampler_chain_init failed")
    try:
        # The chain takes ownership of every stage added to it (freed with the chain).
        add = llama.llama_sampler_chain_add
        grammar = gbnf if gbnf is not None else params.gbnf()
        if grammar is not None:
            # First: every later stage (greedy included) picks among what the grammar allows.
            add(chain.pointer, grammar_sampler(llama, vocab, grammar))
        if params.logit_bias:
            biases = (llama.llama_logit_bias * len(params.logit_bias))()
            for index, (token, bias) in enumerate(params.logit_bias):
                biases[index].token = token
                biases[index].bias = bias
            add(
                chain.pointer,
                llama.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), biases),
            )
        if params.penalizes:
            penalties = llama.llama_sampler_init_penalties(
                n_vocab,
                params.repeat_last_n,
                params.repeat_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            )
            accept = llama.llama_sampler_accept
            for token in history[-params.repeat_last_n :]:
                accept(penalties, token)
            add(chain.pointer, penalties)
        if params.greedy:
            add(chain.pointer, llama.llama_sampler_init_greedy())
            return chain
        if params.top_k > 0:
            add(chain.pointer, llama.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            add(chain.pointer, llama.llama_sampler_init_top_p(params.top_p, MIN_KEEP_CANDIDATES))
        if params.min_p > 0.0:
            add(chain.pointer, llama.llama_sampler_init_min_p(params.min_p, MIN_KEEP_CANDIDATES))
        add(chain.pointer, llama.llama_sampler_init_temp(params.temperature))
        seed = LLAMA_DEFAULT_SEED if params.seed is None else params.seed
        add(chain.pointer, llama.llama_sampler_init_dist(seed))
    except BaseException:
        chain.close()
        raise
    return chain
