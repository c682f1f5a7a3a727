"""Command groups that import a command's module only when it runs, and help without `<bool>`.

Typer builds the whole click tree before it parses anything: every registered command, each of
its parameters, and — since registering a command means importing its module — every command's
imports (httpx, Rich, the event catalog, the state reader). `skippyctl --version` paid for all
of them. `LazyGroup` knows its commands by name only (`CommandRef`: module and attribute); click
asks the group for a command by name (`get_command`), and only then is the module imported and
the command converted, once. Listing them all (`--help`, shell completion) loads them all: the
listing shows each command's help text, which lives with the command.

Flags in help: typer 0.29's Rich help (`rich_utils._print_options_panel`) prints every option's
`display_type_rich`, which for a boolean flag is its type, `<bool>` — yet a flag takes no value,
and Typer's plain help (`TyperOption.get_help_record`) rightly prints none for it. `Command` and
`LazyGroup` give every flag an empty metavar before help is shown, Typer's own `--help` and
completion flags included, so both help formats agree; and they make an absent flag False
rather than None (which Typer would otherwise coerce through pydantic on every run). Every
command of a `LazyGroup` (and of the sub-groups it loads) is made with these classes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, ClassVar, Final

import typer
from typer import main as typer_main
from typer._coercion import RuntimeParam
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.models import CommandInfo, TyperInfo

if TYPE_CHECKING:
    # typer 0.29 vendors click; the methods overridden here take its Context (typer.Context is a
    # subclass, too narrow for an override)
    from typer._click import Context


@dataclass(frozen=True, slots=True)
class CommandRef:
    """Where a command lives: `module`'s attribute `attribute`, a command function or a
    `typer.Typer` (a sub-group)."""

    module: str
    attribute: str


@dataclass(frozen=True)
class _Text(RuntimeParam):
    """A text option's value as click gives it (a str, or None when absent)."""

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        return value


_TEXT: Final = (str, str | None)


def _settle_flags(params: list[Any]) -> list[Any]:
    """Flags as flags: no value shown in help, and False when absent. Text options as text:
    Typer would build a pydantic adapter to coerce their value, even an absent one (importing
    pydantic, ~30 ms), into the str click already gives."""
    for param in params:
        if (
            isinstance(param, TyperOption)
            and param.type_descriptor.annotation in _TEXT
            and param._runtime_param is None
        ):
            annotation = param.type_descriptor.annotation
            param._runtime_param = _Text(param.type_descriptor.parameter_info, annotation)
        if not isinstance(param, TyperOption) or not (param.is_flag or param.count):
            continue
        if param.metavar is None:
            param.metavar = ""  # a flag takes no value: nothing to show for it
        if param.is_bool_flag and param.default is None:
            # Typer's own flags (--help, the completion ones) default to None, and a None goes
            # through Typer's pydantic coercion: every run imported pydantic (~30 ms here) and
            # built a TypeAdapter per such flag, to find that an absent flag is not set.
            param.default = False
    return params


class Command(TyperCommand):
    """A Typer command whose flags show no value in help."""

    def get_params(self, ctx: Context) -> list[Any]:
        return _settle_flags(super().get_params(ctx))


class _Commands(MutableMapping[str, Any]):
    """A group's commands by name, each loaded on first access (`LazyGroup`)."""

    def __init__(self, group: LazyGroup, refs: Mapping[str, CommandRef]) -> None:
        self._group = group
        self._refs = refs
        self._loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._loaded:
            self._loaded[name] = self._group.load(name, self._refs[name])
        return self._loaded[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        raise TypeError("a command group's commands are fixed")

    def __iter__(self) -> Iterator[str]:
        yield from self._refs
        yield from (name for name in self._loaded if name not in self._refs)

    def __len__(self) -> int:
        return len(self._refs) + sum(1 for name in self._loaded if name not in self._refs)


class LazyGroup(TyperGroup):
    """A Typer group whose commands (`lazy_commands`, in the order help lists them) are
    imported and converted when click first asks for them by name. Subclass it with the table:

        class Root(LazyGroup):
            lazy_commands = {"ps": CommandRef("skippyctl.cli.ps", "ps_command")}
    """

    lazy_commands: ClassVar[Mapping[str, CommandRef]] = {}

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        eager = dict(self.commands)
        self.commands = _Commands(self, self.lazy_commands)
        self.commands.update(eager)

    def get_params(self, ctx: Context) -> list[Any]:
        return _settle_flags(super().get_params(ctx))

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)  # names only: loading them is `get_command`'s job

    def load(self, name: str, ref: CommandRef) -> Any:
        """Import the command `ref` names and convert it, as Typer would have at start."""
        target = getattr(import_module(ref.module), ref.attribute)
        if isinstance(target, typer.Typer):
            for info in target.registered_commands:
                if info.cls in (None, TyperCommand):  # Typer's default: ours shows flags right
                    info.cls = Command
            return typer_main.get_group_from_info(
                TyperInfo(target, name=name, cls=LazyGroup),
                pretty_exceptions_short=True,
                suggest_commands=self.suggest_commands,
                rich_markup_mode=self.rich_markup_mode,
            )
        return typer_main.get_command_from_info(
            CommandInfo(name=name, callback=target, cls=Command),
            pretty_exceptions_short=True,
            rich_markup_mode=self.rich_markup_mode,
        )
