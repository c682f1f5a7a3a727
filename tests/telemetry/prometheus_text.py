"""A strict reader of the Prometheus text format (0.0.4) as `/metrics` writes it: every line is a
`# HELP`, a `# TYPE` or a sample of the family declared just before it; anything else fails."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-z_]+)="((?:[^"\\]|\\.)*)"')


@dataclass
class Family:
    name: str
    help: str
    kind: str = ""
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)


def families(text: str) -> dict[str, Family]:
    """Every family in `text`, by name, with its samples in order."""
    found: dict[str, Family] = {}
    current: Family | None = None
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert name not in found, f"{name} declared twice"
            current = found[name] = Family(name, help_text)
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert current is not None and current.name == name and not current.kind, line
            current.kind = kind
        else:
            match = _SAMPLE.match(line)
            assert match is not None, f"not a sample: {line!r}"
            assert current is not None and current.name == match[1], line
            labels = dict(_LABEL.findall(match[2] or ""))
            rebuilt = ",".join(f'{k}="{v}"' for k, v in labels.items())
            assert rebuilt == (match[2] or ""), f"malformed labels: {line!r}"
            current.samples.append((labels, float(match[3])))
    return found
