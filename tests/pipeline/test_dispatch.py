"""Dispatcher batch paths: `publish_many` / `offer_many` behave exactly like one event at a time,
`get_many` drains in order, and callback subscribers take what gathered instead of waking once
per event."""

from __future__ import annotations

import contextlib
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skippyctl.events.catalog import EventId
from skippyctl.events.envelope import Event, LogicalId, Scope, make_event
from skippyctl.pipeline.dispatch import (
    CALLBACK_BATCH_ITEMS,
    Dispatched,
    Dispatcher,
    SubscriberStatus,
    Subscription,
    SubscriptionClosed,
    run_callback_subscriber,
)


def numbered(count: int) -> list[Event]:
    return [
        make_event(EventId.REQUEST_RECEIVED, scope=Scope(request_id=LogicalId(f"r{n}")))
        for n in range(count)
    ]


def observed(dispatcher: Dispatcher, subscriptions: list[Subscription]) -> tuple[object, ...]:
    stats = dispatcher.stats()
    return (
        stats.dispatched,
        stats.replay_retained,
        stats.replay_evicted,
        stats.disconnected_lag,
        dispatcher.retained_range(),
        [(s.status, s.lag_episodes, s.disconnect_reason, s.pending()) for s in subscriptions],
    )


def test_publish_many_matches_publishing_one_event_at_a_time() -> None:
    """Same sequences, replay eviction, lag episodes and lag disconnects, whatever the chunks."""
    events = numbered(40)
    singles, batched = Dispatcher(max_replay_records=8), Dispatcher(max_replay_records=8)
    single_subs = [singles.subscribe("small", 12), singles.subscribe("big", 30)]
    batched_subs = [batched.subscribe("small", 12), batched.subscribe("big", 30)]
    for event in events[:25]:
        singles.publish(event)
    got = batched.publish_many(events[:7]) + batched.publish_many(events[7:25])
    assert [item.sequence for item in got] == list(range(1, 26))
    assert observed(singles, single_subs) == observed(batched, batched_subs)
    assert single_subs[0].status is SubscriberStatus.DISCONNECTED  # passed its bound of 12
    assert batched_subs[1].status is SubscriberStatus.LAGGING  # 25 of 30
    # Reading brings a lagging subscriber back; the rest goes on alike.
    assert len(single_subs[1].get_many(100)) == len(batched_subs[1].get_many(100)) == 25
    for event in events[25:]:
        singles.publish(event)
    batched.publish_many(events[25:])
    assert observed(singles, single_subs) == observed(batched, batched_subs)
    assert batched.publish_many([]) == []


def test_get_many_returns_queued_items_in_order_at_most_max_then_reports_the_end() -> None:
    dispatcher = Dispatcher()
    subscription = dispatcher.subscribe("reader", 100)
    dispatcher.publish_many(numbered(10))
    first = subscription.get_many(4)
    rest = subscription.get_many(100)
    assert [i.sequence for i in first + rest] == list(range(1, 11))
    assert subscription.delivered == 10
    assert subscription.get_many(10, 0.01) == []
    dispatcher.publish_many(numbered(2))
    dispatcher.unsubscribe(subscription)
    assert len(subscription.get_many(10)) == 2  # what was queued is still read
    with pytest.raises(SubscriptionClosed):
        subscription.get_many(10, 0.01)


def test_a_waiting_reader_is_woken_by_a_batch() -> None:
    dispatcher = Dispatcher()
    subscription = dispatcher.subscribe("reader", 1000)
    received: list[Dispatched] = []
    started = threading.Event()

    def read() -> None:
        started.set()
        while len(received) < 50:
            received.extend(subscription.get_many(1000, 10.0))

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(5)
    dispatcher.publish_many(numbered(50))
    reader.join(10)
    assert not reader.is_alive(), "the reader was not woken by publish_many"
    assert [i.sequence for i in received] == list(range(1, 51))


def test_a_callback_subscriber_takes_what_gathered_in_passes_and_misses_nothing() -> None:
    dispatcher = Dispatcher()
    subscription = dispatcher.subscribe("callback", 8192)
    passes: list[int] = []
    real_get_many = subscription.get_many

    def counting_get_many(max_items: int, timeout_s: float | None = None) -> list[Dispatched]:
        items = real_get_many(max_items, timeout_s)
        if items:
            passes.append(len(items))
        return items

    subscription.get_many = counting_get_many  # type: ignore[method-assign]
    seen: list[int] = []
    done = threading.Event()
    total = 3000

    def callback(item: Dispatched) -> None:
        seen.append(item.sequence)
        if len(seen) == total:
            done.set()

    thread = run_callback_subscriber(dispatcher, subscription, callback, "test", gather_s=0.01)
    dispatcher.publish_many(numbered(total))
    assert done.wait(10)
    assert seen == list(range(1, total + 1))
    # All 3000 were queued at once: the thread took them CALLBACK_BATCH_ITEMS at a time.
    assert passes == [CALLBACK_BATCH_ITEMS, CALLBACK_BATCH_ITEMS, total - 2 * CALLBACK_BATCH_ITEMS]
    dispatcher.unsubscribe(subscription)
    thread.join(5)
    assert not thread.is_alive()


class _OfferedOneByOne:
    """The documented per-item rule `offer_many` keeps: append until the bound disconnects,
    lagging past half the bound, caught up below a quarter."""

    def __init__(self, max_queue_size: int) -> None:
        self.max = max_queue_size
        self.queue: list[int] = []
        self.status = SubscriberStatus.CONNECTED
        self.lag_episodes = 0

    def offer(self, sequence: int) -> None:
        if self.status is SubscriberStatus.DISCONNECTED:
            return
        if len(self.queue) >= self.max:
            self.status, self.queue = SubscriberStatus.DISCONNECTED, []
            return
        self.queue.append(sequence)
        if self.status is SubscriberStatus.CONNECTED and len(self.queue) > self.max // 2:
            self.status = SubscriberStatus.LAGGING
            self.lag_episodes += 1

    def take(self, count: int) -> None:
        if self.status is SubscriberStatus.DISCONNECTED:
            return
        del self.queue[:count]
        if self.status is SubscriberStatus.LAGGING and len(self.queue) < self.max // 4:
            self.status = SubscriberStatus.CONNECTED


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 24),
    st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=30),
)
def test_offer_many_queues_lags_and_disconnects_as_offering_one_item_at_a_time(
    bound: int, steps: list[tuple[bool, int]]
) -> None:
    """Batches of any size against any bound, with reads in between: the same queue, status
    and lag episodes after every step (a batch that fits under half the bound is one extend)."""
    subscription, reference = Subscription("s", bound), _OfferedOneByOne(bound)
    event = numbered(1)[0]
    sequence = 0
    for is_offer, size in steps:
        if is_offer:
            batch = [Dispatched(sequence + n, event) for n in range(size)]
            sequence += size
            subscription.offer_many(batch)
            for item in batch:
                reference.offer(item.sequence)
        else:
            with contextlib.suppress(SubscriptionClosed):  # a disconnected one, drained
                subscription.get_many(size, timeout_s=0)
            reference.take(size)
        assert subscription.status is reference.status
        assert subscription.lag_episodes == reference.lag_episodes
        assert subscription.pending() == len(reference.queue)
    taken = (
        [] if reference.status is SubscriberStatus.DISCONNECTED else subscription.get_many(99, 0)
    )
    assert [item.sequence for item in taken] == reference.queue
