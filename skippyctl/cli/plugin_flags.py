"""``--plugin`` values (`load`, `runtime serve|start`) as the runtime takes them."""

from __future__ import annotations

from pathlib import Path


def plugin_specs(values: list[str] | None) -> tuple[str, ...]:
    """``--plugin`` values as the runtime takes them: a C plugin's ``.so`` that exists from here
    made absolute (the runtime is another process with another working directory), an
    entry-point name as given."""
    specs = []
    for value in values or ():
        path = Path(value).expanduser()
        specs.append(str(path.resolve()) if value.endswith(".so") and path.exists() else value)
    return tuple(specs)
