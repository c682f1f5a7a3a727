"""Model presets: a TOML file naming the models a runtime may load on demand, with their options.

One table per model under ``[models]``; its key is the model id requests name, and its keys are
the load options of :class:`~skippyctl.config.load_options.LoadOptions` by their JSON names
(``ctx``, ``lanes``, ``spec``, ``draft``, ``ttl``, ``pinned``, …) with ``model`` the file::

    [models.qwen]
    model = "qwen2.5-0.5b-instruct-q4_k_m.gguf"   # relative: to this file's directory
    lanes = 2
    ttl = 300

    [models.coder]
    model = "hf://Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/qwen2.5-coder-0.5b-instruct-q8_0.gguf"
    pinned = true

``model`` is a local GGUF (a relative path is taken relative to the presets file, as are
``draft`` and ``chat_template``) or an ``hf://`` reference, prepared from the hub's cache (or
downloaded into it) when the model is first wanted. ``alias`` is the table's key and may not be
given. Every problem is a :class:`PresetsError` naming the model and the key, never a value.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from skippyctl.config.load_options import OPTIONS, LoadOptions, is_choice
from skippyctl.events.envelope import InvalidLogicalId, LogicalId

MAX_PRESETS_BYTES: Final = 1024 * 1024
MAX_PRESETS: Final = 1024
_PATH_KEYS: Final = ("model", "draft", "chat_template")
_BY_NAME: Final = {spec.name: spec for spec in OPTIONS}


class PresetsError(ValueError):
    """The presets file cannot be used; the message says where (model and key), never a value."""


@dataclass(frozen=True, slots=True)
class Preset:
    """One model a runtime may load on demand."""

    model_id: LogicalId
    options: LoadOptions
    """Its load: ``alias`` is ``model_id``; ``model`` a local path or an ``hf://`` reference."""

    @property
    def from_hub(self) -> bool:
        return self.options.model.startswith("hf://")


def read_presets(path: Path) -> dict[LogicalId, Preset]:
    """The presets in the TOML file at ``path`` (PresetsError when it cannot be read or used)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_PRESETS_BYTES + 1)
    except OSError as error:
        raise PresetsError(f"cannot read the presets file: {error.strerror}") from error
    if len(raw) > MAX_PRESETS_BYTES:
        raise PresetsError(f"the presets file is larger than {MAX_PRESETS_BYTES} bytes")
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise PresetsError(f"the presets file is not TOML: {error}") from error
    return parse_presets(document, path.resolve().parent)


def parse_presets(document: Mapping[str, Any], base: Path) -> dict[LogicalId, Preset]:
    """The presets of a parsed TOML document; relative paths are taken relative to ``base``."""
    unknown = sorted(set(document) - {"models"})
    if unknown:
        raise PresetsError(f"unknown top-level key '{unknown[0]}' (presets go under [models])")
    models = document.get("models", {})
    if not isinstance(models, dict):
        raise PresetsError("[models] must be a table of models")
    if len(models) > MAX_PRESETS:
        raise PresetsError(f"at most {MAX_PRESETS} presets")
    presets: dict[LogicalId, Preset] = {}
    for name, table in models.items():
        try:
            model_id = LogicalId(name)
        except InvalidLogicalId:
            raise PresetsError(
                "a preset's name is its model id: 1-64 characters of [A-Za-z0-9._:+=-]"
            ) from None
        if not isinstance(table, dict):
            raise PresetsError(f"preset '{model_id}' must be a table")
        presets[model_id] = Preset(model_id, _options(model_id, table, base))
    return presets


def _options(model_id: LogicalId, table: Mapping[str, Any], base: Path) -> LoadOptions:
    values: dict[str, Any] = {}
    for key, value in table.items():
        spec = _BY_NAME.get(key)
        if spec is None:
            raise PresetsError(f"preset '{model_id}': unknown key '{key}'")
        if key == "alias":
            raise PresetsError(f"preset '{model_id}': the table's name is its id; drop 'alias'")
        values[key] = _typed(model_id, key, spec.kind, value)
    if "model" not in values:
        raise PresetsError(f"preset '{model_id}': 'model' (a GGUF file or hf:// ref) is needed")
    for key in _PATH_KEYS:
        text = values.get(key)
        if isinstance(text, str) and not text.startswith("hf://"):
            values[key] = str(base / Path(text).expanduser())
    options = LoadOptions(**values, alias=str(model_id))
    problem = options.problem()
    if problem is not None:
        raise PresetsError(f"preset '{model_id}': {problem}")
    return options


def _typed(model_id: LogicalId, key: str, kind: type, value: Any) -> Any:
    """``value`` as the option's type (TOML's types are close: an int may stand for a float, a
    list of strings is a tuple)."""
    kind_name = (
        "one of " + ", ".join(member.value for member in kind)
        if is_choice(kind)
        else _KIND_NAMES.get(kind, "text")
    )
    wrong = PresetsError(f"preset '{model_id}': '{key}' must be {kind_name}")
    if kind is bool:
        if not isinstance(value, bool):
            raise wrong
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise wrong
        return float(value)
    if kind is tuple:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise wrong
        return tuple(value)
    if is_choice(kind):
        if not isinstance(value, str) or value not in {member.value for member in kind}:
            raise wrong
        return kind(value)
    if not isinstance(value, str):
        raise wrong
    return value


_KIND_NAMES: Final = {
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    tuple: "a list of strings",
}


def write_preset(path: Path, model_id: LogicalId, values: Mapping[str, Any]) -> None:
    """Set preset ``model_id`` of the presets file at ``path`` to ``values`` (load options by
    their JSON names, ``model`` among them), keeping the file's other presets; the file is
    created when missing and replaced whole (atomically), so its comments are not kept.
    PresetsError when the result would not read back."""
    document: dict[str, Any] = {"models": {}}
    if path.exists():
        read_presets(path)  # refuses a file that is not a presets file
        with path.open("rb") as handle:
            document = tomllib.load(handle)
        document.setdefault("models", {})
    document["models"][str(model_id)] = dict(values)
    text = _dump(document)
    parse_presets(tomllib.loads(text), path.resolve().parent)  # what is written reads back
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)


def _dump(document: Mapping[str, Any]) -> str:
    lines: list[str] = []
    for name, table in document["models"].items():
        lines.append(f"[models.{_key(name)}]")
        for key, value in table.items():
            lines.append(f"{key} = {_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _key(name: str) -> str:
    return name if all(c.isalnum() or c in "_-" for c in name) else _string(name)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    return _string(str(value))


def _string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'
