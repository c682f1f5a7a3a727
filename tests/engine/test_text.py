"""Tokenization, streaming detokenization and stop strings on real llama.cpp."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from skippyctl.engine.text import Detokenizer, StopMatcher, tokenize
from skippyctl.fixtures.vocab import BOS_ID, FIRST_BYTE_ID


def _load(path: Path) -> Any:
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        os.fsencode(path), llama_cpp.llama_model_default_params()
    )
    assert model
    return model


@pytest.fixture(scope="module")
def tiny_model(fixture_dir: Path) -> Iterator[Any]:
    model = _load(fixture_dir / "tiny.gguf")
    yield model
    llama_cpp.llama_model_free(model)


@pytest.fixture(scope="module")
def vocab(tiny_model: Any) -> Any:
    return llama_cpp.llama_model_get_vocab(tiny_model)


def _byte_token(value: int) -> int:
    return FIRST_BYTE_ID + value


# ---------------------------------------------------------------- tokenize


def test_tokenize_adds_bos_and_round_trips_text(vocab: Any) -> None:
    tokens = tokenize(llama_cpp, vocab, "Hello world é")
    assert tokens[0] == BOS_ID
    detok = Detokenizer(llama_cpp, vocab)
    text = "".join(detok.push(t) for t in tokens[1:]) + detok.flush()
    assert text == " Hello world é"  # SentencePiece's space prefix


def test_tokenize_parses_special_tokens(vocab: Any) -> None:
    tokens = tokenize(llama_cpp, vocab, "<|im_end|>", add_special=False)
    assert len(tokens) == 1
    assert llama_cpp.llama_vocab_is_eog(vocab, tokens[0])


def test_tokenize_long_text_grows_its_buffer(vocab: Any) -> None:
    text = "the quick brown fox " * 500
    assert len(tokenize(llama_cpp, vocab, text)) > 1000


# ---------------------------------------------------------------- detokenizer


def test_multibyte_character_split_over_byte_tokens_yields_no_partial_char(vocab: Any) -> None:
    # "é" is not a piece of the fixture vocabulary: it tokenizes into its two UTF-8 bytes.
    tokens = tokenize(llama_cpp, vocab, "é", add_special=False)
    assert tokens[-2:] == [_byte_token(0xC3), _byte_token(0xA9)]
    detok = Detokenizer(llama_cpp, vocab)
    assert detok.push(_byte_token(0xC3)) == ""
    assert detok.push(_byte_token(0xA9)) == "é"


def test_four_byte_character_is_held_until_complete(vocab: Any) -> None:
    detok = Detokenizer(llama_cpp, vocab)
    parts = [detok.push(_byte_token(b)) for b in "🦊".encode()]
    assert parts == ["", "", "", "🦊"]


def test_invalid_bytes_become_replacement_chars_without_stalling(vocab: Any) -> None:
    detok = Detokenizer(llama_cpp, vocab)
    assert detok.push(_byte_token(0xFF)) == "\ufffd"
    assert detok.push(_byte_token(0x41)) == "A"


def test_flush_turns_an_unfinished_character_into_one_replacement(vocab: Any) -> None:
    detok = Detokenizer(llama_cpp, vocab)
    assert detok.push(_byte_token(0xE2)) == ""
    assert detok.push(_byte_token(0x82)) == ""
    assert detok.flush() == "\ufffd"


def test_control_tokens_render_as_nothing(vocab: Any) -> None:
    im_end = tokenize(llama_cpp, vocab, "<|im_end|>", add_special=False)[0]
    assert Detokenizer(llama_cpp, vocab).push(im_end) == ""


# ---------------------------------------------------------------- stop strings


def _stream(matcher: StopMatcher, chunks: list[str]) -> tuple[list[str], bool]:
    out: list[str] = []
    for chunk in chunks:
        text, stopped = matcher.push(chunk)
        out.append(text)
        if stopped:
            return out, True
    out.append(matcher.flush())
    return out, False


def test_stop_string_spanning_two_chunks_is_cut_and_never_streamed() -> None:
    out, stopped = _stream(StopMatcher(["END"]), ["hello E", "ND world"])
    assert stopped
    assert "".join(out) == "hello "
    assert out == ["hello ", ""]


def test_text_that_could_start_a_stop_string_is_held_back_then_released() -> None:
    matcher = StopMatcher(["<stop>"])
    assert matcher.push("abc<st") == ("abc", False)
    assert matcher.push("ay") == ("<stay", False)
    assert matcher.flush() == ""


def test_held_text_is_released_at_the_end_of_the_stream() -> None:
    out, stopped = _stream(StopMatcher(["###"]), ["one #", "#"])
    assert not stopped
    assert "".join(out) == "one ##"


def test_earliest_of_several_stop_strings_wins() -> None:
    out, stopped = _stream(StopMatcher(["world", "lo w"]), ["hel", "lo world"])
    assert stopped
    assert "".join(out) == "hel"


def test_no_stop_strings_pass_text_through() -> None:
    matcher = StopMatcher(["", ""])
    assert not matcher.active
    assert matcher.push("anything") == ("anything", False)


def test_stop_string_in_a_single_chunk_with_text_after_it() -> None:
    matcher = StopMatcher(["\n\n"])
    assert matcher.push("line one\n\nline two") == ("line one", True)
    assert matcher.push("more") == ("", True)
    assert matcher.flush() == ""


_ALPHABET = "ab\n"  # a tiny alphabet makes overlapping, partial and repeated stops common


@given(
    chunks=st.lists(st.text(alphabet=_ALPHABET, max_size=4), max_size=12),
    stops=st.lists(st.text(alphabet=_ALPHABET, min_size=1, max_size=4), max_size=3),
)
@example(chunks=["ba", "b"], stops=["a", "bab"])  # a stop found before a longer one could end
def test_streamed_text_equals_the_text_before_the_earliest_stop(
    chunks: list[str], stops: list[str]
) -> None:
    # The truth is what a generation shows: it ends at the first chunk after which a stop string
    # is in the text, cut at the earliest stop in that text (a longer stop that could only have
    # completed in text never generated does not count: chunks ['ba', 'b'], stops ['a', 'bab']
    # give 'b').
    text = ""
    hits: list[int] = []
    for chunk in chunks:
        text += chunk
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            break
    expected = text[: min(hits)] if hits else text
    matcher = StopMatcher(stops)
    released = ""
    seen = ""
    stopped = False
    hold_max = max((len(s) - 1 for s in stops), default=0)
    for chunk in chunks:
        seen += chunk
        part, stopped = matcher.push(chunk)
        released += part
        # Never ahead of the truth: released text is always a prefix of the final answer...
        assert expected.startswith(released)
        if stopped:
            break
        # ...and never further behind than a stop string could still reach.
        assert len(seen) - len(released) <= hold_max
    if not stopped:
        released += matcher.flush()
    assert stopped == bool(hits)
    assert released == expected
