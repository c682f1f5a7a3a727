"""How a command speaks: `--json` records on stdout, messages for people on stderr.

stdout carries data only (one JSON object a line under `--json`); stderr is for people. A command
that fails says why on stderr and, under `--json`, as one `{"record": "error"}` record with its
exit code (`fail`), so a script reads a failure as it reads a success. Rich is imported when a
message is printed, not when a command is imported (a script's `ps --json` never needs it).
"""

from __future__ import annotations

import sys
from functools import cache
from typing import TYPE_CHECKING, Any, Final, NoReturn

import orjson
import typer

from skippyctl.cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from rich.console import Console

RECORD_SCHEMA_VERSION: Final = 1


def emit_json(record: dict[str, Any]) -> None:
    """One JSON object on its own line on stdout, flushed (so `jq` sees it live)."""
    sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
    sys.stdout.buffer.flush()


@cache
def stderr_console() -> Console:
    """The console for people's messages (stderr; no highlighting, no hard wrapping)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def error_record(command: str, code: ExitCode, message: str, reason: str | None) -> dict[str, Any]:
    """The `--json` record a command prints when it fails without an event saying why."""
    record: dict[str, Any] = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "record": "error",
        "command": command,
        "exit_code": int(code),
        "message": message,
    }
    if reason is not None:
        record["reason_code"] = reason
    return record


def fail(
    command: str,
    code: ExitCode,
    message: str,
    json_output: bool,
    reason: str | None = None,
    hint: str | None = None,
) -> NoReturn:
    """Say why on stderr (and as an error record with --json), then exit with `code`.

    `hint` goes to stderr only (it may name a local path, which JSON records never carry)."""
    from rich.markup import escape

    if json_output:
        emit_json(error_record(command, code, message, reason))
    err = stderr_console()
    err.print(f"[red]✗[/] {escape(message)}")
    if hint:
        err.print(f"  {escape(hint)}")
    raise typer.Exit(int(code))
