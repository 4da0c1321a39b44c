"""An idle query's polls (DESIGN §21): Spark asks ``latestOffset`` every few ms while nothing
arrives (10 ms apart under the default trigger), and at 4,096 partitions a poll that walked
every partition's state for the read limit took 9 ms of the planner's Python, 4 without
(bench/README.md, "An idle query at many partitions"). With nothing new anywhere a poll
plans no batch and computes no partition's watermark; ``reportLatestOffset`` is made again
only when an end offset moved. Records that arrive after idle polls are planned as
before."""

from __future__ import annotations

import json

import pytest
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable

from kwatermark import source
from kwatermark.arrow import OutputLayout
from kwatermark.ledger import ProgressRecord, record_columns
from tests.unit.test_progress_model import FakeBroker

pytestmark = pytest.mark.usefixtures("brokers_answer")

TOPIC = "events"


def _reader(tmp_path, heartbeat: bool = False
            ) -> tuple[source.KWatermarkStreamReader, FakeBroker]:
    reader = source.KWatermarkDataSource({
        "kafka.bootstrap.servers": "fake:9092", "subscribe": TOPIC,
        "startingOffsets": "earliest", "watermark.stateLocation": str(tmp_path),
        "watermark.heartbeat": str(heartbeat).lower(),
    }).streamReader(from_arrow_schema(OutputLayout(heartbeat=heartbeat).schema()))
    broker = FakeBroker([(TOPIC, p) for p in range(3)])
    reader.planner.metadata = broker
    return reader, broker


def _logged(offset: dict) -> dict:
    return json.loads(json.dumps(offset))   # what Spark hands back


def _planned(reader, start: dict) -> dict:
    """Plan the next batch, as Spark would, and commit it: its end offset."""
    end = reader.latestOffset(_logged(start), ReadAllAvailable())
    assert end != start
    planner = reader.planner
    for split in reader.partitions(_logged(start), _logged(end)):
        # what each task would publish: every record at event time 1,000 + its offset
        records = [ProgressRecord({"max_ts": 1_000 + t.end - 1}, t.end - t.start,
                                  1_000 + t.start, 1_000 + t.end - 1, None)
                   for t in split.tasks]
        planner.ledger.offer_pack(split.columns, planner.fingerprint, record_columns(records),
                                  split.ledger_key)
    reader.commit(_logged(end))
    return end


def _ends(offset: dict) -> dict[int, int]:
    return {int(p): o for p, o in offset[TOPIC].items()}


def test_an_idle_poll_plans_no_batch_and_walks_no_partition_state(tmp_path, monkeypatch):
    reader, broker = _reader(tmp_path)
    for tp, end in zip(broker.tps, (4, 0, 9)):
        broker.ends[tp] = end
    start = _planned(reader, reader.initialOffset())
    assert _ends(start) == {0: 4, 1: 0, 2: 9}

    asked: list = []
    watermark = reader.planner.partition_watermark
    monkeypatch.setattr(reader.planner, "partition_watermark",
                        lambda state: asked.append(state) or watermark(state))
    # the planner's other way in, every partition's at once (as columns)
    watermarks = reader.planner.column_watermarks
    monkeypatch.setattr(reader.planner, "column_watermarks",
                        lambda columns: asked.extend(columns.tps) or watermarks(columns))
    for poll in range(3):
        assert reader.latestOffset(_logged(start), ReadAllAvailable()) == start
        if poll == 0 and FakeBroker.answers_late:
            # computed while the brokers answered the first poll (nothing said yet that it
            # finds nothing new), once for this start: not again at the polls after it
            assert len(asked) == len(broker.tps)
            asked.clear()
    assert asked == []

    broker.ends[(TOPIC, 1)] = 2   # two records arrive in partition 1
    end = reader.latestOffset(_logged(start), ReadAllAvailable())
    assert _ends(end) == {0: 4, 1: 2, 2: 9}
    # a real planning computes the watermarks (answered late: it takes those the first
    # poll computed, asserted above)
    assert asked or FakeBroker.answers_late


def test_with_heartbeats_an_idle_poll_still_plans(tmp_path):
    """``watermark.heartbeat=true``: a poll with nothing new may carry a watermark the last
    batch's rows did not (§10), so it is planned in full, not cut short."""
    reader, broker = _reader(tmp_path, heartbeat=True)
    for tp in broker.tps:
        broker.ends[tp] = 3
    start = _planned(reader, reader.initialOffset())
    polled = reader.latestOffset(_logged(start), ReadAllAvailable())
    planned = reader.planner.offset(polled)
    assert polled != start and planned.heartbeat   # the watermark the batch reached, carried


def test_the_reported_end_offsets_follow_the_broker(tmp_path):
    reader, broker = _reader(tmp_path)
    for tp, end in zip(broker.tps, (5, 1, 2)):
        broker.ends[tp] = end
    start = _planned(reader, reader.initialOffset())
    first = reader.reportLatestOffset()
    assert first == {TOPIC: {"0": 5, "1": 1, "2": 2}}

    reader.latestOffset(_logged(start), ReadAllAvailable())   # idle
    assert reader.reportLatestOffset() == {TOPIC: {"0": 5, "1": 1, "2": 2}}

    broker.ends[(TOPIC, 2)] = 7
    reader.latestOffset(_logged(start), ReadAllAvailable())
    assert reader.reportLatestOffset() == {TOPIC: {"0": 5, "1": 1, "2": 7}}
