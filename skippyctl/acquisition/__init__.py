"""Model acquisition: a model reference becomes a checked local GGUF, told as events
(ARCHITECTURE.md §1, "Model acquisition").

It runs where it is asked — the CLI process today — and needs neither llama.cpp nor a runtime:
``references`` parses the three reference forms, ``hub`` resolves one against the Hugging Face
hub and its cache, ``transfer`` turns the hub library's byte counts into coalesced progress,
``acquire`` runs one preparation (resolve, download, verify) to exactly one terminal event, and
``artifacts`` pre-checks a GGUF file (also for the host, before any engine work)."""
