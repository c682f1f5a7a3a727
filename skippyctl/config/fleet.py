"""The fleet file: the runtimes one operator watches and steers (`skippyctl fleet …`, `--fleet`).

A TOML file, by default `fleet.toml` in the user's config directory (platformdirs), or the one
`--fleet FILE` or SKIPPY_FLEET_FILE names. One table per remote runtime:

    [nodes.gpu1]
    url = "https://10.0.0.5:8421"
    key_file = "/home/op/.config/skippyctl/gpu1.key"   # or key_env = "GPU1_SKIPPY_KEY"
    cert = "/home/op/.config/skippyctl/gpu1.pem"        # optional: trust exactly this

The API key is never inline: an entry names a file that holds it or an environment variable
that does, so the file can be shared and a key never lands in a record, argv or a shell history.
`cert` pins the certificate a `https` node must present (its PEM; without it the system's CA
store decides). The local runtime (the one the discovery file names) is always a member, named
`local`; it is not written to the file.

This module parses, checks and writes the file; it reaches no runtime (skippyctl.client.fleet
does). Every refusal is a `FleetError` with a stable reason code and a message without the
key itself.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

APP_NAME: Final = "skippyctl"
LOCAL_NODE: Final = "local"
"""The member every fleet has: the runtime this user's discovery file names."""
FLEET_FILE_NAME: Final = "fleet.toml"
NODE_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
_ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENTRY_KEYS: Final = frozenset({"url", "key_file", "key_env", "cert"})
MAX_NODES: Final = 64


class FleetError(Exception):
    """The fleet file or an entry cannot be used; `reason` is a stable reason code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class FleetEntry:
    """One remote runtime: where it answers, where its key comes from, what it must present."""

    name: str
    url: str
    key_file: Path | None = None
    key_env: str | None = None
    cert: Path | None = None

    def __post_init__(self) -> None:
        check_node_name(self.name)
        check_url(self.name, self.url)
        if self.key_file is not None and self.key_env is not None:
            raise FleetError(
                "fleet_entry_invalid",
                f"node {self.name!r}: give key_file or key_env, not both",
            )
        if self.key_env is not None and not _ENV_NAME.match(self.key_env):
            raise FleetError(
                "fleet_entry_invalid",
                f"node {self.name!r}: key_env must be an environment variable's name",
            )
        if self.cert is not None and urlsplit(self.url).scheme != "https":
            raise FleetError(
                "fleet_entry_invalid",
                f"node {self.name!r}: cert pins a TLS certificate; the url must be https://",
            )

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "https"

    def key_source(self) -> str:
        """Where the key comes from, for people and records (never the key)."""
        if self.key_env is not None:
            return f"env:{self.key_env}"
        if self.key_file is not None:
            return "file"
        return "none"

    def read_key(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The API key from its file or variable (None when the entry names none); `environ`
        stands for the process's environment (tests)."""
        if self.key_env is not None:
            if environ is None:
                from skippyctl.config.runtime_settings import variable_a_file_names

                value = (variable_a_file_names(self.key_env) or "").strip()
            else:
                value = environ.get(self.key_env, "").strip()
            if not value:
                raise FleetError(
                    "fleet_key_unavailable",
                    f"node {self.name!r}: environment variable {self.key_env} is not set",
                )
            return value
        if self.key_file is not None:
            try:
                value = self.key_file.expanduser().read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as error:
                detail = getattr(error, "strerror", None) or type(error).__name__
                raise FleetError(
                    "fleet_key_unavailable",
                    f"node {self.name!r}: its key file cannot be read ({detail})",
                ) from error
            if not value:
                raise FleetError(
                    "fleet_key_unavailable", f"node {self.name!r}: its key file is empty"
                )
            return value
        return None


@dataclass(frozen=True, slots=True)
class Fleet:
    """The remote members, in the order the file lists them (the local runtime is implied)."""

    entries: tuple[FleetEntry, ...] = ()
    path: Path | None = field(default=None, compare=False)

    def names(self) -> tuple[str, ...]:
        return (LOCAL_NODE, *(entry.name for entry in self.entries))

    def entry(self, name: str) -> FleetEntry | None:
        return next((e for e in self.entries if e.name == name), None)

    def with_entry(self, entry: FleetEntry, replace: bool = False) -> Fleet:
        if entry.name == LOCAL_NODE:
            raise FleetError("fleet_name_reserved", f"{LOCAL_NODE!r} is the local runtime's name")
        if self.entry(entry.name) is not None and not replace:
            raise FleetError(
                "fleet_node_exists",
                f"node {entry.name!r} is already in the fleet (--replace to change it)",
            )
        kept = tuple(e for e in self.entries if e.name != entry.name)
        if len(kept) >= MAX_NODES:
            raise FleetError("fleet_too_large", f"a fleet holds at most {MAX_NODES} nodes")
        return Fleet((*kept, entry), self.path)

    def without(self, name: str) -> Fleet:
        if self.entry(name) is None:
            raise FleetError("fleet_node_unknown", unknown_node_message(self, name))
        return Fleet(tuple(e for e in self.entries if e.name != name), self.path)


def unknown_node_message(fleet: Fleet, name: str) -> str:
    return f"no node {name!r} in the fleet (nodes: {', '.join(fleet.names())})"


def check_node_name(name: str) -> None:
    if not NODE_NAME.match(name):
        raise FleetError(
            "fleet_entry_invalid",
            f"node name {name!r}: 1-32 of a-z, 0-9, '_' and '-', starting with a letter or digit",
        )


def check_url(name: str, url: str) -> None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise FleetError("fleet_entry_invalid", f"node {name!r}: url: {error}") from error
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise FleetError(
            "fleet_entry_invalid",
            f"node {name!r}: url must be http(s)://HOST:PORT (got {url!r})",
        )
    if parts.username or parts.password or parts.query or parts.fragment:
        raise FleetError(
            "fleet_entry_invalid",
            f"node {name!r}: url carries no credentials, query or fragment "
            "(the key goes in key_file or key_env)",
        )


def default_fleet_path(named: Path | None = None) -> Path:
    """`named` (--fleet FILE, else SKIPPY_FLEET_FILE), else fleet.toml in the user's config
    directory."""
    if named is not None:
        return named.expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir(APP_NAME, ensure_exists=False)) / FLEET_FILE_NAME


def read_fleet(path: Path) -> Fleet:
    """The fleet in `path`; an empty fleet when the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Fleet((), path)
    except (OSError, UnicodeDecodeError) as error:
        detail = getattr(error, "strerror", None) or type(error).__name__
        raise FleetError(
            "fleet_file_unreadable", f"the fleet file cannot be read ({detail})"
        ) from error
    return parse_fleet(text, path)


def parse_fleet(text: str, path: Path | None = None) -> Fleet:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise FleetError("fleet_file_invalid", f"the fleet file is not TOML: {error}") from error
    unknown = set(document) - {"nodes"}
    if unknown:
        raise FleetError(
            "fleet_file_invalid", f"the fleet file has unknown tables: {', '.join(sorted(unknown))}"
        )
    nodes = document.get("nodes", {})
    if not isinstance(nodes, dict):
        raise FleetError("fleet_file_invalid", "`nodes` must be a table of tables")
    fleet = Fleet((), path)
    for name, table in nodes.items():
        fleet = fleet.with_entry(_entry(name, table))
    return fleet


def _entry(name: str, table: object) -> FleetEntry:
    if not isinstance(table, dict):
        raise FleetError("fleet_entry_invalid", f"node {name!r} must be a table")
    if "key" in table or "api_key" in table or "token" in table:
        raise FleetError(
            "fleet_key_inline",
            f"node {name!r}: a key is never written in the fleet file; "
            "name a key_file or a key_env instead",
        )
    unknown = set(table) - _ENTRY_KEYS
    if unknown:
        raise FleetError(
            "fleet_entry_invalid",
            f"node {name!r}: unknown fields {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(_ENTRY_KEYS))})",
        )
    for key, value in table.items():
        if not isinstance(value, str) or not value:
            raise FleetError("fleet_entry_invalid", f"node {name!r}: {key} must be a string")
    return FleetEntry(
        name=name,
        url=table.get("url", ""),
        key_file=Path(table["key_file"]) if "key_file" in table else None,
        key_env=table.get("key_env"),
        cert=Path(table["cert"]) if "cert" in table else None,
    )


def _toml_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped) + '"'


def render_fleet(fleet: Fleet) -> str:
    lines = [
        "# skippyctl fleet: the runtimes `--fleet` views watch and `--node` steers.",
        "# Keys are never written here: key_file names a file holding one, key_env a variable.",
    ]
    for entry in fleet.entries:
        lines += ["", f"[nodes.{entry.name}]", f"url = {_toml_string(entry.url)}"]
        if entry.key_file is not None:
            lines.append(f"key_file = {_toml_string(str(entry.key_file))}")
        if entry.key_env is not None:
            lines.append(f"key_env = {_toml_string(entry.key_env)}")
        if entry.cert is not None:
            lines.append(f"cert = {_toml_string(str(entry.cert))}")
    return "\n".join(lines) + "\n"


def write_fleet(fleet: Fleet, path: Path) -> None:
    """Write `fleet` to `path` atomically (a temporary file renamed over it), mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(render_fleet(fleet))
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
