"""Link figures and the probe schedule of a split model's engine (engine/links.py)."""

from __future__ import annotations

import math

import pytest

from skippyctl.engine.links import LinkProber, link_figures


def test_figures_are_the_median_the_nearest_rank_p95_and_the_mean_step() -> None:
    figures = link_figures([10.0, 12.0, 11.0, 30.0])
    assert figures.rtt_ms == 11.5
    assert figures.p95_ms == 30.0
    assert figures.jitter_ms == pytest.approx((2 + 1 + 19) / 3, abs=1e-3)
    one = link_figures([5.0])
    assert (one.rtt_ms, one.p95_ms, one.jitter_ms) == (5.0, 5.0, 0.0)
    with pytest.raises(ValueError, match="no samples"):
        link_figures([])


def test_the_p95_of_twenty_samples_is_the_nineteenth() -> None:
    assert link_figures([float(i) for i in range(1, 21)]).p95_ms == 19.0


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_stage_is_probed_at_most_once_per_interval() -> None:
    calls: list[int] = []
    clock = _Clock()
    prober = LinkProber(
        [lambda: calls.append(0), lambda: calls.append(1)], interval_s=1.0, clock=clock
    )
    assert prober.seconds_until_due() == 0.0
    first = prober.probe_due()
    assert [m.stage for m in first] == [0, 1] and calls == [0, 1]
    assert all(m.samples == 1 and m.rtt_ms >= 0 and m.last_ms is not None for m in first)
    clock.now += 0.4
    assert prober.probe_due() == []
    assert prober.seconds_until_due() == pytest.approx(0.6)
    clock.now += 0.6
    second = prober.probe_due()
    assert [m.samples for m in second] == [2, 2] and calls == [0, 1, 0, 1]


def test_while_requests_run_a_stage_is_probed_five_times_less_often() -> None:
    calls: list[int] = []
    clock = _Clock()
    prober = LinkProber([lambda: calls.append(0)], interval_s=1.0, clock=clock)
    prober.probe_due(busy=True)
    clock.now += 1.0
    assert prober.probe_due(busy=True) == []  # idle, it would be due now
    clock.now += 4.0
    assert [m.samples for m in prober.probe_due(busy=True)] == [2]
    clock.now += 1.0
    assert [m.samples for m in prober.probe_due(busy=False)] == [3]
    assert calls == [0, 0, 0]


def test_the_window_is_bounded() -> None:
    prober = LinkProber([lambda: None], interval_s=0.0, window=4)
    for _ in range(10):
        [message] = prober.probe_all()
    assert message.samples == 4


def test_no_stages_is_never_due() -> None:
    assert math.isinf(LinkProber([]).seconds_until_due())
