"""How a command reaches the runtime: launch or attach, or exit with the reason it cannot.

A command that needs the runtime calls `attach_or_exit`: it gets a connected client, or the
process exits with the documented code and a message (never a traceback). The client package
(httpx) is imported when a command attaches, not when it is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.output import fail
from skippyctl.cli.settings import runtime_settings

if TYPE_CHECKING:
    from skippyctl.client.http import RuntimeClient
    from skippyctl.config.runtime_settings import RuntimeSettings


def runtime_dir_hint(settings: RuntimeSettings) -> str:
    """Where the runtime directory is, for people (stderr only)."""
    from skippyctl.client.discovery import runtime_dir

    return f"runtime directory: {runtime_dir(settings)} (SKIPPY_RUNTIME_DIR overrides it)"


def attach_or_exit(command: str, json_output: bool, autostart: bool = True) -> RuntimeClient:
    """Launch-or-attach; exit 3 (with a message, never a traceback) when no runtime answers,
    10 when a setting is invalid (SKIPPY_PORT, …: cli/settings.py)."""
    from skippyctl.client.http import RuntimeUnreachable
    from skippyctl.client.launch import connect

    settings = runtime_settings(command, json_output)
    try:
        return connect(settings, autostart=autostart)
    except RuntimeUnreachable as error:
        fail(
            command,
            ExitCode.RUNTIME_UNREACHABLE,
            str(error),
            json_output,
            hint=runtime_dir_hint(settings),
        )
