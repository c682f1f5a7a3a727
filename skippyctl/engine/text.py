"""Text <-> tokens for the generation core: tokenization, streaming detokenization and stop
strings (chat templates are ``engine/chat_template.py``'s; the model's template texts and its
BOS/EOS texts come from here).

Contract and invariants:

- :func:`tokenize` (and :func:`tokenize_at_most`, bounded by a lane's size) is llama.cpp's own
  tokenizer (``llama_tokenize``); special-token text such as
  ``<|im_start|>`` is parsed into control tokens (as llama.cpp's server does), and BOS is added when
  the vocabulary asks for it.
- :func:`model_chat_template` is the GGUF's ``tokenizer.chat_template`` (or a named one) as text;
  :func:`token_text` a token's text with special tokens rendered (what a template calls
  ``bos_token``).
- :class:`Detokenizer` turns a token stream into text and never returns a partial UTF-8 sequence:
  bytes of an unfinished character are held until the character completes; bytes that can never
  become valid UTF-8 come out as U+FFFD at once (they are not held forever).
- :class:`StopMatcher` finds stop strings across token boundaries. It releases text only when no
  stop string can still start inside it, so a stop string is never partly streamed out.

Nothing here logs or emits anything: text stays with the caller.
"""

from __future__ import annotations

import codecs
import ctypes
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Final

_PIECE_BUFFER_BYTES: Final = 64
"""First guess for one token's text; llama_token_to_piece reports the size needed if larger."""


def tokenize(
    llama: ModuleType,
    vocab: Any,
    text: str,
    *,
    add_special: bool = True,
    parse_special: bool = True,
) -> list[int]:
    """Tokens of ``text`` (BOS added if ``add_special`` and the vocabulary wants it).

    Special-token text is parsed into control tokens unless ``parse_special`` is false (then it
    is plain text). Raises ``ValueError`` if llama.cpp refuses.
    """
    data = text.encode("utf-8")
    # A token covers at least one byte, plus BOS/EOS: len + 2 always suffices, but ask again on
    # the (negative) size llama.cpp reports rather than trust that.
    capacity = len(data) + 2
    while True:
        buffer = (llama.llama_token * capacity)()
        count = int(
            llama.llama_tokenize(
                vocab, data, len(data), buffer, capacity, add_special, parse_special
            )
        )
        if count >= 0:
            tokens: list[int] = buffer[:count]
            return tokens
        if -count <= capacity:
            raise ValueError("llama_tokenize failed")
        capacity = -count


MAX_TOKENIZE_BYTES: Final = (1 << 31) - 1
"""llama_tokenize takes the text length as an int32_t."""


def tokenize_at_most(
    llama: ModuleType, vocab: Any, text: str, limit: int, *, add_special: bool = True
) -> tuple[list[int] | None, int]:
    """The tokens of ``text`` if there are at most ``limit`` (None otherwise), and how many there
    are (at least 2**31 when llama.cpp reports an int32 overflow).

    The buffer holds ``limit + 1`` tokens whatever the text's size: llama_tokenize still counts a
    longer text and returns minus the count (INT32_MIN when the count overflows int32), so a huge
    prompt costs its tokenization, never a buffer of its size.
    """
    data = text.encode("utf-8")
    if len(data) > MAX_TOKENIZE_BYTES:
        # Not counted: only "more than the limit" is known (2 GiB of text is millions of tokens
        # even with long tokens).
        return None, limit + 1
    capacity = limit + 1
    buffer = (llama.llama_token * capacity)()
    count = int(llama.llama_tokenize(vocab, data, len(data), buffer, capacity, add_special, True))
    if count < 0:
        return None, -count
    if count > limit:
        return None, count
    tokens: list[int] = buffer[:count]
    return tokens, count


def model_chat_template(llama: ModuleType, model: Any, name: str | None = None) -> str | None:
    """The model's chat template text (``tokenizer.chat_template``, or
    ``tokenizer.chat_template.NAME`` for a ``name``), or ``None`` when it has none."""
    raw = llama.llama_model_chat_template(model, None if name is None else name.encode("utf-8"))
    if not raw:
        return None
    return bytes(raw).decode("utf-8", errors="replace")


def token_piece(llama: ModuleType, vocab: Any, token: int) -> bytes:
    """A token's bytes with special tokens rendered (``<|im_start|>``), as llama-server's
    ``/tokenize`` pieces and ``/detokenize`` show them."""
    buffer = ctypes.create_string_buffer(_PIECE_BUFFER_BYTES)
    size = int(llama.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, True))
    if size < 0:
        buffer = ctypes.create_string_buffer(-size)
        size = int(llama.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, True))
    return buffer.raw[: max(size, 0)]


def token_text(llama: ModuleType, vocab: Any, token: int) -> str:
    """A token's text with special tokens rendered (``<|im_start|>``), as chat templates see
    ``bos_token``/``eos_token``; empty for no token (-1)."""
    if token < 0:
        return ""
    return token_piece(llama, vocab, token).decode("utf-8", errors="replace")


class Detokenizer:
    """Incremental token -> text for one generation; never yields a partial UTF-8 character.

    Token pieces are cached per instance (one llama.cpp call per distinct token). Control tokens
    render as nothing (``special=False``), which is what a completion stream should show.
    """

    __slots__ = ("_buffer", "_decoder", "_llama", "_pieces", "_vocab")

    def __init__(self, llama: ModuleType, vocab: Any, pieces: dict[int, bytes] | None = None):
        self._llama = llama
        self._vocab = vocab
        # Sharing ``pieces`` between generations of one model is safe: a token's piece is a
        # pure function of the vocabulary.
        self._pieces: dict[int, bytes] = {} if pieces is None else pieces
        self._buffer = ctypes.create_string_buffer(_PIECE_BUFFER_BYTES)
        # errors="replace": invalid bytes become U+FFFD immediately; an incomplete but still
        # valid prefix of a character stays inside the decoder until it completes.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def piece(self, token: int) -> bytes:
        """The raw bytes of one token (may be part of a multi-byte character)."""
        cached = self._pieces.get(token)
        if cached is not None:
            return cached
        llama = self._llama
        size = int(
            llama.llama_token_to_piece(
                self._vocab, token, self._buffer, len(self._buffer), 0, False
            )
        )
        if size < 0:
            self._buffer = ctypes.create_string_buffer(-size)
            size = int(
                llama.llama_token_to_piece(
                    self._vocab, token, self._buffer, len(self._buffer), 0, False
                )
            )
            if size < 0:
                raise ValueError("llama_token_to_piece failed")
        data = self._buffer.raw[:size]
        self._pieces[token] = data
        return data

    def push(self, token: int) -> str:
        """Text completed by ``token`` (possibly empty while a character is unfinished)."""
        return self._decoder.decode(self.piece(token))

    def flush(self) -> str:
        """End of stream: an unfinished trailing character becomes U+FFFD (never raw bytes)."""
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Stop-string detection over streamed text.

    ``push`` returns ``(releasable, stopped)``. While not stopped, ``releasable`` is all text that
    can no longer be part of a stop string; the held-back rest is at most ``longest stop - 1``
    characters (the longest suffix that is a prefix of some stop string). When a stop string
    appears, ``releasable`` is the text before its earliest occurrence and the matcher is done.
    """

    __slots__ = ("_held", "_stops", "stopped")

    def __init__(self, stops: Sequence[str]):
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    @property
    def active(self) -> bool:
        """False when there are no stop strings (then ``push`` is the identity)."""
        return bool(self._stops)

    def push(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self._stops:
            return text, False
        window = self._held + text
        cut = -1
        for stop in self._stops:
            index = window.find(stop)
            if index >= 0 and (cut < 0 or index < cut):
                cut = index
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return window[:cut], True
        keep_from = self._hold_start(window)
        self._held = window[keep_from:]
        return window[:keep_from], False

    def _hold_start(self, window: str) -> int:
        """Start of the longest suffix of ``window`` that is a proper prefix of a stop string.

        Candidate starts are found with ``str.find`` on each stop's first character, so the cost
        is linear in the window tail, with no table of prefixes (a long stop string stays cheap).
        """
        size = len(window)
        best = size
        for stop in self._stops:
            first = stop[0]
            index = window.find(first, max(0, size - len(stop) + 1))
            while 0 <= index < best:
                if stop.startswith(window[index:]):
                    best = index
                    break
                index = window.find(first, index + 1)
        return best

    def flush(self) -> str:
        """End of stream without a stop: the held-back text is ordinary completion text."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
