"""How the host starts an engine (runtime/engine_supervisor.py): the host's environment without
its credentials — so the plugin sidecars the engine starts have none either —, and everything
the host decided (its settings, the native library it checked) as arguments."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from skippyctl.config.load_options import LoadOptions
from skippyctl.config.runtime_settings import RuntimeSettings
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId
from skippyctl.runtime.host import RuntimeHost
from tests.stages.helpers import children_of

CANARY = "CANARY-credential-4Kp"
WAIT_S = 120.0


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[RuntimeHost]:
    for credential in ("SKIPPY_API_KEY", "HF_TOKEN", "OTEL_EXPORTER_OTLP_HEADERS"):
        monkeypatch.setenv(credential, CANARY)
    monkeypatch.setenv("KEEP_ME", "yes")
    runtime = RuntimeHost(settings=RuntimeSettings(test_decode_delay_ms=1.5)).start()
    yield runtime
    runtime.shutdown()


def _environ(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def _available(host: RuntimeHost, options: LoadOptions) -> int:
    """Load and wait until the model serves; its engine's pid."""
    handle = host.load_model(options)
    assert handle.model_id is not None, handle.problem
    model_id = handle.model_id
    state = host.pipeline.wait_state(
        lambda s: model_id in s.models and s.models[model_id].state.value == "available", WAIT_S
    )
    assert state is not None, "the model never became available"
    return host.engine_pids()[str(model_id)]


def test_engines_and_their_sidecars_never_get_the_hosts_credentials(
    host: RuntimeHost, fixture_dir: Path
) -> None:
    engine = _available(host, LoadOptions(str(fixture_dir / "tiny.gguf"), plugins=("ngram",)))
    sidecars = children_of(engine)
    assert sidecars, "the ngram plugin's sidecar is not running"
    for pid in (engine, *sidecars):
        environ = _environ(pid)
        assert b"KEEP_ME=yes" in environ  # the environment is passed on...
        assert not [v for v in environ if CANARY.encode() in v]  # ...without the credentials
    assert b"GGML_NO_BACKTRACE=1" in _environ(engine)


def test_an_engine_is_told_the_hosts_settings_and_library_on_its_command_line(
    host: RuntimeHost, fixture_dir: Path
) -> None:
    engine = _available(host, LoadOptions(str(fixture_dir / "tiny.gguf")))
    argv = Path(f"/proc/{engine}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("--test-decode-delay-ms") + 1] == "1.5"
    assert host.native.library is not None
    assert argv[argv.index("--native-library") + 1] == str(host.native.library.path)
    assert host.pipeline.state.models[LogicalId("tiny")].state.value == "available"
    recent = [e.id for e in host.pipeline.state.recent_events]
    assert EventId.ABI_FEATURE_COMPATIBILITY_FAILED not in recent  # the engine used that library
