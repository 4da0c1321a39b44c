"""Issue 25: an interval join and a dedup whose query *process* is killed in the middle of a
micro-batch (SIGKILL of the driver with its JVM and Python workers, before the batch is
committed) and restarted on the same checkpoint give the rows of an undisturbed run: every
match once, no duplicate, none lost. Only rows of committed batches count, as a sink that
writes by batch id keeps them. Ground truth comes from the records the test produced."""

from __future__ import annotations

import collections
import json
import signal

from tests.integration.test_joins import (
    T0,
    duplicated_across_a_lagging_partition,
    full_join_truth,
    lagging_left,
    offsets,
)
from tests.integration.test_restart import KillableQuery

KILL_IN_BATCH = 2
WAIT_S = 420   # a Spark start and the whole stream, on a loaded 2-core machine


def query(directory, broker, topic: str, per_trigger: int) -> KillableQuery:
    directory.mkdir()
    q = KillableQuery(directory, broker, topic)
    q.options = {k: v for k, v in q.options.items() if not k.startswith("water")}
    q.options.update({"maxOffsetsPerTrigger": str(per_trigger), "watermark.heartbeat": "true",
                      "watermark.stateLocation": str(directory / "ledger")})
    return q


def committed(q: KillableQuery) -> dict[int, list]:
    """The sink's rows of every batch the checkpoint committed."""
    ids = sorted(int(p.stem.split("-")[1]) for p in q.out.glob("batch-*.json"))
    return {i: q.batch(i) for i in ids if (q.checkpoint / "commits" / str(i)).exists()}


def killed_and_restarted(q: KillableQuery, **operator) -> dict[int, list]:
    first = q.start("1 second", kill_in_batch=KILL_IN_BATCH, **operator)
    assert q.wait(first, WAIT_S) == -signal.SIGKILL, q.log.read_text()[-3000:]
    assert not (q.checkpoint / "commits" / str(KILL_IN_BATCH)).exists()   # killed mid-batch
    again = q.start("availableNow", **operator)
    assert q.wait(again, WAIT_S) == 0, q.log.read_text()[-3000:]
    batches = committed(q)
    assert q.batch(KILL_IN_BATCH, "attempt") == batches[KILL_IN_BATCH]   # the replay: same rows
    return batches


def undisturbed(q: KillableQuery, **operator) -> dict[int, list]:
    run = q.start("availableNow", **operator)
    assert q.wait(run, WAIT_S) == 0, q.log.read_text()[-3000:]
    return committed(q)


def counted(batches: dict[int, list]) -> collections.Counter:
    return collections.Counter(json.dumps(row) for rows in batches.values() for row in rows)


def test_join_killed_mid_batch_and_restarted_emits_every_match_once(
        broker, topic_factory, tmp_path):
    lefts, rights = topic_factory(2), topic_factory(1)
    for left, right in lagging_left():
        lefts.send(left)
        rights.send(right)

    def start(name: str) -> tuple[KillableQuery, dict]:
        q = query(tmp_path / name, broker, lefts.topic, per_trigger=30)
        right = {**q.options, "subscribe": rights.topic, "maxOffsetsPerTrigger": "15",
                 "watermark.stateLocation": str(tmp_path / name / "right-ledger")}
        join = {"right_options": right, "lower": "-1 second", "upper": "1 second",
                "how": "full"}
        return q, join

    calm_query, join = start("calm")
    calm = undisturbed(calm_query, join=join)
    killed_query, join = start("killed")
    restarted = killed_and_restarted(killed_query, join=join)
    assert len(restarted) > KILL_IN_BATCH + 1
    assert counted(restarted) == counted(calm)

    truth, left_only, right_only = full_join_truth(lefts.produced, rights.produced)
    assert len(truth) >= 40 and left_only and right_only
    rows = [row for batch in restarted.values() for row in batch]
    assert collections.Counter(((r[2], r[3]), (r[4], r[5])) for r in rows if r[0] == "match") \
        == collections.Counter(truth)                                 # every match, once
    assert collections.Counter((r[2], r[3]) for r in rows if r[0] == "left_only") \
        == collections.Counter(left_only)
    assert collections.Counter((r[4], r[5]) for r in rows if r[0] == "right_only") \
        == collections.Counter(right_only)
    assert {r[0] for r in rows} == {"match", "left_only", "right_only"}


def test_dedup_killed_mid_batch_and_restarted_keeps_one_of_each_key(
        broker, topic_factory, tmp_path):
    writer = topic_factory(2)
    for records in duplicated_across_a_lagging_partition():
        writer.send(records)
    dedup = {"within": "5 seconds"}
    calm = undisturbed(query(tmp_path / "calm", broker, writer.topic, per_trigger=30),
                       dedup=dedup)
    restarted = killed_and_restarted(
        query(tmp_path / "killed", broker, writer.topic, per_trigger=30), dedup=dedup)
    assert len(restarted) > KILL_IN_BATCH + 1
    assert counted(restarted) == counted(calm)

    at = offsets(writer.produced)
    keys = collections.Counter(r.key.decode() for r in writer.produced)
    assert len(keys) == 110 and sum(n > 1 for n in keys.values()) == 10
    rows = [row for batch in restarted.values() for row in batch]
    assert {r[0] for r in rows} == {"first"}                          # nothing late
    assert collections.Counter(r[1] for r in rows) == collections.Counter(set(keys))
    for kind, key, partition, offset in rows:     # the row it names, the earlier copy
        assert at[(partition, offset)].key.decode() == key
        assert keys[key] == 1 or (partition == 0 and at[(partition, offset)].timestamp
                                  == T0 + int(key[1:]) * 1_000)
