"""The runtime host: pipeline, engines (supervisor), admission and scheduling (ARCHITECTURE.md
§1)."""
