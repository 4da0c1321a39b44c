"""An AvailableNow run plans from the end it fixed when it started (Spark's
``allDataForTriggerAvailableNow``): after its first planning it asks no end offsets, reads
nothing produced or created since, and ends exactly at that end; a partition deleted during
the run is still data loss at the next planning. Only the broker's answers are faked
(tests/unit/test_progress_model.py)."""

from __future__ import annotations

import logging

import pytest

from kwatermark.arrow import OutputLayout
from kwatermark.errors import DataLossError
from kwatermark.offsets import BatchOffset
from kwatermark.options import parse_options
from kwatermark.planner import BatchPlanner, ReadLimits
from kwatermark.reader import Decoders
from tests.unit.test_progress_model import TOPIC, FakeBroker, read_task

pytestmark = pytest.mark.usefixtures("brokers_answer")

LENGTHS = [30, 7, 0]   # each partition's records when the run starts


class EndsGone(FakeBroker):
    """Brokers whose offsets may no longer be asked once ``asked_once`` (the run's first
    planning has asked them): what the later plannings need is the topics alone."""

    asked_once = False

    def _check(self) -> None:
        if self.asked_once:
            raise AssertionError("offsets asked after the run's first planning")

    def ask_ahead(self, tps, ends=True):
        if ends:
            self._check()
        return super().ask_ahead(tps, ends)

    def latest_offsets(self, tps, ahead=None):
        self._check()
        return super().latest_offsets(tps, ahead)

    def earliest_offsets(self, tps):
        self._check()
        return super().earliest_offsets(tps)


def available_now_run(ledger: str, **extra: str) -> tuple[BatchPlanner, EndsGone, BatchOffset]:
    options = parse_options({"kafka.bootstrap.servers": "fake:9092", "subscribe": TOPIC,
                             "startingOffsets": "earliest", "watermark.stateLocation": ledger,
                             **extra})
    planner = BatchPlanner(options, OutputLayout(), Decoders())
    broker = EndsGone([(TOPIC, p) for p in range(len(LENGTHS))])
    broker.ends.update({(TOPIC, p): n for p, n in enumerate(LENGTHS)})
    planner.metadata = broker
    offset = planner.initial_offset()
    planner.prepare_available_now()
    # Produced after the run fixed its end: not read in it.
    broker.ends = {(TOPIC, p): n + 100 for p, n in enumerate(LENGTHS)}
    return planner, broker, offset


def plan_and_read(planner: BatchPlanner, offset: BatchOffset, read: dict[int, list[int]]
                  ) -> BatchOffset | None:
    end = planner.latest_offset(BatchOffset.from_json(offset.dumps()),
                                ReadLimits(max_rows=8, respect_minimum=True))
    if end is None:
        return None
    end = BatchOffset.from_json(end.dumps())   # through the offset log, as Spark does
    for task in planner.tasks(end):
        rows, progress = read_task(planner, task, list(range(1_000, 1_200)), 5)
        planner.ledger.publish(task, planner.fingerprint, progress)
        read.setdefault(task.partition, []).extend(row.offset for row in rows)
    planner.commit(end)
    return end


def test_after_its_first_planning_an_available_now_run_asks_no_end_offsets(tmp_path):
    planner, broker, offset = available_now_run(str(tmp_path))
    read: dict[int, list[int]] = {}
    offset = plan_and_read(planner, offset, read)
    # A partition created during the run is not read in it, and no later planning of the
    # run may ask where a partition ends.
    broker.tps = broker.tps + [(TOPIC, 3)]
    broker.ends[(TOPIC, 3)] = 50
    broker.asked_once = True
    plannings = 1
    while offset is not None:
        offset = plan_and_read(planner, offset, read)
        plannings += 1
    assert plannings >= 6   # 37 records, 8 a batch
    assert {p: sorted(offsets) for p, offsets in read.items()} == {
        p: list(range(n)) for p, n in enumerate(LENGTHS) if n}
    # What the progress reports as the latest offsets is the run's end, as in Spark's source.
    assert planner.latest_seen == {(TOPIC, p): n for p, n in enumerate(LENGTHS)}


def test_a_partition_deleted_during_an_available_now_run_is_data_loss_at_once(tmp_path):
    planner, broker, offset = available_now_run(str(tmp_path))
    offset = plan_and_read(planner, offset, {})
    broker.tps = [(TOPIC, 0)]   # partitions 1 and 2 deleted (the topic recreated smaller)
    broker.asked_once = True
    with pytest.raises(DataLossError, match=f"topic {TOPIC}, partition 1: the partition is "
                                            f"gone"):
        plan_and_read(planner, offset, {})


def test_with_fail_on_data_loss_false_the_run_warns_and_reads_the_rest(tmp_path, caplog):
    planner, broker, offset = available_now_run(str(tmp_path), failOnDataLoss="false")
    read: dict[int, list[int]] = {}
    offset = plan_and_read(planner, offset, read)
    broker.tps = [(TOPIC, 0)]
    broker.asked_once = True
    with caplog.at_level(logging.WARNING, logger="kwatermark"):
        while offset is not None:
            offset = plan_and_read(planner, offset, read)
    warned = [r.getMessage() for r in caplog.records if "partition 1" in r.getMessage()]
    assert warned == [(f"data loss (failOnDataLoss=false): topic {TOPIC}, partition 1: the "
                       f"partition is gone (topic deleted or unsubscribed); the query "
                       f"continues")]
    assert sorted(read[0]) == list(range(LENGTHS[0]))   # the partition left: all of it


def test_a_run_end_a_stale_leader_gave_below_what_was_read_is_no_data_loss(tmp_path):
    """A run restarted from its checkpoint whose end was asked of a leader not yet caught up
    (DESIGN §20): partition 0's end came back below where the run begins it. Nothing is read
    from it in the run, and no later planning calls that data loss."""
    first_run, broker, offset = available_now_run(str(tmp_path))
    read: dict[int, list[int]] = {}
    while offset is not None:   # the first run reads everything
        last, offset = offset, plan_and_read(first_run, offset, read)
    caught_up = {(TOPIC, p): n + 4 for p, n in enumerate(LENGTHS)}
    stale = {**caught_up, (TOPIC, 0): LENGTHS[0] - 3}
    answers = iter([stale])

    class StaleOnce(FakeBroker):
        def latest_offsets(self, tps, ahead=None):
            ends = next(answers, caught_up)
            return {tp: ends[tp] for tp in tps}

    options = first_run.options
    restarted = BatchPlanner(options, OutputLayout(), Decoders())
    restarted.metadata = StaleOnce(broker.tps)
    restarted.prepare_available_now()   # the end: partition 0 three below what was read
    offset, more = last, {}
    plannings = 0
    while offset is not None:
        offset = plan_and_read(restarted, offset, more)
        plannings += 1
    assert plannings >= 2
    assert {p: sorted(o) for p, o in more.items()} == {
        p: list(range(n, n + 4)) for p, n in enumerate(LENGTHS) if p != 0}
