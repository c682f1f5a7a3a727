"""The commit stream a plugin sees is contiguous, prefix-consistent and complete — with and
without proposals, with a tiny queue that defers deltas — for the C example and the Python
example loaded through a real entry point."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest

from skippyctl.events.envelope import StopReason
from skippyctl.events.figures import NO_FIGURES, GenerationFigures
from skippyctl.plugins.link import PluginLink
from tests.plugins.conftest import Built, LinkFactory, Reports, read_streams

N_VOCAB = 1000


def _drive(
    link: PluginLink,
    *,
    requests: int,
    seed: int,
    propose_every: int | None,
    capacity_zero_every: int | None = None,
) -> dict[str, list[int]]:
    """A synthetic decode loop: requests begun together, commits of varying sizes (1..9 tokens)
    interleaved across them, proposal queries now and then (some with capacity 0), then each
    finished. Returns what each request committed."""
    rng = random.Random(seed)
    committed: dict[str, list[int]] = {}
    for i in range(requests):
        name = f"r-{i}"
        prompt = [rng.randrange(N_VOCAB) for _ in range(rng.randrange(1, 40))]
        link.begin(name, f"s-{i % 2}" if i % 3 else None, prompt, reused=i % 4)
        committed[name] = []
    live = list(committed)
    step = 0
    while live:
        step += 1
        name = live[step % len(live)]
        tokens = [rng.randrange(N_VOCAB) for _ in range(rng.randrange(1, 10))]
        link.commit(name, tokens)
        committed[name] += tokens
        if propose_every and step % propose_every == 0:
            zero = capacity_zero_every is not None and step % capacity_zero_every == 0
            link.propose({n: 0 if zero else rng.randrange(1, 8) for n in live})
        if len(committed[name]) > 150:
            figures = GenerationFigures(generated_tokens=len(committed[name]))
            link.finish(name, StopReason.LENGTH, figures)
            live.remove(name)
    return committed


def _check_complete(record: Path, committed: dict[str, list[int]]) -> None:
    streams = read_streams(record)  # checks contiguity line by line
    assert len(streams) == len(committed)
    # request ids are opaque: match each stream to its request by the tokens themselves
    seen = sorted(stream.tokens for stream in streams.values())
    assert seen == sorted(committed.values())
    for stream in streams.values():
        assert stream.finished
        assert stream.generated == len(stream.tokens)


@pytest.mark.parametrize("spec", ["c", "ngram-py"])
def test_stream_is_complete_when_no_proposal_ever_fires(
    make_link: LinkFactory, built: Built, plugin_env: dict[str, str], spec: str
) -> None:
    link = make_link([built.ngram if spec == "c" else spec])
    committed = _drive(link, requests=6, seed=1, propose_every=None)
    link.close()  # the sidecar finishes its queue before it exits
    counters = next(iter(link.counters().values()))
    assert counters["queries"] == 0
    assert counters["failures"] == counters["dropped"] == 0
    _check_complete(Path(plugin_env["SKIPPY_PLUGIN_RECORD"]), committed)
    runs = [
        r for s in read_streams(Path(plugin_env["SKIPPY_PLUGIN_RECORD"])).values() for r in s.runs
    ]
    assert {what for what, _, _ in runs} <= {"commit", "suffix"}


@pytest.mark.parametrize("spec", ["c", "ngram-py"])
def test_stream_is_complete_with_proposals_and_capacity_zero_queries(
    make_link: LinkFactory, built: Built, plugin_env: dict[str, str], spec: str
) -> None:
    link = make_link([built.ngram if spec == "c" else spec])
    committed = _drive(link, requests=5, seed=2, propose_every=3, capacity_zero_every=4)
    link.close()
    counters = next(iter(link.counters().values()))
    assert counters["queries"] > 0
    assert counters["failures"] == 0
    record = Path(plugin_env["SKIPPY_PLUGIN_RECORD"])
    _check_complete(record, committed)
    kinds = {what for s in read_streams(record).values() for what, _, _ in s.runs}
    assert "pending" in kinds  # queries carried pending runs


def test_capacity_zero_is_not_queried_and_leaves_the_delta_pending(
    make_link: LinkFactory, built: Built, plugin_env: dict[str, str]
) -> None:
    link = make_link([built.ngram])
    link.begin("a", None, [1, 2, 3], 0)
    link.commit("a", [4, 5])
    assert link.propose({"a": 0}) == {}
    assert link.counters()["ngram_plugin.so"]["queries"] == 0
    link.finish("a", StopReason.EOS, NO_FIGURES)
    link.close()
    (stream,) = read_streams(Path(plugin_env["SKIPPY_PLUGIN_RECORD"])).values()
    assert stream.tokens == [4, 5]
    assert [what for what, _, _ in stream.runs] in (["commit", "suffix"], ["commit"])


def test_proposals_follow_the_prompt_lookup_and_the_committed_tokens(
    make_link: LinkFactory, built: Built
) -> None:
    link = make_link([built.ngram, "ngram-py"])
    link.begin("a", "s", [10, 11, 12, 13, 10, 11], 0)
    # the C plugin is first in spec order: its answer wins; both propose the same
    assert link.propose({"a": 4}) == {"a": [12, 13, 10, 11]}
    link.commit("a", [12])
    assert link.propose({"a": 2}) == {"a": [13, 10]}
    link.finish("a", StopReason.EOS, NO_FIGURES)
    counters = link.counters()
    assert counters["ngram_plugin.so"]["proposals"] == 2
    assert counters["ngram-py"]["proposals"] == 2
    assert counters["ngram_plugin.so"]["proposed_tokens"] == 6


def test_tiny_queue_defers_deltas_and_the_stream_stays_complete(
    make_link: LinkFactory, built: Built, plugin_env: dict[str, str], reports: Reports
) -> None:
    """queue_capacity=2 and a stopped sidecar: the queue fills, commit deltas stay pending with
    the link (deferred), a query finds no room (dropped, nothing consumed), and after the
    sidecar resumes the later messages carry the deferred tokens: the stream is complete."""
    link = make_link([built.ngram], queue_capacity=2)
    (pid,) = link.sidecar_pids()
    link.begin("a", None, [1, 2, 3], 0)
    committed: list[int] = []
    os.kill(pid, signal.SIGSTOP)
    try:
        n = 0
        # fill the socket buffer and the two-message queue (bounded: a stopped reader
        # cannot take more than its socket buffer)
        while link.counters()["ngram_plugin.so"]["deferred"] == 0:
            n += 1
            assert n < 1_000_000
            tokens = [n % N_VOCAB] * (1 + n % 5)
            link.commit("a", tokens)
            committed += tokens
        for k in range(50):  # more deltas while full: all deferred into one pending run
            link.commit("a", [k])
            committed.append(k)
        assert link.propose({"a": 3}) == {}  # no room: not sent, its pending run kept
        counters = link.counters()["ngram_plugin.so"]
        assert counters["deferred"] >= 51
        assert counters["dropped"] >= 1
        assert counters["queries"] == 0
    finally:
        os.kill(pid, signal.SIGCONT)
    link.commit("a", [7, 8])
    committed += [7, 8]
    link.finish("a", StopReason.LENGTH, GenerationFigures(generated_tokens=len(committed)))
    link.close()
    (stream,) = read_streams(Path(plugin_env["SKIPPY_PLUGIN_RECORD"])).values()
    assert stream.tokens == committed
    assert stream.finished
    assert link.counters()["ngram_plugin.so"]["failures"] == 0
    assert [r.kind for r in reports.items] == ["loaded"]


def test_abort_ends_the_stream_without_a_suffix(
    make_link: LinkFactory, built: Built, plugin_env: dict[str, str]
) -> None:
    link = make_link([built.ngram])
    link.begin("a", None, [1], 0)
    link.begin("b", None, [2], 0)
    link.commit("a", [5, 6])
    link.commit("b", [7])
    link.abort("a", "cancelled")
    link.close()  # b is still in flight: aborted with reason shutdown
    streams = read_streams(Path(plugin_env["SKIPPY_PLUGIN_RECORD"]))
    assert sorted((s.tokens, s.aborted, s.finished) for s in streams.values()) == [
        ([5, 6], True, False),
        ([7], True, False),
    ]
    lines = Path(plugin_env["SKIPPY_PLUGIN_RECORD"]).read_text().splitlines()
    assert sorted(line.split()[2] for line in lines if line.startswith("abort")) == ["1", "4"]


def test_a_sidecar_never_gets_the_runtimes_credentials(
    make_link: LinkFactory, built: Built, plugin_env: dict[str, str]
) -> None:
    secret = "CANARY-credential-7Qx"
    env = dict(plugin_env, SKIPPY_API_KEY=secret, HF_TOKEN=secret, KEEP_ME="yes")
    link = make_link([built.ngram], env=env)
    (pid,) = link.sidecar_pids()
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"KEEP_ME=yes" in environ  # the environment is passed on...
    assert not [v for v in environ if secret.encode() in v]  # ...without the credentials
