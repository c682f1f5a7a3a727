"""`python -m skippyctl` runs the CLI."""

from __future__ import annotations

from skippyctl.cli.app import main

main()
