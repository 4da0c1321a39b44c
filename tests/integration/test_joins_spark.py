"""Issue 25: kwatermark's interval join and dedup beside Spark's own stream-stream join and
``dropDuplicatesWithinWatermark`` read with ``format("kafka")``, on the same topics.

One child process (PySpark 4.2.0, the newest Spark whose Kafka connector Maven Central serves,
tests/support/sparkkafka.py) runs every query in one session: the test writes the records
round by round into the request, the child produces each round and runs each query once per
round (``Trigger.AvailableNow`` on one checkpoint: a restart between rounds). Ground truth
comes from the records the test wrote, never from either operator's output.
"""

from __future__ import annotations

import collections
import uuid

import pytest

from tests.integration.test_joins import T0, duplicated_across_a_lagging_partition
from tests.support.sparkkafka import REPO_ROOT, run_baseline

pytestmark = pytest.mark.broker

ORDERS = 100            # order i at T0 + i s, on partition i % 2 of the orders topic
PAY_AFTER_MS = 3_000    # its payment 3 s later, on partition i % 2 of the payments topic
LAG_MS = 40_000         # payments' partition 1 arrives 40 s behind in event time
ROUND_MS = 35_000       # what arrives in 35 s of the stream makes one round
UPPER_MS = 5_000        # rt BETWEEN lt AND lt + 5 s
SPARK_DELAY = "1 second"
WITHIN = "5 seconds"


def paid(i: int) -> bool:
    return i % 10 != 9  # 10 orders are never paid: the left outer join's outer rows


def join_rounds() -> list[list[tuple]]:
    """[(stream, partition, timestamp, key)] per round: orders and payments' partition 0 in
    event-time order, payments' partition 1 40 s later; what is left of partition 1 after
    the last round of orders comes in one catch-up round (Spark has moved on by then)."""
    arrivals = []
    for i in range(ORDERS):
        key = f"o{i}"
        arrivals.append((T0 + i * 1_000, ("orders", i % 2, T0 + i * 1_000, key)))
        if paid(i):
            at = T0 + i * 1_000 + PAY_AFTER_MS
            arrivals.append((at + (LAG_MS if i % 2 else 0), ("payments", i % 2, at, key)))
    last = (ORDERS * 1_000 - 1) // ROUND_MS
    rounds: list[list[tuple]] = [[] for _ in range(last + 2)]
    for arrival, record in sorted(arrivals):
        rounds[min((arrival - T0) // ROUND_MS, last + 1)].append(record)
    return rounds


def watermark_of(records) -> int | None:
    """kwatermark's monotonous watermark over what is produced: min over partitions of
    (max event time - 1); an upper bound when a partition has no record yet (None: none)."""
    highest: dict[int, int] = {}
    for _, partition, timestamp, _ in records:
        highest[partition] = max(highest.get(partition, timestamp), timestamp)
    return min(highest.values()) - 1 if highest else None


@pytest.fixture(scope="module")
def compared(broker, tmp_path_factory):
    run_id = uuid.uuid4().hex[:8]
    topics = {name: f"joins-spark-{name}-{run_id}" for name in ("orders", "payments", "dedup")}
    for name in topics.values():
        broker.create_topic(2, name=name)
    joins = join_rounds()
    dedups = [[("dedup", r.partition, r.timestamp, r.key.decode()) for r in records]
              for records in duplicated_across_a_lagging_partition()]
    rounds = [joins[n] + (dedups[n] if n < len(dedups) else []) for n in range(len(joins))]
    join_query = {"left": topics["orders"], "right": topics["payments"], "lower_ms": 0,
                  "upper_ms": UPPER_MS, "how": "left", "delay": SPARK_DELAY,
                  "rounds": list(range(len(joins)))}
    dedup_query = {"topic": topics["dedup"], "within": WITHIN,
                   "rounds": list(range(len(dedups)))}
    request = {
        "bootstrap": broker.bootstrap_servers,
        "checkpoints": str(tmp_path_factory.mktemp("joins-spark")),
        "rounds": [[[topics[s], p, ts, key.encode().hex()] for s, p, ts, key in records]
                   for records in rounds],
        # Interleaved: each round runs ours, then Spark's, on the same records.
        "queries": [{"name": "kw_join", "kind": "kw_join", **join_query},
                    {"name": "spark_join", "kind": "spark_join", **join_query},
                    {"name": "kw_dedup", "kind": "kw_dedup", **dedup_query},
                    {"name": "spark_dedup", "kind": "spark_dedup", **dedup_query}]}
    reply = run_baseline(REPO_ROOT / "tests" / "integration" / "joins_spark_child.py", request,
                         timeout=1200)
    # The child produced the records in the order the test wrote them: each partition's
    # offsets are its records' positions.
    position: dict[tuple, int] = collections.Counter()
    for records, placed in zip(request["rounds"], reply["produced"]):
        for (topic, partition, _, _), got in zip(records, placed):
            assert got == [topic, partition, position[(topic, partition)]], got
            position[(topic, partition)] += 1
    return {"rounds": rounds, "topics": topics, "reply": reply}


def query(compared, name: str) -> dict:
    got = compared["reply"]["queries"][name]
    assert "error" not in got, f"{name} failed in the child:\n{got['error']}"
    return got


def placed(compared, stream: str) -> dict[tuple, tuple]:
    """(partition, offset) -> (round, timestamp, key) of every record of ``stream``."""
    out, seen = {}, collections.Counter()
    for round_no, records in enumerate(compared["rounds"]):
        for s, partition, timestamp, key in records:
            if s == stream:
                out[(partition, seen[partition])] = (round_no, timestamp, key)
                seen[partition] += 1
    return out


def test_the_baseline_is_spark_with_its_own_connector(compared):
    assert compared["reply"]["spark_version"] == "4.2.0"


def test_interval_join_gives_every_match_where_sparks_own_join_on_format_kafka_loses_them(
        compared):
    orders, payments = placed(compared, "orders"), placed(compared, "payments")
    truth = {(lp, rp) for lp, (_, lt, lk) in orders.items()
             for rp, (_, rt, rk) in payments.items() if lk == rk and lt <= rt <= lt + UPPER_MS}
    records = [r for rs in compared["rounds"] for r in rs]
    final = min(watermark_of([r for r in records if r[0] == stream])
                for stream in ("orders", "payments"))
    unmatched = {lp for lp in orders if not any(m[0] == lp for m in truth)}
    left_only = {lp for lp in unmatched if orders[lp][1] + UPPER_MS <= final}
    assert len(truth) == len(payments) == 90 and len(left_only) == 9

    rows = query(compared, "kw_join")["rows"]
    kinds = collections.Counter(r[2] for r in rows)
    matches = collections.Counter(((r[4], r[5]), (r[6], r[7])) for r in rows if r[2] == "match")
    assert matches == collections.Counter(truth)                      # every match, once
    outer = collections.Counter((r[4], r[5]) for r in rows if r[2] == "left_only")
    assert outer == collections.Counter(left_only)                    # each once, none matched
    assert set(kinds) == {"match", "left_only"}                       # nothing late
    # Never early: an outer row comes out in a round whose records already put the combined
    # watermark at or past the order's last possible match (lt + 5 s).
    for r in rows:
        if r[2] == "left_only":
            so_far = [x for rs in compared["rounds"][:r[0] + 1] for x in rs]
            reached = min(watermark_of([x for x in so_far if x[0] == s]) or 0
                          for s in ("orders", "payments"))
            assert orders[(r[4], r[5])][1] + UPPER_MS <= reached, r

    spark = query(compared, "spark_join")
    spark_matches = {((r[4], r[5]), (r[6], r[7])) for r in spark["rows"] if r[2] == "match"}
    assert spark_matches <= truth                                     # never a wrong pair
    spark_outer = collections.Counter((r[4], r[5]) for r in spark["rows"]
                                      if r[2] == "left_only")
    wrongly_unmatched = [lp for lp in spark_outer if lp not in unmatched]
    lost = len(truth) - len(spark_matches)
    print(f"\nSpark's own left outer join on format('kafka') matched {len(spark_matches)} of "
          f"{len(truth)} payments (lost {lost}); it emitted {len(wrongly_unmatched)} orders "
          f"that have a payment as unmatched; {spark['dropped_by_watermark']} input rows "
          f"dropped by its watermark. kwatermark: {sum(matches.values())} of {len(truth)}.")
    assert lost > 0    # the lagging partition's payments fall below Spark's global watermark
    assert all(rp[0] == 1 for _, rp in truth - spark_matches)        # ... and only those


def test_dedup_keeps_every_key_where_sparks_own_on_format_kafka_loses_the_lagging_ones(
        compared):
    records = placed(compared, "dedup")
    keys = collections.Counter(key for _, _, key in records.values())
    assert len(keys) == 110 and sum(n > 1 for n in keys.values()) == 10

    rows = query(compared, "kw_dedup")["rows"]
    assert {r[2] for r in rows} == {"first"}                          # nothing late
    assert collections.Counter(r[3] for r in rows) == collections.Counter(set(keys))
    for r in rows:                   # the row of its key that came first: the earlier copy
        assert records[(r[4], r[5])][2] == r[3]
        if keys[r[3]] > 1:
            assert r[4] == 0

    spark = query(compared, "spark_dedup")
    spark_keys = collections.Counter(r[3] for r in spark["rows"])
    assert set(spark_keys) <= set(keys)
    lost = set(keys) - set(spark_keys)
    print(f"\nSpark's own dropDuplicatesWithinWatermark on format('kafka') kept "
          f"{len(spark_keys)} of {len(keys)} keys (lost {len(lost)}; "
          f"{spark['dropped_by_watermark']} rows dropped by its watermark); kwatermark kept "
          f"{len(rows)}.")
    assert lost and all(k.startswith("u") for k in lost)    # the lagging partition's own events
