from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"

# llama.cpp must never run gdb for a backtrace when a fixture makes it abort.
os.environ.setdefault("GGML_NO_BACKTRACE", "1")

# Hypothesis profiles, registered in this one place (no test sets its own seed or database).
# `ci` (the default, `make test`): hypothesis' own CI profile (no deadline, the too-slow health
# check off), pinned derandomized and without an example database, so a fresh clone passes or
# fails the same way every time and no `.hypothesis/` directory is written; a failure prints the
# blob that reproduces it. schemathesis draws through hypothesis and takes these values too.
# `fuzz` (`make fuzz`): random seeds and more examples, with the example database so a failure
# found once is replayed first next time. Select it with SKIPPY_HYPOTHESIS_PROFILE=fuzz or
# `pytest --hypothesis-profile=fuzz` (hypothesis' plugin loads that after this file).
HYPOTHESIS_PROFILE_ENV = "SKIPPY_HYPOTHESIS_PROFILE"
FUZZ_MAX_EXAMPLES = 1000
"""The budget of a test that does not pin its own `max_examples` (a pinned one keeps its count
and explores new examples every fuzz run)."""
settings.register_profile(
    "ci", settings.get_profile("ci"), derandomize=True, database=None, print_blob=True
)
settings.register_profile(
    "fuzz",
    settings.get_profile("default"),
    max_examples=FUZZ_MAX_EXAMPLES,
    deadline=None,
    print_blob=True,
)
# Loaded while this file is imported, before any test module builds its `@settings`: those copy
# the profile's values for what they leave unset.
settings.load_profile(os.environ.get(HYPOTHESIS_PROFILE_ENV, "ci"))


def pytest_sessionstart(session: pytest.Session) -> None:
    # Without a database hypothesis still caches the constants it collects from source under
    # `.hypothesis/`: under `ci` that cache lives for the session only. (Here, not at import:
    # `--hypothesis-profile` is loaded after this file is.)
    if settings.get_current_profile_name() == "ci":
        home = tempfile.mkdtemp(prefix="skippy-hypothesis-")
        set_hypothesis_home_dir(home)
        session.config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))


@pytest.fixture(scope="session")
def fixture_dir() -> Path:
    """The generated fixture models (`make fixtures`; generated here when missing)."""
    # Every file of the set: a checkout made before a fixture was added gets it too.
    if not all(
        (FIXTURES / name).exists()
        for name in ("tiny.gguf", "tiny-successor.gguf", "tiny-embedding.gguf")
    ):
        from skippyctl.fixtures import make_fixtures

        make_fixtures(FIXTURES)
    return FIXTURES
