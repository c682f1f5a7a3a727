"""Event model: stable ids (catalog), enums (reasons), the typed envelope (envelope)."""
