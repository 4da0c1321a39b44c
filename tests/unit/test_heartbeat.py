"""The pure parts of heartbeat micro-batches (DESIGN §10): the offset flag, the carrier row,
the `is_heartbeat` column's place in the schema and the `watermark.heartbeat` option."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from kwatermark.arrow import TIMESTAMP, OutputLayout, heartbeat_batch
from kwatermark.errors import OptionError
from kwatermark.offsets import BatchOffset, OffsetFormatError, PartitionRange, PartitionState
from kwatermark.options import parse_options

BASE = {"kafka.bootstrap.servers": "broker:9092", "subscribe": "events"}

# -- the offset -------------------------------------------------------------------------------


def heartbeat_offset() -> BatchOffset:
    return BatchOffset(1_700_000_000_123, {
        ("events", 0): PartitionRange(7, 7, PartitionState(max_event_ms=1_700_000_000_500)),
        ("events", 1): PartitionRange(3, 3, PartitionState(idle="exclude", last_read_ms=99)),
    }, heartbeat=True)


def test_a_heartbeat_offset_round_trips_through_json():
    offset = heartbeat_offset()
    text = offset.dumps()
    assert json.loads(text)["@kwatermark"]["heartbeat"] is True
    assert BatchOffset.from_json(text) == offset
    assert BatchOffset.from_json(json.loads(text)) == offset
    assert BatchOffset.from_json(text).dumps() == text       # replayed byte for byte


def test_an_ordinary_offset_has_no_heartbeat_key_so_old_checkpoints_read_the_same():
    ordinary = BatchOffset(5, {("events", 0): PartitionRange(0, 4)})
    assert "heartbeat" not in ordinary.to_json()["@kwatermark"]
    # An offset written before heartbeats existed: no key at all.
    old = {"v": 1, "watermark": 5,
           "partitions": {"events:0": {"from": 0, "to": 4, "state": {}}}}
    parsed = BatchOffset.from_json(json.dumps(old))
    assert parsed.heartbeat is False
    assert parsed.watermark == 5 and parsed.partitions[("events", 0)].end == 4


def with_heartbeat(value: object) -> dict:
    data = heartbeat_offset().to_json()
    data["@kwatermark"]["heartbeat"] = value
    return data


def test_an_explicit_false_heartbeat_parses_as_an_ordinary_offset():
    parsed = BatchOffset.from_json(with_heartbeat(False))
    assert parsed.heartbeat is False
    assert "heartbeat" not in parsed.to_json()["@kwatermark"]


@pytest.mark.parametrize("value", ["true", 1, 0, None, [True], {"on": True}])
def test_a_heartbeat_flag_that_is_not_a_boolean_is_refused(value):
    with pytest.raises(OffsetFormatError) as info:
        BatchOffset.from_json(with_heartbeat(value))
    assert "heartbeat must be true or false" in str(info.value)
    assert repr(value) in str(info.value)


# -- the carrier row --------------------------------------------------------------------------


LAYOUTS = [
    OutputLayout(heartbeat=True),
    OutputLayout(heartbeat=True, include_headers=True, flag_late=True),
    OutputLayout(heartbeat=True, flag_late=True, key_type=pa.string(),
                 value_type=pa.struct([pa.field("amount", pa.int64())]),
                 error_column=True, key_error_column=True),
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_heartbeat_row_has_exactly_the_declared_schema(layout):
    batch = heartbeat_batch(layout, 1_700_000_000_123)
    assert batch.schema == layout.schema()
    assert batch.schema.equals(layout.schema(), check_metadata=True)
    assert batch.num_rows == 1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_heartbeat_row_is_null_but_for_its_watermark_and_flag(layout):
    row = heartbeat_batch(layout, 1_700_000_000_123).to_pylist()[0]
    assert row.pop("watermark") == datetime(2023, 11, 14, 22, 13, 20, 123_000,
                                            tzinfo=timezone.utc)
    assert row.pop("is_heartbeat") is True
    assert row == {name: None for name in row}


def test_the_heartbeat_watermark_is_utc_microseconds():
    column = heartbeat_batch(OutputLayout(heartbeat=True), -1_500).column("watermark")
    assert column.type == TIMESTAMP == pa.timestamp("us", tz="UTC")
    assert column.cast(pa.int64()).to_pylist() == [-1_500_000]      # before the epoch too


def test_a_heartbeat_with_no_watermark_carries_null():
    row = heartbeat_batch(OutputLayout(heartbeat=True), None).to_pylist()[0]
    assert row["watermark"] is None and row["is_heartbeat"] is True


# -- the schema -------------------------------------------------------------------------------


def test_is_heartbeat_sits_after_watermark_and_before_is_late():
    names = OutputLayout(heartbeat=True, flag_late=True, include_headers=True,
                         key_type=pa.string()).schema().names
    assert names[names.index("watermark") + 1] == "is_heartbeat"
    assert names[names.index("is_heartbeat") + 1] == "is_late"
    assert names[-1] == "key_decoded"
    field = OutputLayout(heartbeat=True).schema().field("is_heartbeat")
    assert field.type == pa.bool_() and field.nullable


def test_without_the_option_the_schema_has_no_is_heartbeat():
    assert "is_heartbeat" not in OutputLayout(flag_late=True).schema().names
    plain = OutputLayout(flag_late=True).schema().names
    with_it = OutputLayout(flag_late=True, heartbeat=True).schema().names
    assert [n for n in with_it if n != "is_heartbeat"] == plain


# -- the option -------------------------------------------------------------------------------


def test_heartbeat_option_is_off_by_default():
    assert parse_options(BASE, streaming=True).heartbeat is False


@pytest.mark.parametrize("text, expected", [("true", True), ("false", False), ("TRUE", True),
                                            (" False ", False)])
def test_heartbeat_option_parses_booleans(text, expected):
    assert parse_options({**BASE, "watermark.heartbeat": text}, streaming=True).heartbeat \
        is expected


@pytest.mark.parametrize("text", ["yes", "1", "", "on"])
def test_a_bad_heartbeat_option_names_the_option(text):
    with pytest.raises(OptionError) as info:
        parse_options({**BASE, "watermark.heartbeat": text}, streaming=True)
    assert "watermark.heartbeat" in str(info.value)
    assert repr(text) in str(info.value)
