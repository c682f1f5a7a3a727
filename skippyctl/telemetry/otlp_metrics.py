"""The metric table as OTLP metrics: one observable instrument per row of `METRICS`.

Each instrument is read at every collection, on the SDK's metric reader thread, from its row's
source only (reading takes the collector's lock briefly, nothing else); a row with no sample at
that moment (no model loaded yet) exports no data point. Counters are monotonic sums, gauges
gauges; attribute names are the rows' OTLP label names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from skippyctl.telemetry.metric_table import METRICS, Metric, MetricKind, Sample, Source


def _callback(
    metric: Metric[Any], read: Callable[[], object]
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    names = tuple(label.otlp for label in metric.labels)

    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        samples: Iterable[Sample] = metric.read(read())
        return [
            Observation(value, dict(zip(names, values, strict=True))) for values, value in samples
        ]

    return observe


def install_instruments(meter: Meter, sources: Mapping[Source, Callable[[], object]]) -> None:
    """An instrument on `meter` for every row whose source is in `sources` (a reader of it)."""
    for metric in METRICS:
        read = sources.get(metric.source)
        if read is None:
            continue
        create = (
            meter.create_observable_counter
            if metric.kind is MetricKind.COUNTER
            else meter.create_observable_gauge
        )
        create(
            metric.otlp,
            callbacks=[_callback(metric, read)],
            unit=metric.unit,
            description=metric.help,
        )
