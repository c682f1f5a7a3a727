"""What a process takes from its environment: one :class:`RuntimeSettings`, read once at start.

Contract:

- This is the only module of skippyctl that reads ``os.environ``
  (``tests/config/test_environment_reads.py`` holds every other module to that, with a short
  allow-list). :func:`read_runtime_settings` is called once, by the process's entry: the CLI's
  root callback reads the settings for the command that runs and keeps them on click's context
  (``cli/settings.py``) — ``skippyctl runtime serve`` is such a command, so the runtime host
  gets the same object — and from there they are passed down explicitly: to the client
  (discovery, launch), to the composition root (``daemon/serve.py``), and from it to the host,
  the scheduler and the engines' options.
- Engine workers, plugin sidecars and stage workers read no settings: what the host decided
  reaches an engine as command-line arguments (``engine/options.py``), the test fault
  injections included.
- Each setting is one field of :class:`RuntimeSettings`, its :class:`Setting` (the field's
  metadata) says its variable, how a value is parsed and checked, and what it does;
  ``runtime serve --help`` and the README's table are rendered from them (:func:`help_text`,
  :func:`markdown_table`). A new setting is one field here. Variable names are contracts.
- An unset or blank variable is the field's default. An invalid value is an
  :class:`InvalidSettings` (reason ``invalid_configuration``: exit 10 at the CLI, a refused
  start for ``runtime serve``) naming each variable and why; a credential's value is never
  repeated.
- Variables that third-party code reads for itself stay with it: ``HF_*`` (huggingface_hub),
  ``OTEL_*`` (the OpenTelemetry SDK; they are handed to the OTLP configuration as read,
  :attr:`RuntimeSettings.otel_environment`), ``TMPDIR`` (``tempfile``).
- :func:`inherited_environment` is how a child process gets this process's environment (a copy,
  with variables dropped or set); nothing in it is read as configuration.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import re
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

INVALID_CONFIGURATION: Final = "invalid_configuration"
"""The reason code of an invalid setting (exit code 10 at the CLI)."""
MAX_PORT: Final = 65535
DEFAULT_PORT: Final = 8750
DEFAULT_LINK_PROBE_INTERVAL_MS: Final = 1000.0
DEFAULT_DEVICE_LOW_FREE_PCT: Final = 10.0
"""A device with less free memory than this share of its total is degraded (ggml's figures)."""
DEFAULT_ENGINE_UNRESPONSIVE_S: Final = 5.0
DEFAULT_SESSION_STATE_MAX_MIB: Final = 256
MIN_LINK_PROBE_INTERVAL_MS: Final = 10.0
OTEL_PREFIX: Final = "OTEL_"
HUB_VERBOSITY_VARIABLE: Final = "HF_HUB_VERBOSITY"
_SHOWN_VALUE_CHARS: Final = 32
_TRUE: Final = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE: Final = frozenset({"0", "false", "f", "no", "n", "off"})
"""Click's spellings of a boolean, which ``SKIPPY_DEBUG_TOKEN_EVENTS`` accepted when Typer
read it; every flag takes them."""
_BEARER_TOKEN: Final = re.compile(r"[\x21-\x7e]+")
"""What a discovery file's token may be (client/discovery.py): printable ASCII, no spaces."""


class EngineStderr(StrEnum):
    """Where engine processes' stderr goes (``SKIPPY_ENGINE_STDERR``)."""

    DISCARD = "discard"
    INHERIT = "inherit"


class InvalidSettings(ValueError):
    """One or more variables hold a value their setting refuses; ``problems`` says, per
    variable, why (a credential's value is not repeated)."""

    reason: Final = INVALID_CONFIGURATION

    def __init__(self, problems: tuple[str, ...]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class Setting:
    """How one setting is read from the environment and documented."""

    variable: str
    parse: Callable[[str], Any]
    """A variable's value (not blank) → the field's value; ValueError says why not."""
    values: str
    """What a value looks like, for people (``N``, ``DIR``, ``on/off``)."""
    help: str
    secret: bool = False
    """A credential: its value never appears in a message."""


def _setting(
    default: Any,
    variable: str,
    parse: Callable[[str], Any],
    values: str,
    help: str,
    *,
    secret: bool = False,
) -> Any:
    return field(
        default=default,
        repr=not secret,  # a credential stays out of reprs, logs and tracebacks
        metadata={"setting": Setting(variable, parse, values, help, secret)},
    )


# -- parsers: a value that is not blank → the field's value, or ValueError(why) ------------------


def _path(raw: str) -> Path:
    return Path(raw)


def _port(raw: str) -> int:
    try:
        port = int(raw.strip())
    except ValueError:
        port = -1
    if not 0 <= port <= MAX_PORT:
        raise ValueError(f"is not a port number (0-{MAX_PORT}; 0: any free port)")
    return port


def _flag(raw: str) -> bool:
    word = raw.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError("is not a flag (1, true, yes or on; 0, false, no or off)")


def _bearer_token(raw: str) -> str:
    if not _BEARER_TOKEN.fullmatch(raw):
        raise ValueError("is not a usable bearer token (printable ASCII without spaces)")
    return raw


def _whole(minimum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise ValueError(f"is not a whole number of at least {minimum}")
        return value

    return parse


def _number(minimum: float, *, exclusive: bool = False) -> Callable[[str], float]:
    bound = f"above {minimum:g}" if exclusive else f"of at least {minimum:g}"

    def parse(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < minimum or (exclusive and value == minimum):
            raise ValueError(f"is not a number {bound}")
        return value

    return parse


def _iso_date(raw: str) -> str:
    try:
        return datetime.date.fromisoformat(raw.strip()).isoformat()
    except ValueError:
        raise ValueError("is not a date (YYYY-MM-DD)") from None


def _engine_stderr(raw: str) -> EngineStderr:
    try:
        return EngineStderr(raw.strip().lower())
    except ValueError:
        choices = " or ".join(choice.value for choice in EngineStderr)
        raise ValueError(f"is not {choices}") from None


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """Every setting a CLI or runtime process takes from its environment (module docstring).

    Construct freely in code (the defaults are the operator defaults); a process's own are read
    once by :func:`read_runtime_settings`."""

    runtime_dir: Path | None = _setting(
        None,
        "SKIPPY_RUNTIME_DIR",
        _path,
        "DIR",
        "Where the discovery file, the runtime log and saved session state live (default:"
        " $XDG_RUNTIME_DIR/skippyctl, else /run/user/UID/skippyctl, else"
        " TMPDIR/runtime-UID/skippyctl, the first that is a private directory).",
    )
    xdg_runtime_dir: Path | None = _setting(
        None,
        "XDG_RUNTIME_DIR",
        _path,
        "DIR",
        "The freedesktop user runtime directory: the default runtime directory is under it"
        " when it is an absolute, private (0700) directory of this user.",
    )
    port: int = _setting(
        DEFAULT_PORT,
        "SKIPPY_PORT",
        _port,
        "N",
        "Port of `runtime serve`/`start` without --port, and of a runtime launched on demand"
        " (0: any free port).",
    )
    api_key: str | None = _setting(
        None,
        "SKIPPY_API_KEY",
        _bearer_token,
        "TOKEN",
        "Bearer token of `runtime serve`/`start` without --api-key (generated when absent).",
        secret=True,
    )
    debug_token_events: bool = _setting(
        False, "SKIPPY_DEBUG_TOKEN_EVENTS", _flag, "on/off", "As --debug-token-events."
    )
    session_state_max_mib: int = _setting(
        DEFAULT_SESSION_STATE_MAX_MIB,
        "SKIPPY_SESSION_STATE_MAX_MIB",
        _whole(0),
        "MIB",
        "Cap of the session KV files an unload keeps for the next load of the model"
        " (0: sessions are not saved).",
    )
    engine_unresponsive_s: float = _setting(
        DEFAULT_ENGINE_UNRESPONSIVE_S,
        "SKIPPY_ENGINE_UNRESPONSIVE_S",
        _number(0.0, exclusive=True),
        "S",
        "Seconds of silence from a serving engine before `model_degraded`.",
    )
    device_low_free_pct: float = _setting(
        DEFAULT_DEVICE_LOW_FREE_PCT,
        "SKIPPY_DEVICE_LOW_FREE_PCT",
        _number(0.0, exclusive=True),
        "PCT",
        "A device a model serves on whose free memory (ggml's; the CPU's: MemAvailable),"
        " sampled every 5 s, falls below this % of its total is `device_degraded`;"
        " `device_recovered` above 1.5x it.",
    )
    stage_link_probe_ms: float = _setting(
        DEFAULT_LINK_PROBE_INTERVAL_MS,
        "SKIPPY_STAGE_LINK_PROBE_MS",
        _number(MIN_LINK_PROBE_INTERVAL_MS),
        "MS",
        "How often a split model's engine probes each stage link (at least 10).",
    )
    serving_events: bool = _setting(
        True,
        "SKIPPY_SERVING_EVENTS",
        _flag,
        "on/off",
        "off: benchmark baseline only, no serving events (requests, generation, sessions,"
        " KV); model lifecycle still reported. Not for normal operation.",
    )
    compute_turns: bool = _setting(
        True,
        "SKIPPY_COMPUTE_TURNS",
        _flag,
        "on/off",
        "off: the runtime's engines compute at the same time (two models decoding together"
        " then slow each other down many times over; for measurement only).",
    )
    capture_native_log: bool = _setting(
        False,
        "SKIPPY_CAPTURE_NATIVE_LOG",
        _flag,
        "on/off",
        "Keep llama.cpp's raw log lines in the engines' opt-in debug ring"
        " (/api/runtime/diagnostics/native-log; never parsed).",
    )
    engine_stderr: EngineStderr = _setting(
        EngineStderr.DISCARD,
        "SKIPPY_ENGINE_STDERR",
        _engine_stderr,
        "discard/inherit",
        "inherit: engine processes write to the runtime's stderr (debugging).",
    )
    native_library: Path | None = _setting(
        None,
        "SKIPPY_NATIVE_LIBRARY",
        _path,
        "PATH",
        "Use this build of the native event library (default: the one built in the package).",
    )
    native_disabled: bool = _setting(
        False,
        "SKIPPY_NATIVE_DISABLE",
        _flag,
        "on/off",
        "on: run without the native event library (legacy mode).",
    )
    test_progress_delay_us: int = _setting(
        0,
        "SKIPPY_TEST_PROGRESS_DELAY_US",
        _whole(0),
        "US",
        "Test fault injection: engines delay each native load-progress callback (slow loads).",
    )
    test_decode_delay_ms: float = _setting(
        0.0,
        "SKIPPY_TEST_DECODE_DELAY_MS",
        _number(0.0),
        "MS",
        "Test fault injection: every llama_decode of the engines takes at least this long"
        " (slow decodes).",
    )
    test_template_date: str | None = _setting(
        None,
        "SKIPPY_TEST_TEMPLATE_DATE",
        _iso_date,
        "DATE",
        "Test fault injection: chat templates that print today's date (strftime_now) print this"
        " day (YYYY-MM-DD) instead, so renders compare with goldens made on it.",
    )
    test_engine_as_limit_mib: int | None = _setting(
        None,
        "SKIPPY_TEST_ENGINE_AS_LIMIT_MB",
        _whole(1),
        "MIB",
        "Test fault injection: engines run under an address-space limit (RLIMIT_AS) this many"
        " MiB above what they map once llama.cpp is loaded.",
    )
    fleet_file: Path | None = _setting(
        None,
        "SKIPPY_FLEET_FILE",
        _path,
        "FILE",
        "The fleet file `fleet`, `--fleet` views and `--node` read (default: fleet.toml in the"
        " user's config directory, ~/.config/skippyctl on Linux).",
    )
    otel_environment: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), repr=False
    )
    """The ``OTEL_*`` variables as read, for the OTLP configuration (``telemetry/otlp.py``):
    the OpenTelemetry SDK's specification, not settings of this project (they may hold
    credentials: headers)."""
    hub_verbosity_set: bool = False
    """Whether ``HF_HUB_VERBOSITY`` is set: huggingface_hub reads it itself, and a pull then
    leaves the hub's logging as the user chose (``cli/pull.py``)."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> RuntimeSettings:
        """The settings ``environ`` holds; raises :class:`InvalidSettings` for every variable
        whose value its setting refuses."""
        values: dict[str, Any] = {}
        problems: list[str] = []
        for name, setting in settings_table():
            raw = environ.get(setting.variable)
            if raw is None or not raw.strip():
                continue
            try:
                values[name] = setting.parse(raw)
            except ValueError as error:
                shown = "" if setting.secret else f"={raw.strip()[:_SHOWN_VALUE_CHARS]!r}"
                problems.append(f"{setting.variable}{shown} {error}")
        if problems:
            raise InvalidSettings(tuple(problems))
        otel = {k: v for k, v in environ.items() if k.startswith(OTEL_PREFIX)}
        return cls(
            **values,
            otel_environment=MappingProxyType(otel),
            hub_verbosity_set=HUB_VERBOSITY_VARIABLE in environ,
        )


def settings_table() -> tuple[tuple[str, Setting], ...]:
    """Every setting as (field name, :class:`Setting`), in field order."""
    return tuple(
        (f.name, f.metadata["setting"])
        for f in dataclasses.fields(RuntimeSettings)
        if "setting" in f.metadata
    )


def read_runtime_settings() -> RuntimeSettings:
    """This process's settings, from its environment; call once, at the process's entry
    (module docstring). Raises :class:`InvalidSettings`."""
    return RuntimeSettings.from_environment(os.environ)


def variable_a_file_names(name: str) -> str | None:
    """The value of a variable a configuration file names by its name (a fleet entry's
    `key_env`: where that node's API key is), read when it is needed. Not a setting: which
    variable it is, is the operator's choice."""
    return os.environ.get(name)


def inherited_environment(
    drop: Collection[str] = (), overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """This process's environment for a child process: a copy without ``drop``, with
    ``overrides`` set. The child reads its own settings from it (``runtime serve``) or none."""
    environment = {k: v for k, v in os.environ.items() if k not in drop}
    environment.update(overrides or {})
    return environment


def python_module_command(module: str, python: str = sys.executable) -> list[str]:
    """The command that runs ``module`` of this install in a child Python. ``-P``: the child's
    working directory is not put first on its module path, so a directory that holds another
    ``skippyctl/`` (a checkout, a download) never supplies the runtime's, an engine's or a
    stage's code."""
    return [python, "-P", "-m", module]


def _shown_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def markdown_table() -> str:
    """The README's table of settings (between its ``runtime-settings`` markers)."""
    defaults = RuntimeSettings()
    lines = ["| variable | value | default | effect |", "|---|---|---|---|"]
    for name, setting in settings_table():
        default = _shown_default(getattr(defaults, name))
        lines.append(f"| `{setting.variable}` | `{setting.values}` | {default} | {setting.help} |")
    return "\n".join(lines) + "\n"


def help_text() -> str:
    """The settings for ``runtime serve --help``: one paragraph per variable."""
    defaults = RuntimeSettings()
    paragraphs = ["Settings from the environment (read once at start; an invalid value: exit 10):"]
    for name, setting in settings_table():
        default = _shown_default(getattr(defaults, name))
        paragraphs.append(
            f"{setting.variable}={setting.values} (default {default}): {setting.help}"
        )
    return "\n\n".join(paragraphs)
