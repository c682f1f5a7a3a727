"""`follow()`: the one loop every streaming command runs, asked in its documented order.

The feed here is scripted (the `EventFeed` seam, as the dashboard's tests script their event
source): the order in which follow asks its parameters, and Ctrl-C counts, cannot be arranged
through a real runtime's stream. The commands that use it run for real in the other CLI tests.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from skippyctl.cli.feeds import StreamEnded, StreamItem
from skippyctl.cli.follow import (
    POLL_S,
    CancelThenForce,
    Deadline,
    InterruptRequests,
    follow,
)
from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import LogicalId, Scope, make_event


def _item(event_id: EventId, sequence: int, model: str = "tiny") -> StreamItem:
    event = make_event(event_id, scope=Scope(model_id=LogicalId(model)))
    return StreamItem(event, sequence, f"rt1:test:{sequence}")


class ScriptedFeed:
    """Hands out its steps in order (None: a quiet poll), then says the stream ended."""

    def __init__(self, steps: Iterable[StreamItem | None]) -> None:
        self.steps = list(steps)
        self.waits: list[float] = []

    def next(self, timeout_s: float) -> StreamItem | None:
        self.waits.append(timeout_s)
        if not self.steps:
            raise StreamEnded("the script is over")
        return self.steps.pop(0)


def _ended(error: StreamEnded) -> str:
    return f"ended: {error}"


def test_only_relevant_events_are_shown_and_the_first_outcome_ends_it() -> None:
    feed = ScriptedFeed(
        [
            _item(EventId.MODEL_LOAD_REQUESTED, 1, model="other"),
            None,
            _item(EventId.MODEL_LOAD_STARTED, 2),
            _item(EventId.MODEL_AVAILABLE, 3),
            _item(EventId.MODEL_LOAD_PROGRESS, 4),
        ]
    )
    shown: list[int] = []
    outcome = follow(
        feed,
        relevant=lambda item: str(item.event.scope.model_id) == "tiny",
        show=lambda item: shown.append(item.sequence),
        ends=lambda item: "available" if item.event.id is EventId.MODEL_AVAILABLE else None,
        stream_ended=_ended,
    )
    assert outcome == "available"
    assert shown == [2, 3]
    assert [step.sequence for step in feed.steps if step is not None] == [4]  # never read
    assert feed.waits == [POLL_S] * 4


def test_watch_sees_every_poll_before_relevance_quiet_ones_too() -> None:
    feed = ScriptedFeed([None, _item(EventId.MODEL_LOAD_STARTED, 1, model="other"), None])
    watched: list[int | None] = []

    def watch(item: StreamItem | None) -> str | None:
        watched.append(None if item is None else item.sequence)
        return "replay over" if len(watched) == 3 else None

    outcome = follow(
        feed,
        relevant=lambda _item: False,
        show=lambda _item: pytest.fail("nothing is relevant"),
        ends=lambda _item: pytest.fail("nothing is shown"),
        watch=watch,
        stream_ended=_ended,
    )
    assert outcome == "replay over"
    assert watched == [None, 1, None]


def test_the_stream_ending_first_gives_its_outcome() -> None:
    feed = ScriptedFeed([_item(EventId.MODEL_LOAD_STARTED, 1)])
    outcome = follow(feed, show=lambda _item: None, ends=lambda _item: None, stream_ended=_ended)
    assert outcome == "ended: the script is over"


def test_ctrl_c_is_asked_before_the_next_event_on_every_turn() -> None:
    feed = ScriptedFeed([_item(EventId.MODEL_AVAILABLE, 1)])
    interrupts = InterruptRequests()  # counted, as its SIGINT handler would
    interrupts.count = 1
    counts: list[int] = []

    def on_interrupt(count: int) -> str:
        counts.append(count)
        return "cancelled"

    outcome = follow(
        feed,
        show=lambda _item: pytest.fail("Ctrl-C came first"),
        ends=lambda _item: "available",
        stream_ended=_ended,
        interrupts=interrupts,
        on_interrupt=on_interrupt,
    )
    assert (outcome, counts, feed.waits) == ("cancelled", [1], [])


def test_cancel_then_force_cancels_once_and_follows_to_the_cancellations_terminal() -> None:
    cancels: list[str] = []
    react = CancelThenForce(lambda: cancels.append("cancel"), "forced", force_after_s=60)
    feed = ScriptedFeed([None, _item(EventId.MODEL_LOAD_CANCELLED, 1)])
    interrupts = InterruptRequests()
    interrupts.count = 1
    outcome = follow(
        feed,
        show=lambda _item: None,
        ends=lambda item: "cancelled" if item.event.id is EventId.MODEL_LOAD_CANCELLED else None,
        stream_ended=_ended,
        interrupts=interrupts,
        on_interrupt=react,
    )
    assert outcome == "cancelled"
    assert cancels == ["cancel"]  # asked on every turn, cancelled once


def test_cancel_then_force_gives_up_on_a_second_ctrl_c_or_after_its_time() -> None:
    cancels: list[str] = []
    patient = CancelThenForce(lambda: cancels.append("cancel"), "forced", force_after_s=60)
    assert patient(1) is None
    assert patient(1) is None
    assert patient(2) == "forced"
    impatient = CancelThenForce(lambda: cancels.append("cancel"), "forced", force_after_s=-1)
    assert impatient(1) == "forced"  # its time is up at once
    assert cancels == ["cancel", "cancel"]


def test_a_passed_deadline_ends_it_before_any_poll_and_polls_never_wait_past_it() -> None:
    feed = ScriptedFeed([_item(EventId.MODEL_AVAILABLE, 1)])
    outcome = follow(
        feed,
        show=lambda _item: None,
        ends=lambda _item: "available",
        stream_ended=_ended,
        deadline=Deadline(0.0, lambda: "timeout"),  # time.monotonic() is long past 0
    )
    assert (outcome, feed.waits) == ("timeout", [])

    far = ScriptedFeed([None, _item(EventId.MODEL_AVAILABLE, 1)])
    outcome = follow(
        far,
        show=lambda _item: None,
        ends=lambda _item: "available",
        stream_ended=_ended,
        deadline=Deadline(float("inf"), lambda: "timeout"),
        poll_s=0.25,
    )
    assert (outcome, far.waits) == ("available", [0.25, 0.25])


def test_interrupts_and_their_reaction_go_together() -> None:
    with pytest.raises(ValueError, match="go together"):
        follow(
            ScriptedFeed([]),
            show=lambda _item: None,
            ends=lambda _item: None,
            stream_ended=_ended,
            interrupts=InterruptRequests(),
        )
