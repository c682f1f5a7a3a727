"""Consumer projections: the wire codec (events as JSON and back), the state document and
its typed reader, human summaries. Headless: nothing here imports Rich, Typer, Textual or a web
framework (presentation lives in the CLI and the dashboard).
"""
