"""The header reader against the `gguf` package's own reader, on the generated fixtures, the
real model and llama.cpp's real vocabularies; and on files cut short or tampered with."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skippyctl.acquisition.gguf_metadata import (
    MAX_KEPT_ARRAY,
    GgufArray,
    GgufMetadataError,
    read_metadata,
)

ROOT = Path(__file__).resolve().parents[2]
VOCABS = sorted((ROOT / "fixtures" / "vendor" / "vocab").glob("ggml-vocab-*.gguf"))
REAL = ROOT / "fixtures" / "real" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _files(fixture_dir: Path) -> list[Path]:
    generated = [
        fixture_dir / n for n in ("tiny.gguf", "tiny-embedding.gguf", "tiny-successor.gguf")
    ]
    return generated + [REAL, *VOCABS[:4]]


def test_every_key_value_is_what_the_gguf_package_reads(fixture_dir: Path) -> None:
    import gguf

    files = _files(fixture_dir)
    assert REAL.exists() and len(VOCABS) >= 4, "the bootstrap fetches these"
    for path in files:
        ours = read_metadata(path)
        theirs = gguf.GGUFReader(str(path)).fields
        expected = {k: f for k, f in theirs.items() if not k.startswith("GGUF.")}
        assert set(ours) == set(expected), path.name
        for key, field in expected.items():
            value = ours[key]
            if isinstance(value, GgufArray):
                contents = field.contents()
                assert value.length == len(contents), (path.name, key)
                if value.values is not None:
                    assert list(value.values) == pytest.approx(contents), (path.name, key)
                else:
                    assert value.length > MAX_KEPT_ARRAY or isinstance(contents[0], str)
            elif isinstance(value, float):
                assert value == pytest.approx(field.contents()), (path.name, key)
            else:
                assert value == field.contents(), (path.name, key)


def test_the_real_models_shape_is_read(fixture_dir: Path) -> None:
    header = read_metadata(REAL)
    assert header["general.architecture"] == "llama"
    assert header["llama.block_count"] == 30
    tokens = header["tokenizer.ggml.tokens"]
    assert isinstance(tokens, GgufArray) and tokens.length == 49152 and tokens.values is None


def test_a_broken_header_is_a_metadata_error(fixture_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(GgufMetadataError):
        read_metadata(fixture_dir / "bad-magic.gguf")
    # truncated.gguf is cut in its tensor data: its header still reads.
    assert read_metadata(fixture_dir / "truncated.gguf")["general.architecture"] == "llama"
    cut = tmp_path / "cut.gguf"
    cut.write_bytes((fixture_dir / "tiny.gguf").read_bytes()[:300])
    with pytest.raises(GgufMetadataError, match="past the end"):
        read_metadata(cut)


def test_an_empty_file_is_a_metadata_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(GgufMetadataError):
        read_metadata(empty)


@given(
    cut=st.integers(min_value=0, max_value=4096),
    flips=st.lists(st.tuples(st.integers(0, 4095), st.integers(1, 255)), max_size=4),
)
def test_a_cut_or_tampered_header_reads_or_fails_cleanly(
    fixture_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    cut: int,
    flips: list[tuple[int, int]],
) -> None:
    """Whatever bytes it holds, a file either reads or is a GgufMetadataError: never another
    exception, never a read past its end."""
    data = bytearray((fixture_dir / "tiny.gguf").read_bytes()[:cut])
    for at, mask in flips:
        if at < len(data):
            data[at] ^= mask
    path = tmp_path_factory.mktemp("cut") / "cut.gguf"
    path.write_bytes(bytes(data))
    try:
        header = read_metadata(path)
    except GgufMetadataError:
        return
    assert all(isinstance(key, str) for key in header)
