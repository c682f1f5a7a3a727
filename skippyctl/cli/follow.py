"""One loop that follows an event feed to an outcome, for every command that streams events.

`load`, `unload`, `wait`, `generate`, `events` and `diagnostics record` follow the runtime's
event stream (`load --embedded`: an in-process subscription) until something ends it. The loop
is `follow`; what differs between them is its parameters:

- `relevant(item)`: which events concern the command (the others pass unseen);
- `show(item)`: the presenter (an NDJSON record, a line, a progress bar, or nothing);
- `ends(item)`: the outcome a shown event ends the follow with (None: keep following);
- `watch(item)`: asked after every poll, a quiet one too (`item` None), before relevance: what
  ends a follow without being a relevant event (the state document arrived, a replay ran dry,
  the text of a generation ended);
- `interrupts` and `on_interrupt(count)`: how Ctrl-C cancels, asked on every turn once one came
  (`count` so far): an outcome ends the follow, None keeps following (`CancelThenForce`: the
  runtime is asked to cancel, and the follow waits for the cancellation's terminal);
- `deadline`: when to stop waiting, and with what outcome;
- `stream_ended(error)`: the outcome when the feed ends first.

Each turn: Ctrl-C, the deadline, the next item (waiting at most `poll_s`, never past the
deadline), `watch`, then a relevant item is shown and `ends` asked. The first outcome is the
result. Ctrl-C is a counter read between turns (`InterruptRequests`), so it never lands in the
middle of a record being written.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from skippyctl.cli.feeds import EventFeed, StreamEnded, StreamItem

OutcomeT = TypeVar("OutcomeT")

POLL_S: Final = 0.1
"""How long one turn waits for an event before Ctrl-C and the deadline are looked at again."""


class InterruptRequests:
    """Turns SIGINT into a counter the command's loop reads, so Ctrl-C never lands mid-write."""

    def __init__(self) -> None:
        self.count = 0
        self._previous: Any = None

    def __enter__(self) -> InterruptRequests:
        self._previous = signal.signal(signal.SIGINT, self._on_signal)
        return self

    def _on_signal(self, _signum: int, _frame: object) -> None:
        self.count += 1

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


@dataclass(frozen=True, slots=True)
class Deadline(Generic[OutcomeT]):
    """Follow until `at_s` (`time.monotonic()`), then end with `outcome()`."""

    at_s: float
    outcome: Callable[[], OutcomeT]


class CancelThenForce(Generic[OutcomeT]):
    """Ctrl-C for an operation the runtime can cancel: the first one asks it to (`cancel`) and
    keeps following, so the cancellation's own terminal ends the follow; a second Ctrl-C, or
    `force_after_s` without that terminal, gives up with `forced`."""

    def __init__(self, cancel: Callable[[], None], forced: OutcomeT, force_after_s: float) -> None:
        self._cancel = cancel
        self._forced = forced
        self._force_after_s = force_after_s
        self._asked_at: float | None = None

    def __call__(self, count: int) -> OutcomeT | None:
        if self._asked_at is None:
            self._asked_at = time.monotonic()
            self._cancel()
        if count > 1 or time.monotonic() - self._asked_at > self._force_after_s:
            return self._forced
        return None


def every_event(_item: StreamItem) -> bool:
    return True


def follow(
    feed: EventFeed,
    *,
    show: Callable[[StreamItem], None],
    ends: Callable[[StreamItem], OutcomeT | None],
    stream_ended: Callable[[StreamEnded], OutcomeT],
    relevant: Callable[[StreamItem], bool] = every_event,
    watch: Callable[[StreamItem | None], OutcomeT | None] | None = None,
    interrupts: InterruptRequests | None = None,
    on_interrupt: Callable[[int], OutcomeT | None] | None = None,
    deadline: Deadline[OutcomeT] | None = None,
    poll_s: float = POLL_S,
) -> OutcomeT:
    """Follow `feed` until one of the parameters gives an outcome (the module says in which
    order they are asked); without `interrupts`, Ctrl-C is Python's KeyboardInterrupt."""
    if (interrupts is None) != (on_interrupt is None):
        raise ValueError("interrupts and on_interrupt go together")
    while True:
        if interrupts is not None and on_interrupt is not None and interrupts.count:
            outcome = on_interrupt(interrupts.count)
            if outcome is not None:
                return outcome
        wait_s = poll_s
        if deadline is not None:
            left_s = deadline.at_s - time.monotonic()
            if left_s <= 0:
                return deadline.outcome()
            wait_s = min(wait_s, left_s)
        try:
            item = feed.next(wait_s)
        except StreamEnded as ended:
            return stream_ended(ended)
        if watch is not None:
            outcome = watch(item)
            if outcome is not None:
                return outcome
        if item is None or not relevant(item):
            continue
        show(item)
        outcome = ends(item)
        if outcome is not None:
            return outcome
