"""The plugin ABI's ctypes mirror is the header's layout, byte for byte: a C program compiled
against skippy_plugin.h prints every size and offset, and the mirror must agree."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from enum import IntEnum
from pathlib import Path

import pytest

from skippyctl.plugins import abi

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "native" / "include" / "skippy" / "skippy_plugin.h"


def _c_layout(tmp_path: Path) -> dict[tuple[str, str], tuple[int, int]]:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler")
    lines = ["#include <stdio.h>", '#include "skippy/skippy_plugin.h"', "int main(void) {"]
    for struct in abi.BOUNDARY_STRUCTS:
        s = struct.__name__
        lines.append(f'  printf("{s} - 0 %zu\\n", sizeof({s}));')
        for name, *_ in struct._fields_:
            lines.append(
                f'  printf("{s} {name} %zu %zu\\n", offsetof({s}, {name}),'
                f" sizeof((({s} *)0)->{name}));"
            )
    lines += ["  return 0;", "}"]
    source = tmp_path / "layout.c"
    source.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    flags = ["-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'native' / 'include'}"]
    subprocess.run([compiler, *flags, "-o", str(exe), str(source)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        struct_name, field_name, offset, size = line.split()
        rows[(struct_name, field_name)] = (int(offset), int(size))
    return rows


def test_every_struct_and_field_matches_the_compiled_header(tmp_path: Path) -> None:
    rows = _c_layout(tmp_path)
    for struct in abi.BOUNDARY_STRUCTS:
        name = struct.__name__
        assert rows[(name, "-")][1] == ctypes.sizeof(struct), name
        for field_name, *_ in struct._fields_:
            descriptor = getattr(struct, field_name)
            assert (descriptor.offset, descriptor.size) == rows[(name, field_name)], (
                name,
                field_name,
            )


def _header_structs() -> dict[str, list[str]]:
    """Each ``typedef struct NAME { ... } NAME;`` of the header → its field names, in order."""
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    found = {}
    for m in re.finditer(r"typedef struct (\w+) \{(.*?)\} \1;", text, flags=re.S):
        words = (re.findall(r"\w+", decl) for decl in m[2].split(";"))
        found[m[1]] = [names[-1] for names in words if names]
    return found


def test_the_mirror_has_exactly_the_header_structs_and_fields_in_order() -> None:
    header = _header_structs()
    mirror = {s.__name__: [name for name, *_ in s._fields_] for s in abi.BOUNDARY_STRUCTS}
    assert header == mirror


def test_versions_sizes_and_symbol_mirror_the_header() -> None:
    text = HEADER.read_text()
    defines = dict(re.findall(r"#define SKIPPY_PLUGIN_(\w+) (\d+)u\b", text))
    assert int(defines["ABI_VERSION"]) == abi.PLUGIN_ABI_VERSION == 1
    assert int(defines["V1_BASE_SIZE"]) == abi.PLUGIN_V1_BASE_SIZE
    assert abi.skippy_plugin_v1.activate.offset == abi.PLUGIN_V1_BASE_SIZE  # appended
    assert int(defines["OUTCOME_V1_BASE_SIZE"]) == abi.PLUGIN_OUTCOME_V1_BASE_SIZE
    assert abi.skippy_plugin_outcome_v1.kind.offset == abi.PLUGIN_OUTCOME_V1_BASE_SIZE
    sizes = {
        "V1_SIZE": (abi.PLUGIN_V1_SIZE, abi.skippy_plugin_v1),
        "ACTIVATION_V1_SIZE": (abi.PLUGIN_ACTIVATION_V1_SIZE, abi.skippy_plugin_activation_v1),
        "IDS_V1_SIZE": (abi.PLUGIN_IDS_V1_SIZE, abi.skippy_plugin_ids_v1),
        "TOKENS_V1_SIZE": (abi.PLUGIN_TOKENS_V1_SIZE, abi.skippy_plugin_tokens_v1),
        "BEGIN_V1_SIZE": (abi.PLUGIN_BEGIN_V1_SIZE, abi.skippy_plugin_begin_v1),
        "QUERY_V1_SIZE": (abi.PLUGIN_QUERY_V1_SIZE, abi.skippy_plugin_query_v1),
        "OUTCOME_V1_SIZE": (abi.PLUGIN_OUTCOME_V1_SIZE, abi.skippy_plugin_outcome_v1),
        "RECEIPT_V1_SIZE": (abi.PLUGIN_RECEIPT_V1_SIZE, abi.skippy_plugin_receipt_v1),
    }
    for define, (constant, struct) in sizes.items():
        assert int(defines[define]) == constant == ctypes.sizeof(struct), define
    assert f'#define SKIPPY_PLUGIN_INIT_SYMBOL "{abi.PLUGIN_INIT_SYMBOL}"' in text
    assert re.search(r"#define SKIPPY_PLUGIN_IDS_HAS_SESSION \(1u << 0\)", text)
    assert abi.IdsFlag.HAS_SESSION.value == 1


def _c_enum(prefix: str) -> dict[str, int]:
    text = HEADER.read_text()
    return {m[1]: int(m[2]) for m in re.finditer(rf"\b{prefix}([A-Z0-9_]+) = (-?\d+)", text)}


@pytest.mark.parametrize(
    ("prefix", "enum"),
    [
        ("SKIPPY_PLUGIN_STOP_", abi.StopReasonCode),
        ("SKIPPY_PLUGIN_ABORT_", abi.AbortReasonCode),
        ("SKIPPY_PLUGIN_OUTCOME_", abi.OutcomeKindCode),
        ("SKIPPY_PLUGIN_DISCARD_", abi.DiscardReasonCode),
        ("SKIPPY_PLUGIN_SPEC_", abi.SpecModeCode),
    ],
)
def test_reason_enums_mirror_the_header(prefix: str, enum: type[IntEnum]) -> None:
    assert _c_enum(prefix) == {member.name: member.value for member in enum}


def test_status_codes_mirror_the_header() -> None:
    statuses = {
        k: v
        for k, v in _c_enum("SKIPPY_PLUGIN_").items()
        if not k.startswith(("STOP_", "ABORT_", "OUTCOME_", "DISCARD_", "SPEC_"))
    }
    assert statuses == {member.name: member.value for member in abi.PluginStatus}
    assert abi.PluginStatus.OK.value == 0
    assert abi.PluginStatus.NO_PROPOSAL.value == 1
