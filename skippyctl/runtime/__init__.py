"""The runtime host: pipeline, engines, scheduling (ARCHITECTURE.md §2)."""
