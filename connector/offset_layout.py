"""How an offset is written to Spark's offset log and query progress (DESIGN §4, §21).

Layout 2 (kwatermark 0.2): Spark's Kafka offsets, ``{"topic": {"0": 123}}`` (each partition's
next offset to read: the batch's ``to``), and beside them, under the key ``"@kwatermark"``
(no Kafka topic can have that name), the combined watermark, the planning time and each
topic's per-partition state as *columns*:

    {"events": {"0": 130, "1": 128},
     "@kwatermark": {"v": 2, "watermark": 1699999994999, "plannedAt": 1700000001000,
                     "holder": "events:1",
                     "topics": {"events": {"read": [10, 8], "gen": 1, "genKeys": ["max_ts"],
                                           "gen.max_ts": {"d": [1700000000000, 2]}, ...}}}}

A column holds one value per partition of the topic, in ascending partition order, written
in the shortest of these forms:

* absent: every partition has the column's default (``read`` 0, ``idle`` "count", ...);
* a JSON scalar: every partition has that value;
* a list: the values in partition order;
* ``{"d": [first, +d, ...]}``: integers as differences from the previous non-null one;
* ``{"of": "column", "plus": k}``: another column (written before it) plus ``k``, nulls at
  the same places (``maxEvent`` is ``gen.max_ts``, ``wm`` is ``gen.max_ts - bound - 1``);
* ``{"else": v, "at": {"3": x}}``: ``v`` but for the partitions listed.

(``kwatermark.offset_columns`` chooses a column's form and reads it back.)

When the offset spans several topics, a column whose value, or ``of``/``plus`` form, is the
same in every topic is written once, in ``"every"`` beside ``"topics"``, and left out of
each topic's; a topic's own column would win over it (offsets written before ``"every"``
have each topic's columns in full and read the same).

``from`` is ``to - read``; a generator snapshot that is an object of scalars is split into one
column per key (``genKeys``, and ``gen`` = 1 where a partition has such a snapshot, null where
it is fresh); any other snapshot is kept whole in ``gen``. The lags that follow from the state
and ``plannedAt`` (event-time and processing lag) are not written unless they do not.

Layout 1 (kwatermark 0.1: ``{"v": 1, "watermark": W, "partitions": {"topic:p": {"from": s,
"to": e, "state": {...}, "lag": {...}}}}``) is still read, so a checkpoint of 0.1 goes on.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from operator import itemgetter

from kwatermark.offset_columns import (
    OMIT,
    SCALAR_TYPES,
    SCALARS,
    Column,
    decode,
    encode,
    shared_forms,
)
from kwatermark.offsets import (
    BatchOffset,
    OffsetFormatError,
    PartitionLag,
    PartitionRange,
    PartitionState,
    optional_int,
    parse_tp_key,
    tp_key,
)
from kwatermark.partition_columns import OffsetColumns, columns_of

KEY = "@kwatermark"
LAYOUT = 2

# column -> default; written in this order ("of" refers only to columns before it)
_STATE_COLUMNS = ("read", "gen", "maxEvent", "advanced", "lastRead", "idle", "held", "lag",
                  "wm", "procWm", "unread", "eventLag", "procLag")
_DEFAULTS = {"read": 0, "gen": None, "maxEvent": None, "advanced": None, "lastRead": 0,
             "idle": "count", "held": False, "lag": False, "wm": None, "procWm": None,
             "unread": None}
_IDLE = ("count", "exclude", "advance")


# -- writing ---------------------------------------------------------------------------


def to_json(offset: BatchOffset) -> dict:
    """``offset`` in layout 2."""
    columns = columns_of(offset)
    tps = columns.tps
    data: dict = {}
    topics: dict[str, _Topic] = {}
    low = 0
    while low < len(tps):   # a topic's partitions are consecutive rows, in order
        topic = tps[low][0]
        if topic == KEY:
            raise OffsetFormatError(f"offset: topic {KEY!r} cannot be written (reserved)")
        high = bisect_right(tps, topic, lo=low, key=itemgetter(0))
        partitions = [p for _, p in tps[low:high]]
        data[topic] = dict(zip(map(str, partitions), columns.end[low:high]))
        topics[topic] = _Topic(partitions, columns, low, high, offset.planned_ms)
        low = high
    every = _every(list(topics.values())) if len(topics) > 1 else {}
    own: dict = {"v": LAYOUT, "watermark": offset.watermark}
    if offset.heartbeat:
        own["heartbeat"] = True
    if offset.planned_ms is not None:
        own["plannedAt"] = offset.planned_ms
    if offset.holder is not None:
        own["holder"] = tp_key(offset.holder)
    if every:
        own["every"] = every
    written = {}
    for topic, columns_of_topic in topics.items():
        left = {name: value for name, value in columns_of_topic.columns.items()
                if name not in every}
        if left:
            written[topic] = left
    if written:
        own["topics"] = written
    data[KEY] = own
    return data


# A layout column and the OffsetColumns state or lag column it writes.
_STATE_SOURCES = {"maxEvent": "max_event_ms", "advanced": "advanced_ms",
                  "lastRead": "last_read_ms", "idle": "idle", "held": "held"}
_LAG_SOURCES = {"wm": "watermark_ms", "procWm": "processing_wm_ms", "unread": "unread",
                "eventLag": "event_lag_ms", "procLag": "processing_lag_ms"}


class _Topic:
    """A topic's columns in their shortest forms (``columns``) and, asked for, the forms of
    each that would do for any topic (:func:`offset_columns.shared_forms`: computed only
    when ``"every"`` needs them)."""

    def __init__(self, partitions: list[int], offset: OffsetColumns, low: int, high: int,
                 planned: int | None):
        self.columns: dict = {}
        self.written: dict[str, Column] = {}
        self._forms: dict[str, list] = {}
        state, lag = offset.state, offset.lag
        values: dict[str, list] = {
            "read": [e - s for s, e in zip(offset.start[low:high], offset.end[low:high])],
            "lag": offset.has_lag[low:high]}
        for name, source in _STATE_SOURCES.items():
            values[name] = state[source][low:high]
        for name, source in _LAG_SOURCES.items():
            values[name] = lag[source][low:high]
        snapshots = state["generator"][low:high]
        flat = _flat_columns(snapshots)
        self._put(partitions, "read", values["read"], 0)
        if flat is None:
            self._put(partitions, "gen", snapshots, None)
        else:
            keys = list(flat)
            self.columns["genKeys"] = keys
            self._forms["genKeys"] = [keys]   # the same list or nothing in common
            self._put(partitions, "gen", [None if s is None else 1 for s in snapshots], None)
            for key, column in flat.items():
                self._put(partitions, f"gen.{key}", column)
        for name in _STATE_COLUMNS[2:11]:
            self._put(partitions, name, values[name], _DEFAULTS[name])
        # The lags that follow from the partition watermark and the planning time are left
        # out.
        for name, base in (("eventLag", "wm"), ("procLag", "procWm")):
            if values[name] != _lags(values[base], planned):
                self._put(partitions, name, values[name])

    def _put(self, partitions: list[int], name: str, values: list | Column,
             default: object = OMIT) -> None:
        column = values if isinstance(values, Column) else Column(values)
        # A column of one value is written as that value: its other forms wait.
        forms = None if column.uniform else self.forms(name, column)
        encoded = encode(column, partitions, forms, default)
        if encoded is not OMIT:
            self.columns[name] = encoded
        self.written[name] = column

    def forms(self, name: str, column: Column | None = None) -> list:
        if name not in self._forms:
            earlier = {}
            for other, written in self.written.items():
                if other == name:
                    break
                earlier[other] = written
            self._forms[name] = shared_forms(
                self.written[name] if column is None else column, earlier)
        return self._forms[name]


def _every(topics: list[_Topic]) -> dict:
    """The columns that every topic writes and that one same form says for all of them
    (a value, another column plus a constant), each in its shortest such form: written
    once, as ``"every"``, not once per topic (64 partitions in 16 topics: ~290 B a topic
    less)."""
    first, *rest = topics
    every = {}
    for name, encoded in first.columns.items():
        if any(name not in topic.columns for topic in rest):
            continue
        column = first.written.get(name)   # none for genKeys
        if column is not None and column.uniform and \
                all(_key(topic.columns[name]) == _key(encoded) for topic in rest):
            every[name] = encoded   # one value in every topic: shorter than any other form
            continue
        found = {_key(form): form for form in first.forms(name)}
        for topic in rest:
            found = {key: form for key, form in
                     ((_key(f), f) for f in topic.forms(name)) if key in found}
        if found:
            every[name] = min(found.values(), key=lambda form: (len(_text(form)),
                                                                _text(form)))
    return every


def _key(form: object) -> object:
    """``form`` as a dict key, equal only to the same JSON (1, 1.0 and True differ)."""
    if isinstance(form, dict) and set(form) == {"of", "plus"}:
        return ("of", form["of"], form["plus"])
    if isinstance(form, SCALARS):
        return type(form), form
    return _text(form)


def _text(form: object) -> str:
    return json.dumps(form, separators=(",", ":"), sort_keys=True)


def _lags(marks: list, planned: int | None) -> list:
    return [None if m is None or planned is None else planned - m for m in marks]


def _flat_columns(snapshots: list) -> dict[str, Column] | None:
    """The snapshots split into a column per key, keys sorted (None where a snapshot is
    None), when every one is None or an object of scalars with the same keys (at least one
    of them an object); else None (kept whole)."""
    present = [snapshot for snapshot in snapshots if snapshot is not None]
    if not present or not all(issubclass(kind, dict) for kind in set(map(type, present))):
        return None
    keys = present[0].keys()
    if not all(map(keys.__eq__, map(dict.keys, present))):   # the same keys, in any order
        return None
    columns = {key: Column([None if s is None else s[key] for s in snapshots])
               for key in sorted(keys)}
    for column in columns.values():
        kinds = column.kinds
        if not kinds <= SCALAR_TYPES and not all(issubclass(k, SCALARS) for k in kinds):
            return None
    return columns


# -- reading ---------------------------------------------------------------------------


def from_json(data: dict) -> BatchOffset:
    """Parse layout 2 or layout 1 (already loaded JSON)."""
    if KEY in data:
        return _from_layout_2(data)
    if isinstance(data.get("partitions"), dict):
        return _from_layout_1(data)
    raise OffsetFormatError(f"offset: expected kwatermark's offset ({KEY!r} beside Spark's "
                            f"Kafka offsets, or 'partitions' of kwatermark 0.1), got "
                            f"{str(data)[:200]!r} (was the checkpoint written by another "
                            f"source?)")


def _from_layout_2(data: dict) -> BatchOffset:
    own = data[KEY]
    if not isinstance(own, dict):
        raise OffsetFormatError(f"offset: {KEY} must be an object, got {str(own)[:100]!r}")
    version = own.get("v")
    if version != LAYOUT:
        raise OffsetFormatError(f"offset: layout {version!r} is not supported by this "
                                f"kwatermark (reads 1 and {LAYOUT})")
    planned = optional_int("offset", "plannedAt", own.get("plannedAt"))
    topics = own.get("topics", {})
    if not isinstance(topics, dict):
        raise OffsetFormatError(f"offset: topics must be an object, got {topics!r}")
    every = own.get("every", {})
    if not isinstance(every, dict):
        raise OffsetFormatError(f"offset: every must be an object, got {str(every)[:100]!r}")
    unknown = sorted(set(topics) - set(data))
    if unknown:
        raise OffsetFormatError(f"offset: topic {unknown[0]!r} has state but no offsets")
    partitions = {}
    for topic, ends in data.items():
        if topic == KEY:
            continue
        if not isinstance(ends, dict) or not ends:
            raise OffsetFormatError(f"offset: topic {topic!r}: expected {{\"partition\": "
                                    f"offset}}, got {str(ends)[:100]!r}")
        numbered = []
        for key, end in ends.items():
            if not re.fullmatch(r"[0-9]+", key):
                raise OffsetFormatError(f"offset: topic {topic!r}: partition {key!r} is not "
                                        f"a number")
            numbered.append((int(key), optional_int(f"{topic}:{key}", "offset", end)))
        numbered.sort()
        columns = topics.get(topic, {})
        if not isinstance(columns, dict):
            raise OffsetFormatError(f"offset: topic {topic!r}: state must be an object")
        for tp, r in _topic_ranges(topic, numbered, {**every, **columns}, planned):
            partitions[tp] = r
    heartbeat = own.get("heartbeat", False)
    if not isinstance(heartbeat, bool):
        raise OffsetFormatError(f"offset: heartbeat must be true or false, got {heartbeat!r}")
    holder = own.get("holder")
    if holder is not None and not isinstance(holder, str):
        raise OffsetFormatError(f"offset: holder must be 'topic:partition', got {holder!r}")
    return BatchOffset(optional_int("offset", "watermark", own.get("watermark")), partitions,
                       heartbeat, planned, parse_tp_key(holder) if holder is not None else None)


def _topic_ranges(topic: str, numbered: list[tuple[int, int | None]], columns: dict,
                  planned: int | None):
    partitions = [p for p, _ in numbered]
    names = list(columns)
    known = set(_STATE_COLUMNS) | {"genKeys"}
    keys = columns.get("genKeys")
    if keys is not None and (not isinstance(keys, list) or
                             not all(isinstance(k, str) for k in keys)):
        raise OffsetFormatError(f"offset: topic {topic!r}: genKeys must be a list of names")
    known |= {f"gen.{k}" for k in keys or []}
    strange = [n for n in names if n not in known]
    if strange:
        raise OffsetFormatError(f"offset: topic {topic!r}: unknown column {strange[0]!r}")
    order = ["read", "gen"] + [f"gen.{k}" for k in keys or []] + list(_STATE_COLUMNS[2:])
    values: dict[str, list] = {}
    for name in order:
        if name in columns:
            values[name] = decode(topic, name, columns[name], partitions, values)
        elif name in ("eventLag", "procLag"):
            continue
        else:
            values[name] = [_DEFAULTS.get(name)] * len(partitions)
    base = {"eventLag": "wm", "procLag": "procWm"}
    for name, mark in base.items():
        if name not in values:
            for partition, value in zip(partitions, values[mark]):
                optional_int(f"{topic}:{partition}", mark, value)
            values[name] = _lags(values[mark], planned)
    for i, (partition, end) in enumerate(numbered):
        where = f"{topic}:{partition}"
        read = optional_int(where, "read", values["read"][i])
        if end is None or read is None or read < 0 or read > end:
            raise OffsetFormatError(f"offset: {where}: invalid range to={end} read={read}")
        if keys is not None:
            present = values["gen"][i]
            if present not in (None, 1):
                raise OffsetFormatError(f"offset: {where}: gen must be 1 or null with genKeys")
            generator = None if present is None else {
                k: values[f"gen.{k}"][i] for k in keys}
        else:
            generator = values["gen"][i]
        idle = values["idle"][i]
        if idle not in _IDLE:
            raise OffsetFormatError(f"offset: {where}: unknown idle decision {idle!r}")
        held = values["held"][i]
        if not isinstance(held, bool):
            raise OffsetFormatError(f"offset: {where}: held must be true or false, got "
                                    f"{held!r}")
        has_lag = values["lag"][i]
        if not isinstance(has_lag, bool):
            raise OffsetFormatError(f"offset: {where}: lag must be true or false")
        last_read = optional_int(where, "lastRead", values["lastRead"][i])
        state = PartitionState(
            generator=generator,
            max_event_ms=optional_int(where, "maxEvent", values["maxEvent"][i]),
            advanced_ms=optional_int(where, "advanced", values["advanced"][i]),
            last_read_ms=0 if last_read is None else last_read, idle=idle, held=held)
        lag = PartitionLag(*(optional_int(where, name, values[name][i]) for name in
                             ("wm", "procWm", "eventLag", "procLag", "unread"))
                           ) if has_lag else None
        yield (topic, partition), PartitionRange(end - read, end, state, lag)


def _from_layout_1(data: dict) -> BatchOffset:
    version = data.get("v", 1)
    if version != 1:
        raise OffsetFormatError(f"offset: version {version!r} is not supported by this "
                                f"kwatermark (reads 1 and {LAYOUT})")
    partitions = {}
    for key, entry in data["partitions"].items():
        tp = parse_tp_key(key)
        if not isinstance(entry, dict):
            raise OffsetFormatError(f"offset: {key}: expected an object, got {entry!r}")
        start = optional_int(key, "from", entry.get("from"))
        end = optional_int(key, "to", entry.get("to"))
        if start is None or end is None or start < 0 or end < start:
            raise OffsetFormatError(f"offset: {key}: invalid range from={start} to={end}")
        partitions[tp] = PartitionRange(start, end, PartitionState.from_json(
            key, entry.get("state", {})), PartitionLag.from_json(key, entry.get("lag")))
    heartbeat = data.get("heartbeat", False)
    if not isinstance(heartbeat, bool):
        raise OffsetFormatError(f"offset: heartbeat must be true or false, got {heartbeat!r}")
    holder = data.get("holder")
    if holder is not None and not isinstance(holder, str):
        raise OffsetFormatError(f"offset: holder must be 'topic:partition', got {holder!r}")
    return BatchOffset(optional_int("offset", "watermark", data.get("watermark")), partitions,
                       heartbeat, optional_int("offset", "plannedAt", data.get("plannedAt")),
                       parse_tp_key(holder) if holder is not None else None)
