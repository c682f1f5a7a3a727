"""`skippyctl load`'s option flags, made from the one table of load options.

Every field of :class:`~skippyctl.config.load_options.LoadOptions` but ``model`` (the command's
argument) becomes a flag: its name (``Option.flag``, else the field's name with dashes), its
help text, its default (shown when it is a constant), a repeatable flag for a list, a choice for
an enum. :func:`load_flags` gives a command those parameters; the command gets them back as one
:class:`LoadOptions` whose values are checked by :meth:`LoadOptions.problem` (so a bad value is
exit 10 with an error record, as every other refusal of ``load``; never click's usage error).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, TypeVar

import typer

from skippyctl.config.load_options import OPTIONS, LoadOptions, OptionField

R = TypeVar("R")

_FLAG_TYPES: dict[type, Any] = {
    int: int,
    float: float,
    bool: bool,
    str: str,
    tuple: list[str],
}
"""Each kind's type as a flag; a choice (a mode, a policy) is taken as text and checked with
the other options (exit 10), not by click."""


def _parameter(spec: OptionField) -> inspect.Parameter:
    option = spec.option
    kind = str if spec.choices else _FLAG_TYPES[spec.kind]
    constant = spec.default is not None and spec.kind not in (tuple, bool)
    metavar = option.metavar
    if spec.choices:
        metavar = "[" + "|".join(spec.choices) + "]"
    info = typer.Option(spec.flag, help=option.help, metavar=metavar, show_default=constant)
    default = None if spec.kind is tuple else spec.default
    if isinstance(default, StrEnum):
        default = default.value
    annotation = kind if constant or spec.kind is bool else kind | None
    return inspect.Parameter(
        spec.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[annotation, info],
    )


FLAGS: tuple[OptionField, ...] = tuple(
    spec for spec in OPTIONS if spec.name != "model" and spec.option.cli
)
"""The load options ``skippyctl load`` takes as flags, in the table's order."""


def load_flags(command: Callable[..., R]) -> Callable[..., R]:
    """``command(model, ..., options: LoadOptions, ...)`` as a Typer command: its other
    parameters stay where they are, and ``options`` becomes one flag per load option. Typer
    calls the command with keyword arguments only."""
    signature = inspect.signature(command, eval_str=True)
    names = list(signature.parameters)
    at = names.index("options")
    parameters = [
        *(signature.parameters[name] for name in names[:at]),
        *(_parameter(spec) for spec in FLAGS),
        *(
            signature.parameters[name].replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for name in names[at + 1 :]
        ),
    ]

    @functools.wraps(command)
    def run(**values: Any) -> R:
        given: dict[str, Any] = {}
        for spec in FLAGS:
            value = values.pop(spec.name)
            if value is not None:
                given[spec.name] = tuple(value) if isinstance(value, list) else value
        options = LoadOptions(model=values["model"], **given)
        return command(options=options, **values)

    generated = signature.replace(parameters=parameters)
    # Typer reads a command's parameters from its signature and its annotations.
    run.__signature__ = generated  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in generated.parameters.values()}
    return run
