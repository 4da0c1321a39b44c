"""Issue 7, shortened for CI: the soak run of ``tests/soak/soak.py`` for one minute against
the test broker (the full run is ``python -m tests.soak.soak --minutes 10``). The checks are
then re-run on copies of the real report with one fault planted each, to show they can fail.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.soak.soak import (
    IDLE,
    LAGGING,
    LEADING,
    MB,
    TASK_WORKER,
    RssSample,
    SoakReport,
    check,
    run_soak,
)

PRODUCTION_S = 60


@pytest.fixture(scope="module")
def report(spark, broker) -> SoakReport:
    return run_soak(spark, broker.bootstrap_servers, PRODUCTION_S)


def test_a_minute_of_soak_loses_nothing_and_keeps_watermark_and_memory_in_line(report):
    print(report.summary())
    failures = check(report)
    assert not failures, "\n".join([report.summary(), *failures])
    # The scenario itself: all three partitions were read, the idle one only at the start.
    assert report.produced[IDLE] == report.config.idle_records
    assert min(report.produced[LEADING], report.produced[LAGGING]) > 10_000
    # A 1 s trigger: a batch every 1-3 s, slower when the other pytest-xdist worker takes
    # the cores (19 batches in CI); enough batches for the checks to judge a trend.
    assert len(report.batches) >= PRODUCTION_S // 6


def middle(report: SoakReport) -> int:
    """Index of a steady batch: after warm-up, the idle partition already excluded, after a
    batch whose rows carried a watermark."""
    return next(i for i, b in enumerate(report.batches)
                if i > 0 and b.at_s > report.config.warmup and b.slices.get(LAGGING)
                and report.batches[i - 1].max_watermark is not None)


def with_slice(report: SoakReport, index: int, partition: int, **changes) -> SoakReport:
    batches = list(report.batches)
    b = batches[index]
    slices = dict(b.slices)
    slices[partition] = replace(slices[partition], **changes)
    batches[index] = replace(b, slices=slices)
    return replace(report, batches=batches)


def failing(report: SoakReport, phrase: str) -> bool:
    return any(phrase in failure for failure in check(report))


def test_the_checks_catch_lost_and_duplicated_records(report):
    k = middle(report)
    assert failing(replace(report, batches=report.batches[:k] + report.batches[k + 1:]),
                   "records lost")
    s = report.batches[k].slices[LEADING]
    assert failing(with_slice(report, k, LEADING, min_offset=s.min_offset - 1, rows=s.rows + 1,
                              distinct_offsets=s.distinct_offsets + 1), "read again")
    assert failing(with_slice(report, k, LEADING, rows=s.rows + 1), "offsets read twice")
    assert failing(with_slice(report, k, LAGGING, seq_mismatches=1), "sequence number")
    produced = list(report.produced)
    produced[LAGGING] += 1
    assert failing(replace(report, produced=produced), f"of {produced[LAGGING]} produced")


def test_the_checks_catch_a_watermark_that_goes_back_or_passes_the_lagging_partition(report):
    k = middle(report)
    earlier = report.batches[k - 1].max_watermark
    assert failing(with_slice(report, k, LAGGING, min_watermark=earlier - 1), "is below")
    assert failing(with_slice(report, k, LAGGING, decreases=1), "decreases")
    # The leading partition's own watermark is ~30 s above the lagging one's.
    ahead = report.batches[k].slices[LEADING].max_event - report.config.bound_ms - 1
    assert failing(with_slice(report, k, LEADING, max_watermark=ahead),
                   "the counted partitions' minimum")


def test_the_checks_catch_a_watermark_that_stands_still(report):
    """Every batch's rows carrying the first watermark: it never advanced."""
    first = next(b.max_watermark for b in report.batches if b.max_watermark is not None)
    stalled = [replace(b, slices={p: replace(s, min_watermark=min(s.min_watermark, first),
                                              max_watermark=first)
                                  if s.max_watermark is not None else s
                                  for p, s in b.slices.items()})
               for b in report.batches]
    assert not failing(report, "less than half")
    assert failing(replace(report, batches=stalled), "less than half")


def test_the_checks_catch_an_idle_partition_holding_the_watermark(report):
    held = {b: replace(plan, partitions={**plan.partitions, IDLE: replace(
        plan.partitions[IDLE], idle="count")}) for b, plan in report.plans.items()}
    assert failing(replace(report, plans=held), "never excluded")
    later = report.lagging_before_tail_ms + 60_000
    assert failing(replace(report, lagging_before_tail_ms=later), "held back")


def test_the_checks_catch_a_growing_worker(report):
    trend = report.rss_trend(TASK_WORKER)
    last = [s for s in report.samples
            if s.role == TASK_WORKER and s.at_s >= report.produce_s - 2]
    peak = max(trend.first_third_max, trend.last_third_max)
    grown = [RssSample(s.at_s, s.role, s.pid, peak
                       + int((report.config.rss_growth_limit_mb + 1) * MB)) for s in last]
    assert failing(replace(report, samples=report.samples + grown), "task worker process")
