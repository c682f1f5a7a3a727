"""The CLI's settings: read once when the command line starts, handed to the commands that use them.

:func:`remember_settings` runs in the root callback (``cli/app.py``), before any command: it
reads the process's :class:`~skippyctl.config.runtime_settings.RuntimeSettings` once and keeps
them — or why they are invalid — for the command that runs (one command per process; an
invocation from code, e.g. a test's ``CliRunner``, reads them again at its own start).
:func:`runtime_settings` gives a command those settings; an invalid one ends the command with
``invalid_configuration`` (exit 10, an error record under ``--json``), so a command that uses no
settings is never refused for them. Commands pass the settings on explicitly: to the client
(discovery, launch), to the composition root (``runtime serve``), to an embedded host.
"""

from __future__ import annotations

from skippyctl.config.runtime_settings import (
    INVALID_CONFIGURATION,
    InvalidSettings,
    RuntimeSettings,
    read_runtime_settings,
)

_read_at_start: RuntimeSettings | InvalidSettings | None = None


def remember_settings() -> None:
    """Read the settings for the command that runs (the root callback calls this once)."""
    global _read_at_start
    try:
        _read_at_start = read_runtime_settings()
    except InvalidSettings as error:
        _read_at_start = error


def runtime_settings(command: str, json_output: bool = False) -> RuntimeSettings:
    """The settings read at the start; exits 10 (``invalid_configuration``) when one is
    invalid, saying which and why."""
    if _read_at_start is None:  # a command called without the root callback (from code)
        remember_settings()
    read = _read_at_start
    if isinstance(read, InvalidSettings):
        from skippyctl.cli.exit_codes import ExitCode
        from skippyctl.cli.output import fail

        fail(command, ExitCode.INVALID_CONFIGURATION, str(read), json_output, INVALID_CONFIGURATION)
    assert read is not None
    return read
