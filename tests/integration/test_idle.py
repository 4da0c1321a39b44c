"""Issue 4: idle-partition policies, with paced producers against a real broker."""

from __future__ import annotations

import time

from kwatermark.offsets import BatchOffset
from tests.support.kafka import Record
from tests.support.streams import (
    Batches,
    ev_ms,
    kwatermark_stream,
    progress_offset,
    run_available_now,
    wm_ms,
)


def last_end_offset(query) -> BatchOffset:
    return BatchOffset.from_json(progress_offset(query.lastProgress["sources"][0]["endOffset"]))


def run_steps(spark, broker, writer, checkpoint, steps, pause_s=0.0, **options):
    """One AvailableNow run per step; ``pause_s`` of silence before each later step."""
    frame = kwatermark_stream(spark, broker, writer.topic, lateRecords="flag", **options)
    seen, query = Batches(), None
    for i, step in enumerate(steps):
        if i and pause_s:
            time.sleep(pause_s)
        writer.send(step)
        _, query = run_available_now(frame, checkpoint, seen)
    return seen, query


# Partition 1 speaks once, then falls silent while partition 0 keeps going.
SILENT_P1 = [[Record(0, 1_000), Record(1, 2_000)], [Record(0, 5_000)], [Record(0, 9_000)]]


def test_silent_partition_holds_the_watermark_under_none(spark, broker, topic_factory,
                                                         checkpoint):
    writer = topic_factory(2)
    seen, _ = run_steps(spark, broker, writer, checkpoint, SILENT_P1, pause_s=1.2,
                        **{"idle.policy": "none"})
    # p0 holds the minimum first (999), then the silent p1 does (1999) forever.
    assert [wm_ms(r) for r in seen.rows] == [None, None, 999, 1_999]


def test_timeout_and_caught_up_release_a_silent_partition_after_the_timeout(
        spark, broker, topic_factory, tmp_path):
    for policy in ("timeout", "caught-up"):
        writer = topic_factory(2)
        seen, query = run_steps(spark, broker, writer, str(tmp_path / policy), SILENT_P1,
                                pause_s=1.2, **{"idle.policy": policy,
                                                "idle.timeout": "1 second"})
        # After 1.2 s of silence p1 is excluded; the watermark follows p0 alone.
        assert [wm_ms(r) for r in seen.rows] == [None, None, 999, 4_999], policy
        end = last_end_offset(query)
        assert end.partitions[(writer.topic, 1)].state.idle == "exclude"


def test_partition_that_comes_back_counts_again_without_lowering_the_watermark(
        spark, broker, topic_factory, checkpoint):
    writer = topic_factory(2)
    steps = SILENT_P1 + [[Record(1, 3_000), Record(0, 12_000)]]
    seen, query = run_steps(spark, broker, writer, checkpoint, steps, pause_s=1.2,
                            **{"idle.policy": "caught-up", "idle.timeout": "1 second"})
    # p1 is counted again (its minimum, 1999, is below the 4999 already emitted): the
    # watermark holds at 4999 instead of decreasing, and p1's old record is flagged late.
    assert last_end_offset(query).partitions[(writer.topic, 1)].state.idle == "count"
    assert [(r["partition"], ev_ms(r), wm_ms(r), r["is_late"]) for r in seen.batches()[3]] == [
        (0, 12_000, 4_999, False), (1, 3_000, 4_999, True)]


def starved_steps() -> list[list[Record]]:
    """p0: a large backlog of recent events; p1: three old events behind it."""
    return [[Record(0, 100_000 + i * 1_000) for i in range(200)]
            + [Record(1, 1_000), Record(1, 2_000), Record(1, 3_000)]]


def test_a_read_limit_starves_no_partition_so_even_timeout_keeps_its_records_on_time(
        spark, broker, topic_factory, tmp_path):
    """Before DESIGN §11 the limit was split by lag alone: p1 got no record for many
    triggers, ``timeout`` excluded it though it had backlog, and its records came late. Now
    p1 holds the watermark, so it is served first under every policy."""
    for policy in ("timeout", "caught-up"):
        writer = topic_factory(2)
        seen, query = run_steps(spark, broker, writer, str(tmp_path / policy),
                                starved_steps(), maxOffsetsPerTrigger=20,
                                **{"idle.policy": policy, "idle.timeout": "300 milliseconds"})
        starved = [r for r in seen.rows if r["partition"] == 1]
        assert [ev_ms(r) for r in starved] == [1_000, 2_000, 3_000], policy
        assert any(r["partition"] == 1 for r in seen.batches()[0]), policy
        assert not any(r["is_late"] for r in starved), policy
        plans = [BatchOffset.from_json(progress_offset(p["sources"][0]["endOffset"])).partitions[
            (writer.topic, 1)] for p in query.recentProgress]
        assert not any(plan.state.idle == "exclude" and plan.start < 3
                       for plan in plans), policy


def test_advance_moves_a_silent_partition_with_processing_time(spark, broker,
                                                               topic_factory, checkpoint):
    writer = topic_factory(2)
    start = int(time.time() * 1000)
    old = start - 3_600_000  # an hour ago: p1 speaks once, p0 keeps going
    steps = [[Record(0, old), Record(1, old + 10)], [Record(0, old + 600_000)],
             [Record(0, old + 1_200_000)]]
    seen, query = run_steps(spark, broker, writer, checkpoint, steps, pause_s=1.2,
                            **{"idle.policy": "advance", "idle.timeout": "1 second",
                               "idle.maxDelay": "50 minutes"})
    after = int(time.time() * 1000)
    state = last_end_offset(query).partitions[(writer.topic, 1)].state
    assert state.idle == "advance"
    assert start - 3_000_000 <= state.advanced_ms <= after - 3_000_000
    # Third batch: p1 advanced to now - 50 min, above p0's old + 600 s - 1: p0 holds it.
    assert [wm_ms(r) for r in seen.batches()[2]] == [old + 599_999]


def test_custom_policy_from_a_user_module(spark, broker, topic_factory, checkpoint):
    writer = topic_factory(2)
    seen, _ = run_steps(spark, broker, writer, checkpoint,
                        [[Record(0, 5_000), Record(1, 1_000)], [Record(0, 8_000)]],
                        **{"idle.policy": "kw_idle_plugins:ExcludePartition",
                           "idle.excludePartition": "1"})
    # p1 (the minimum) is excluded by the user policy: the watermark is p0's alone.
    assert [wm_ms(r) for r in seen.batches()[1]] == [4_999]
