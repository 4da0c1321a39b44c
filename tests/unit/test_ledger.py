"""The progress ledger on a local directory (DESIGN §4)."""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import asdict, fields, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.errors import OptionError
from kwatermark.ledger import (
    ProgressLedger,
    ProgressRecord,
    pack_key,
    pack_keys,
    record_columns,
    record_content,
    record_key,
)
from kwatermark.offsets import PartitionState, RangeTask, TaskColumns
from kwatermark.watermarks import NO_PARTITIONS, UNDEFINED

FINGERPRINT = {"strategy": "monotonous", "bound": 0, "punctuation": None, "field": None,
               "assigner": None, "options": []}
RECORD = ProgressRecord(generator={"max_ts": 4000}, count=10, min_event_ms=1000,
                        max_event_ms=4000, max_row_watermark=2999)


def task(start: int = 10, end: int = 20, topic: str = "events", partition: int = 0,
         state: PartitionState | None = None) -> RangeTask:
    return RangeTask(topic, partition, start, end,
                     state or PartitionState(generator={"max_ts": 900}, last_read_ms=5),
                     True, 899, 700)


def record_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_publish_then_lookup(tmp_path):
    ledger = ProgressLedger(str(tmp_path / "ledger"))
    ledger.publish(task(), FINGERPRINT, RECORD)
    assert ledger.lookup(task(), FINGERPRINT) == RECORD
    # A second ledger object (another process) sees the same record.
    assert ProgressLedger(str(tmp_path / "ledger")).lookup(task(), FINGERPRINT) == RECORD
    files = record_files(tmp_path / "ledger")
    assert len(files) == 1 and files[0].suffix == ".json"   # no temporary file left


def test_a_record_is_written_with_every_field_as_kwatermark_0_1_wrote_it():
    """``to_json`` builds the dict from the fields without ``asdict`` (which deep-copied
    each generator snapshot, ~13 ms of a 512-range task): the same keys and values."""
    assert RECORD.to_json() == asdict(RECORD)
    assert set(RECORD.to_json()) == {f.name for f in fields(ProgressRecord)}
    assert ProgressRecord.from_json(RECORD.to_json()) == RECORD


def test_null_fields_round_trip(tmp_path):
    ledger = ProgressLedger(str(tmp_path))
    empty = ProgressRecord(generator={"max_ts": None}, count=0, min_event_ms=None,
                           max_event_ms=None, max_row_watermark=None)
    ledger.publish(task(), FINGERPRINT, empty)
    assert ledger.lookup(task(), FINGERPRINT) == empty


def test_publishing_twice_is_idempotent(tmp_path):
    ledger = ProgressLedger(str(tmp_path))
    ledger.publish(task(), FINGERPRINT, RECORD)
    ledger.publish(task(), FINGERPRINT, RECORD)
    assert ledger.lookup(task(), FINGERPRINT) == RECORD
    assert len(record_files(tmp_path)) == 1


@pytest.mark.parametrize("other", [
    task(start=11),
    task(end=21),
    task(partition=1),
    task(topic="other"),
    task(state=PartitionState(generator={"max_ts": 901}, last_read_ms=5)),
    task(state=PartitionState(generator={"max_ts": 900}, last_read_ms=6)),
    task(state=PartitionState(generator={"max_ts": 900}, last_read_ms=5, idle="exclude")),
    replace(task(), counted=False),
    replace(task(), previous_ms=900),
    replace(task(), others_ms=NO_PARTITIONS),
])
def test_a_different_range_or_start_state_misses(tmp_path, other):
    ledger = ProgressLedger(str(tmp_path))
    ledger.publish(task(), FINGERPRINT, RECORD)
    assert ledger.lookup(other, FINGERPRINT) is None


def test_a_different_watermark_configuration_misses(tmp_path):
    ledger = ProgressLedger(str(tmp_path))
    ledger.publish(task(), FINGERPRINT, RECORD)
    assert ledger.lookup(task(), {**FINGERPRINT, "strategy": "bounded", "bound": 5}) is None


def test_record_key_is_deterministic_and_content_addressed():
    assert record_key(task(), FINGERPRINT) == record_key(task(), dict(FINGERPRINT))
    assert len(record_key(task(), FINGERPRINT)) == 32
    assert record_key(task(), FINGERPRINT) != record_key(task(start=11), FINGERPRINT)
    assert record_key(replace(task(), others_ms=UNDEFINED), FINGERPRINT) != \
        record_key(task(), FINGERPRINT)


def test_record_keys_are_the_ones_kwatermark_0_1_wrote():
    """Records written before an upgrade are found after it (keys computed with
    connector/ledger.py at 0b9b1f5)."""
    assert record_key(task(), FINGERPRINT) == "0fb73b6d199c33c3db992db6ee0dc503"
    odd = replace(task(topic='a"b:c', state=PartitionState(
        generator={"max_ts": None, "x": [1, 2.5]}, held=True, idle="advance", advanced_ms=-3)),
        floor_ms=12, previous_ms=None, counted=False)
    assert record_key(odd, FINGERPRINT) == "5de0a2f2a5fde7e0b5a447cb8d2a54e4"


@settings(deadline=None, max_examples=200)
@given(topic=st.text(max_size=8), partition=st.integers(0, 5000),
       start=st.integers(0, 10**12), size=st.integers(0, 10**6),
       generator=st.one_of(st.none(), st.fixed_dictionaries(
           {"max_ts": st.one_of(st.none(), st.integers(-10**13, 10**13))}),
           st.dictionaries(st.text(max_size=4), st.one_of(st.none(), st.booleans(),
                                                            st.integers(), st.text(max_size=4),
                                                            st.floats(allow_nan=False)),
                           max_size=3)),
       counted=st.booleans(), previous=st.one_of(st.none(), st.integers(-10**13, 10**13)),
       others=st.integers(-2**63, 2**63 - 1),
       floor=st.one_of(st.none(), st.integers(-10**13, 10**13)))
def test_record_key_is_the_hash_of_the_record_content(topic, partition, start, size,
                                                       generator, counted, previous, others,
                                                       floor):
    ranged = RangeTask(topic, partition, start, start + size,
                       PartitionState(generator=generator, last_read_ms=start), counted,
                       previous, others, floor)
    assert record_key(ranged, FINGERPRINT) == hashlib.sha256(
        record_content(ranged, FINGERPRINT).encode()).hexdigest()[:32]


@pytest.mark.parametrize("content", [
    b"", b'{"generator": {"max_ts": 40', b"[]", b'{"generator": null}', b"\xff\xfe",
    b'{"generator": null, "count": 1, "min_event_ms": null, "max_event_ms": null}',
])
def test_a_corrupt_record_is_treated_as_missing(tmp_path, content):
    ledger = ProgressLedger(str(tmp_path))
    ledger.publish(task(), FINGERPRINT, RECORD)
    [path] = record_files(tmp_path)
    path.write_bytes(content)
    assert ledger.lookup(task(), FINGERPRINT) is None


def test_a_truncated_record_is_treated_as_missing(tmp_path):
    ledger = ProgressLedger(str(tmp_path))
    ledger.publish(task(), FINGERPRINT, RECORD)
    [path] = record_files(tmp_path)
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    assert ledger.lookup(task(), FINGERPRINT) is None


def test_lookup_in_an_empty_or_missing_location(tmp_path):
    assert ProgressLedger(str(tmp_path / "never-created")).lookup(task(), FINGERPRINT) is None


def test_forget_before_deletes_only_ranges_that_end_at_or_before_the_offset(tmp_path):
    ledger = ProgressLedger(str(tmp_path))
    old, edge, new = task(0, 10), task(10, 20), task(20, 30)
    other_partition = task(0, 10, partition=1)
    for t in (old, edge, new, other_partition):
        ledger.publish(t, FINGERPRINT, RECORD)
    ledger.forget_before("events", 0, 20)
    assert ledger.lookup(old, FINGERPRINT) is None
    assert ledger.lookup(edge, FINGERPRINT) is None
    assert ledger.lookup(new, FINGERPRINT) == RECORD
    assert ledger.lookup(other_partition, FINGERPRINT) == RECORD
    ledger.forget_before("events", 0, 20)                      # again: nothing left to do
    ledger.forget_before("never-seen", 4, 100)                 # no directory: no error
    assert len(record_files(tmp_path)) == 2


def test_topic_names_with_slashes_stay_inside_the_location(tmp_path):
    ledger = ProgressLedger(str(tmp_path / "ledger"))
    slashed = task(topic="a/../../b")
    ledger.publish(slashed, FINGERPRINT, RECORD)
    assert ledger.lookup(slashed, FINGERPRINT) == RECORD
    assert all((tmp_path / "ledger") in p.parents for p in record_files(tmp_path))
    ledger.forget_before("a/../../b", 0, 100)
    assert ledger.lookup(slashed, FINGERPRINT) is None


def test_ledger_pickles_without_its_filesystem(tmp_path):
    ledger = ProgressLedger(str(tmp_path))
    ledger.publish(task(), FINGERPRINT, RECORD)
    copy = pickle.loads(pickle.dumps(ledger))
    assert copy.lookup(task(), FINGERPRINT) == RECORD


def test_file_uri_location(tmp_path):
    ledger = ProgressLedger((tmp_path / "uri").as_uri())
    ledger.publish(task(), FINGERPRINT, RECORD)
    assert ledger.lookup(task(), FINGERPRINT) == RECORD
    assert record_files(tmp_path / "uri")


def test_an_executor_that_cannot_write_its_record_warns_and_does_not_fail(tmp_path, caplog):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the ledger's directory should be")
    ledger = ProgressLedger(str(blocker / "ledger"))
    with caplog.at_level("WARNING", logger="kwatermark.ledger"):
        assert ledger.offer(task(), FINGERPRINT, RECORD) is False
    assert "watermark.stateLocation" in caplog.text and "topic events partition 0" in caplog.text
    assert ledger.lookup(task(), FINGERPRINT) is None   # the driver will recompute it
    writable = ProgressLedger(str(tmp_path / "ledger"))
    assert writable.offer(task(), FINGERPRINT, RECORD) is True
    assert writable.lookup(task(), FINGERPRINT) == RECORD


def test_default_location_an_executor_that_does_not_share_it_refuses(tmp_path):
    driver = ProgressLedger(str(tmp_path / "driver-tmp" / "kwatermark-ledger"), default=True)
    mark = driver.driver_mark()
    assert mark is not None and Path(mark).exists() and driver.driver_mark() == mark
    # An executor on the same host (same file system) sees the mark and goes on.
    same_host = pickle.loads(pickle.dumps(driver))
    same_host.require_shared(mark)
    # An executor elsewhere: the same path string, but the driver's mark is not there.
    elsewhere = pickle.loads(pickle.dumps(driver))
    other_mark = str(tmp_path / "other-host" / Path(mark).name)
    with pytest.raises(OptionError, match=r"option watermark.stateLocation is unset.*"
                                           r"s3://bucket"):
        elsewhere.require_shared(other_mark)
    # One mark per driver host, whatever the number of queries started there.
    again = ProgressLedger(str(tmp_path / "driver-tmp" / "kwatermark-ledger"), default=True)
    assert again.driver_mark() == mark
    assert [p.name for p in (tmp_path / "driver-tmp" / "kwatermark-ledger").iterdir()] == [
        Path(mark).name]


def test_a_location_the_user_chose_needs_no_mark(tmp_path):
    ledger = ProgressLedger(str(tmp_path / "shared"))
    assert ledger.driver_mark() is None
    ledger.require_shared(None)            # nothing to check: missing records are recomputed
    assert not (tmp_path / "shared").exists()


# -- packs: one file for the ranges of one Spark task (DESIGN §12) ------------------------

PACK = (task(0, 10), task(10, 20), task(5, 9, topic="other", partition=3), task(0, 1,
                                                                                  partition=7))
PACK_RECORDS = [replace(RECORD, count=n) for n in (10, 10, 4, 1)]


def _publish_pack(ledger, tasks, records, key=None) -> None:
    """``publish_pack`` as a task calls it: its ranges and records as columns."""
    ledger.publish_pack(TaskColumns.of(tasks), FINGERPRINT, record_columns(records), key)


def _offer_pack(ledger, tasks, records) -> bool:
    return ledger.offer_pack(TaskColumns.of(tasks), FINGERPRINT, record_columns(records))


def test_a_pack_is_one_file_holding_each_range_record_in_order(tmp_path):
    ledger = ProgressLedger(str(tmp_path))
    _publish_pack(ledger, PACK, PACK_RECORDS)
    assert len(record_files(tmp_path)) == 1
    assert ledger.lookup_pack(PACK, FINGERPRINT) == PACK_RECORDS
    # Another grouping, order or configuration of the same ranges is another pack.
    assert ledger.lookup_pack(PACK[:3], FINGERPRINT) is None
    assert ledger.lookup_pack(PACK[::-1], FINGERPRINT) is None
    assert ledger.lookup_pack(PACK, {**FINGERPRINT, "bound": 5}) is None
    # A range's own record is not the pack's.
    assert ledger.lookup(PACK[0], FINGERPRINT) is None


# A value unlike PACK's for each field of a range and of its state.
OTHER_VALUES = {"topic": "events2", "partition": 1, "start": 11, "end": 19, "counted": False,
                "previous_ms": 898, "others_ms": 701, "floor_ms": 3,
                "generator": {"max_ts": 901}, "max_event_ms": 950, "advanced_ms": 7,
                "last_read_ms": 6, "idle": "exclude", "held": True}


@pytest.mark.parametrize("name", sorted(OTHER_VALUES))
def test_a_pack_key_changes_with_every_input_of_any_of_its_ranges(name):
    """A pack file is found only for the very ranges, states and configuration it was
    written for: a field left out of the key would apply a record to the wrong range."""
    assert {f.name for f in fields(RangeTask) if f.name != "state"} | \
        {f.name for f in fields(PartitionState)} == set(OTHER_VALUES)
    changed = PACK[1]
    if name in {f.name for f in fields(PartitionState)}:
        changed = replace(changed, state=replace(changed.state, **{name: OTHER_VALUES[name]}))
    else:
        changed = replace(changed, **{name: OTHER_VALUES[name]})
    assert pack_key(PACK, FINGERPRINT) != pack_key((PACK[0], changed) + PACK[2:], FINGERPRINT)
    assert pack_key(PACK, FINGERPRINT) == pack_key(tuple(replace(t) for t in PACK),
                                                   dict(FINGERPRINT))


OFFSET_JSON = {"events": {"0": 20, "7": 1}, "other": {"3": 9},
               "@kwatermark": {"v": 2, "watermark": 899, "plannedAt": 5}}
PACKING = (10_000, None, None)


def test_a_batch_pack_keys_follow_its_offset_configuration_packing_and_order():
    keys = pack_keys(OFFSET_JSON, FINGERPRINT, PACKING, 3)
    assert len(set(keys)) == 3
    # The same document, however its dicts are ordered (Spark hands back parsed JSON).
    assert pack_keys(dict(reversed(OFFSET_JSON.items())), dict(FINGERPRINT), PACKING, 3) == keys
    assert pack_keys(OFFSET_JSON, FINGERPRINT, PACKING, 2) == keys[:2]
    others = [
        pack_keys({**OFFSET_JSON, "events": {"0": 21, "7": 1}}, FINGERPRINT, PACKING, 3),
        pack_keys({**OFFSET_JSON, "@kwatermark": {**OFFSET_JSON["@kwatermark"],
                                                  "watermark": 900}}, FINGERPRINT, PACKING, 3),
        pack_keys(OFFSET_JSON, {**FINGERPRINT, "bound": 5}, PACKING, 3),
        pack_keys(OFFSET_JSON, FINGERPRINT, (20_000, None, None), 3),
        pack_keys(OFFSET_JSON, FINGERPRINT, (10_000, 4, None), 3),
        pack_keys(OFFSET_JSON, FINGERPRINT, (10_000, None, 100), 3),
    ]
    assert all(set(other).isdisjoint(keys) for other in others)


def test_a_pack_under_a_batch_key_is_found_only_for_the_ranges_it_names(tmp_path, caplog):
    ledger = ProgressLedger(str(tmp_path))
    [key] = pack_keys(OFFSET_JSON, FINGERPRINT, PACKING, 1)
    _publish_pack(ledger, PACK, PACK_RECORDS, key)
    assert ledger.lookup_pack(PACK, FINGERPRINT, key) == PACK_RECORDS
    assert ledger.lookup_pack(PACK, FINGERPRINT) is None        # not under the ranges' key
    # Planned otherwise (another version's packing) under the same key and first range: the
    # file names other ranges and is not applied to these.
    regrouped = PACK[:2] + (task(5, 8, topic="other", partition=3),) + PACK[3:]
    with caplog.at_level("WARNING", logger="kwatermark.ledger"):
        assert ledger.lookup_pack(regrouped, FINGERPRINT, key) is None
    assert "written for other ranges" in caplog.text


def test_a_pack_written_before_batch_keys_is_found_after_an_upgrade(tmp_path):
    """Tasks of kwatermark before pack_keys wrote ``{"ranges": [record, ...]}`` under the
    hash of the pack's ranges; the batch they ran is folded by the upgraded driver."""
    ledger = ProgressLedger(str(tmp_path))
    _publish_pack(ledger, PACK, PACK_RECORDS)
    [path] = record_files(tmp_path)
    assert pack_key(PACK, FINGERPRINT) in path.name
    path.write_text(json.dumps({"ranges": [asdict(r) for r in PACK_RECORDS]}))
    [key] = pack_keys(OFFSET_JSON, FINGERPRINT, PACKING, 1)
    assert ledger.lookup_pack(PACK, FINGERPRINT, key) == PACK_RECORDS


def test_a_pack_names_its_ranges_as_columns_and_one_written_as_lists_is_still_found(tmp_path):
    """A pack file names its ranges a column per field, its topic once when it has one; a
    file of the earlier layout (a list per range), written by a task that ran just before
    an upgrade, is folded by the upgraded driver, and is not applied to other ranges."""
    ledger = ProgressLedger(str(tmp_path))
    [key] = pack_keys(OFFSET_JSON, FINGERPRINT, PACKING, 1)
    one_topic = (task(0, 10), task(3, 5, partition=7), task(0, 1, partition=2))
    _publish_pack(ledger, one_topic, PACK_RECORDS[:3], key)
    [path] = record_files(tmp_path)
    assert json.loads(path.read_text())["at"] == {
        "topic": "events", "partition": [0, 7, 2], "from": [0, 3, 0], "to": [10, 5, 1]}
    ledger = ProgressLedger(str(tmp_path / "two-topics"))
    _publish_pack(ledger, PACK, PACK_RECORDS, key)
    [path] = record_files(tmp_path / "two-topics")
    content = json.loads(path.read_text())
    assert content["at"]["topic"] == ["events", "events", "other", "events"]
    content["at"] = [[t.topic, t.partition, t.start, t.end] for t in PACK]
    path.write_text(json.dumps(content))
    assert ledger.lookup_pack(PACK, FINGERPRINT, key) == PACK_RECORDS
    assert ledger.lookup_pack_columns(TaskColumns.of(PACK), FINGERPRINT, key)["count"] == [10, 10, 4, 1]
    regrouped = PACK[:2] + (task(5, 8, topic="other", partition=3),) + PACK[3:]
    assert ledger.lookup_pack(regrouped, FINGERPRINT, key) is None


def test_a_pack_of_one_range_is_that_range_record(tmp_path):
    ledger = ProgressLedger(str(tmp_path))
    _publish_pack(ledger, PACK[:1], PACK_RECORDS[:1])
    assert ledger.lookup(PACK[0], FINGERPRINT) == PACK_RECORDS[0]
    assert ledger.lookup_pack(PACK[:1], FINGERPRINT) == PACK_RECORDS[:1]


@pytest.mark.parametrize("content", [
    b"", b'{"ranges": [', b"[]", b'{"ranges": null}', b'{"ranges": [{"count": 1}]}',
    b'{"ranges": []}', b'{"at": null, "records": {}}',
])
def test_a_corrupt_pack_is_treated_as_missing(tmp_path, content):
    ledger = ProgressLedger(str(tmp_path))
    _publish_pack(ledger, PACK, PACK_RECORDS)
    [path] = record_files(tmp_path)
    path.write_bytes(content)
    assert ledger.lookup_pack(PACK, FINGERPRINT) is None


def test_a_pack_is_forgotten_once_its_first_partition_is_past_its_first_range(tmp_path):
    ledger = ProgressLedger(str(tmp_path))
    _publish_pack(ledger, PACK, PACK_RECORDS)
    ledger.forget_before("other", 3, 100)       # another of its partitions: kept
    ledger.forget_before("events", 0, 9)
    assert ledger.lookup_pack(PACK, FINGERPRINT) == PACK_RECORDS
    ledger.forget_before("events", 0, 10)
    assert ledger.lookup_pack(PACK, FINGERPRINT) is None
    assert record_files(tmp_path) == []


def test_an_executor_that_cannot_write_its_pack_warns_and_does_not_fail(tmp_path, caplog):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the ledger's directory should be")
    ledger = ProgressLedger(str(blocker / "ledger"))
    with caplog.at_level("WARNING", logger="kwatermark.ledger"):
        assert _offer_pack(ledger, PACK, PACK_RECORDS) is False
    assert "watermark.stateLocation" in caplog.text
    assert "4 ranges (topic events partition 0 offsets [0, 10) and 3 more)" in caplog.text
    assert _offer_pack(ProgressLedger(str(tmp_path / "ledger")), PACK, PACK_RECORDS) is True
