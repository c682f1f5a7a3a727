"""What acquisition keeps to itself: no token, cache path, host or repo name in any record or
message, and no hub library, UI or web framework imported until it is used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from skippyctl.output.codec import dumps_line, event_record
from tests.acquisition.fake_hub import FakeHub
from tests.acquisition.helpers import FILE, REPO, failed, pull


def test_no_token_path_or_url_in_any_record(hub: FakeHub, cache: Path) -> None:
    token = "hf_CANARYcanaryCANARYcanary0123456789"
    recorder, _ = pull(hub, cache, f"hf://{REPO}/{FILE}", token=token)
    _, error = failed(hub, cache, "hf://acme/absent-repo/x.gguf")

    wire = b"".join(dumps_line(event_record(e)) for e in recorder.events)
    for secret in (token, str(cache), "127.0.0.1", "localhost", "/cdn/", REPO):
        assert secret.encode() not in wire
        assert secret not in error.message
    # The token went to the hub's resolve endpoint, never to the CDN host it redirected to.
    assert any(auth for m, p, _, auth in hub.requests if "/resolve/" in p)
    assert not any(auth for m, p, _, auth in hub.requests if p.startswith("/cdn/"))


def test_acquisition_is_core_and_imports_the_hub_library_only_when_used() -> None:
    code = (
        "import sys, skippyctl.acquisition.acquire, skippyctl.cli.app;"
        "print(sorted(m for m in ('textual', 'huggingface_hub') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = (
        "import sys, skippyctl.acquisition.acquire;"
        "print(sorted(m for m in ('rich', 'typer', 'textual', 'fastapi') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
