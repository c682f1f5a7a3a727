"""skippyctl: an operator tool for a local llama.cpp runtime with a structured event system."""

from __future__ import annotations

__version__ = "0.1.0"
