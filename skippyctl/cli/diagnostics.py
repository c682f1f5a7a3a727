"""`skippyctl diagnostics record`: one bounded, privacy-checked bundle to attach to an issue.

The bundle is a gzip'd tar (one file to attach; written to a temp file and renamed, mode 0600):

    manifest.json      what is inside, the versions, the bounds, what was redacted
    events.ndjson      the lifecycle and warning events the runtime retained (≤ 128 records)
    stream.ndjson      the live stream for `--seconds N` (≤ MAX_STREAM_EVENTS records)
    state.json         the state document (with the 128 most recent events)
    doctor.ndjson      what `doctor --json` prints
    native-log.txt     only when the runtime captures llama.cpp's log (SKIPPY_CAPTURE_NATIVE_LOG=1
                       at serve): its newest lines per engine, drained (raw text, paths redacted)

Every member goes through `redact` before it is written: the discovery token becomes
`[redacted-token]`, an absolute path becomes `<path:BASENAME>`. Events, records and the state
document carry no prompt or completion text, token ids or keys by construction (the envelope has
no free-text field); `redact` is the second line for what does carry text (doctor's details).
It never starts a runtime.

Why a tar.gz and not a directory: one file to attach, written atomically (a temp file renamed
into place), private (0600) as a whole, and `tar -xzOf FILE MEMBER | jq` reads a member
without unpacking.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import orjson
import typer
from rich.console import Console

from skippyctl import __version__
from skippyctl.cli.exit_codes import ExitCode
from skippyctl.cli.output import RECORD_SCHEMA_VERSION, emit_json, fail
from skippyctl.output.codec import event_record
from skippyctl.output.redact import redact

if TYPE_CHECKING:
    from skippyctl.client.http import RuntimeClient

diagnostics_app = typer.Typer(no_args_is_help=True, help="Record diagnostics for a bug report.")
_err = Console(stderr=True, highlight=False, soft_wrap=True)

MAX_SECONDS: Final = 600
MAX_STREAM_EVENTS: Final = 20_000
MAX_NATIVE_LOG_LINES: Final = 2000
"""Per engine: the newest lines of the opt-in native debug log."""
MAX_MEMBER_BYTES: Final = 16 * 2**20
"""A member larger than this is cut (and the manifest says so): the bundle stays bounded."""


def _ndjson(records: list[dict[str, Any]]) -> str:
    return "".join(orjson.dumps(r).decode() + "\n" for r in records)


def _follow(client: RuntimeClient, seconds: float) -> tuple[list[dict[str, Any]], bool]:
    """The live stream's events for `seconds` (codec records); whether the bound cut it."""
    from skippyctl.cli.feeds import LiveStream, StreamItem
    from skippyctl.cli.follow import Deadline, follow

    stream = LiveStream(client)
    stream.wait_connected(5.0)
    records: list[dict[str, Any]] = []

    def show(item: StreamItem) -> None:
        records.append(event_record(item.event, seq=item.sequence, cursor=item.cursor))

    cut = follow(
        stream,
        show=show,
        ends=lambda _item: True if len(records) >= MAX_STREAM_EVENTS else None,
        stream_ended=lambda _ended: False,
        deadline=Deadline(time.monotonic() + seconds, lambda: False),
        poll_s=0.25,
    )
    return records, cut


def _write_bundle(out: Path, members: dict[str, str]) -> int:
    """Write a tar.gz atomically (temp file in the target directory, then rename), mode 0600."""
    out.parent.mkdir(parents=True, exist_ok=True)  # OSError: the caller's exit 13
    fd, temp = tempfile.mkstemp(prefix=".skippy-diag-", suffix=".tmp", dir=out.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            now = time.time()
            for name, text in members.items():
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = int(now)
                info.mode = 0o600
                tar.addfile(info, io.BytesIO(data))
        os.replace(temp, out)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return out.stat().st_size


@diagnostics_app.command("record")
def record_command(
    seconds: Annotated[
        float,
        typer.Option(
            "--seconds",
            min=0,
            max=MAX_SECONDS,
            help=f"Also follow the live event stream this long (0-{MAX_SECONDS} s).",
        ),
    ] = 0.0,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Where to write the bundle (default ./skippy-diagnostics-<time>.tar.gz)."
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one `diagnostics_bundle` record, nothing else.")
    ] = False,
) -> None:
    """Write a bounded diagnostics bundle (tar.gz) of the running runtime.

    It holds the runtime's retained lifecycle and warning events, the live stream for
    `--seconds N`, the state document and `doctor --json`; the discovery token and absolute
    paths are redacted, and events never carry prompt or completion text. Never starts a
    runtime: exit 3 when none answers, 13 (artifact_io_failure) when the file cannot be
    written.

    Example:

        skippyctl diagnostics record --seconds 10 --out /tmp/skippy.tar.gz
        tar -xzOf /tmp/skippy.tar.gz stream.ndjson | jq -c 'select(.event == "warning_raised")'
    """
    from skippyctl.cli.attach import attach_or_exit
    from skippyctl.cli.doctor import doctor_records, run_checks
    from skippyctl.cli.settings import runtime_settings
    from skippyctl.client.http import ApiError, RuntimeUnreachable

    target = out or Path(f"skippy-diagnostics-{time.strftime('%Y%m%dT%H%M%S')}.tar.gz")
    client = attach_or_exit("diagnostics", json_output, autostart=False)
    secrets = (client.discovery.token,)
    try:
        recent = client.recent_events(128)
        state = client.state(recent=128)
        native_log = client.native_log(MAX_NATIVE_LOG_LINES)
        stream, cut = _follow(client, seconds) if seconds > 0 else ([], False)
    except (RuntimeUnreachable, ApiError) as error:
        reason = getattr(error, "reason_code", None)
        fail(
            "diagnostics",
            ExitCode.RUNTIME_UNREACHABLE,
            f"the runtime stopped answering while recording: {error}",
            json_output,
            reason=reason,
        )
    finally:
        client.close()
    findings, doctor_code = run_checks(runtime_settings("diagnostics", json_output))
    raw_members = {
        "events.ndjson": _ndjson(recent),
        "stream.ndjson": _ndjson(stream),
        "state.json": orjson.dumps(state, option=orjson.OPT_INDENT_2).decode() + "\n",
        "doctor.ndjson": _ndjson(doctor_records(findings, doctor_code)),
    }
    native_lines = sum(len(e.get("lines") or ()) for e in native_log)
    if native_lines:
        raw_members["native-log.txt"] = "".join(
            f"# engine {e.get('model_id')} ({e.get('cut', 0)} earlier lines cut)\n"
            + "".join(f"{line}\n" for line in e.get("lines") or ())
            for e in native_log
        )
    members: dict[str, str] = {}
    redactions = 0
    truncated: list[str] = []
    for name, text in raw_members.items():
        clean, count = redact(text, secrets)
        redactions += count
        if len(clean.encode()) > MAX_MEMBER_BYTES:
            clean = clean.encode()[:MAX_MEMBER_BYTES].decode(errors="ignore")
            truncated.append(name)
        members[name] = clean
    manifest = {
        "schema_version": RECORD_SCHEMA_VERSION,
        "record": "diagnostics_manifest",
        "skippyctl_version": __version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": seconds,
        "members": {
            "events.ndjson": len(recent),
            "stream.ndjson": len(stream),
            "state.json": 1,
            "doctor.ndjson": len(findings) + 1,
            **({"native-log.txt": native_lines} if native_lines else {}),
        },
        "stream_cut_at_bound": cut,
        "truncated_members": truncated,
        "redactions": redactions,
        "native_log_redacted_by_host": bool(native_lines),
        "bounds": {"stream_events": MAX_STREAM_EVENTS, "member_bytes": MAX_MEMBER_BYTES},
    }
    members = {"manifest.json": orjson.dumps(manifest).decode() + "\n", **members}
    try:
        size = _write_bundle(target, members)
    except OSError as error:
        fail(
            "diagnostics",
            ExitCode.ARTIFACT_IO_FAILURE,
            f"cannot write the bundle ({error.strerror or type(error).__name__})",
            json_output,
            reason="artifact_io_failure",
            hint=f"--out {target}",
        )
    if json_output:
        emit_json(
            {
                "schema_version": RECORD_SCHEMA_VERSION,
                "record": "diagnostics_bundle",
                "file": target.name,
                "bytes": size,
                "events": len(recent),
                "stream_events": len(stream),
                "redactions": redactions,
                "exit_code": int(ExitCode.SUCCESS),
            }
        )
    else:
        _err.print(
            f"[green]✓[/] wrote {target} ({size} bytes: {len(recent)} retained events, "
            f"{len(stream)} streamed, state, doctor; {redactions} redaction(s))"
        )
