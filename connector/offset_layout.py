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
from collections import Counter

import numpy as np

from kwatermark.offsets import (
    BatchOffset,
    OffsetFormatError,
    PartitionLag,
    PartitionRange,
    PartitionState,
    parse_tp_key,
    tp_key,
)

KEY = "@kwatermark"
LAYOUT = 2
_SEP = (",", ":")

# column -> default; written in this order ("of" refers only to columns before it)
_STATE_COLUMNS = ("read", "gen", "maxEvent", "advanced", "lastRead", "idle", "held", "lag",
                  "wm", "procWm", "unread", "eventLag", "procLag")
_DEFAULTS = {"read": 0, "gen": None, "maxEvent": None, "advanced": None, "lastRead": 0,
             "idle": "count", "held": False, "lag": False, "wm": None, "procWm": None,
             "unread": None}
_IDLE = ("count", "exclude", "advance")
_SCALARS = (str, int, float, bool, type(None))
_SCALAR_TYPES = frozenset(_SCALARS)
_INT_TYPES = frozenset((int, type(None)))


# -- writing ---------------------------------------------------------------------------


def to_json(offset: BatchOffset) -> dict:
    """``offset`` in layout 2."""
    by_topic: dict[str, list[tuple[int, PartitionRange]]] = {}
    for (topic, partition), r in offset.partitions.items():
        if topic == KEY:
            raise OffsetFormatError(f"offset: topic {KEY!r} cannot be written (reserved)")
        by_topic.setdefault(topic, []).append((partition, r))
    data: dict = {}
    topics = {}
    for topic in sorted(by_topic):
        parts = sorted(by_topic[topic], key=lambda item: item[0])
        data[topic] = {str(p): r.end for p, r in parts}
        columns = _topic_columns([p for p, _ in parts], [r for _, r in parts],
                                 offset.planned_ms)
        if columns:
            topics[topic] = columns
    own: dict = {"v": LAYOUT, "watermark": offset.watermark}
    if offset.heartbeat:
        own["heartbeat"] = True
    if offset.planned_ms is not None:
        own["plannedAt"] = offset.planned_ms
    if offset.holder is not None:
        own["holder"] = tp_key(offset.holder)
    if topics:
        own["topics"] = topics
    data[KEY] = own
    return data


def _topic_columns(partitions: list[int], ranges: list[PartitionRange],
                   planned: int | None) -> dict:
    values: dict[str, list] = {
        "read": [r.end - r.start for r in ranges],
        "maxEvent": [r.state.max_event_ms for r in ranges],
        "advanced": [r.state.advanced_ms for r in ranges],
        "lastRead": [r.state.last_read_ms for r in ranges],
        "idle": [r.state.idle for r in ranges],
        "held": [r.state.held for r in ranges],
        "lag": [r.lag is not None for r in ranges],
    }
    for name, attribute in (("wm", "watermark_ms"), ("procWm", "processing_wm_ms"),
                            ("unread", "unread"), ("eventLag", "event_lag_ms"),
                            ("procLag", "processing_lag_ms")):
        values[name] = [None if r.lag is None else getattr(r.lag, attribute) for r in ranges]
    columns: dict = {}
    written: dict[str, _Column] = {}

    def put(name: str, values: list) -> None:
        column = _Column(values)
        encoded = _encode(name, column, partitions, written)
        if encoded is not _OMIT:
            columns[name] = encoded
        written[name] = column

    snapshots = [r.state.generator for r in ranges]
    keys = _flat_keys(snapshots)
    put("read", values["read"])
    if keys is None:
        put("gen", snapshots)
    else:
        columns["genKeys"] = keys
        put("gen", [None if s is None else 1 for s in snapshots])
        for key in keys:
            put(f"gen.{key}", [None if s is None else s[key] for s in snapshots])
    for name in _STATE_COLUMNS[2:11]:
        put(name, values[name])
    # The lags that follow from the partition watermark and the planning time are left out.
    for name, base in (("eventLag", "wm"), ("procLag", "procWm")):
        derived = _lags(values[base], planned)
        if values[name] != derived:
            columns[name] = _encode(name, _Column(values[name]), partitions, written,
                                    omit=False)
    return columns


def _lags(marks: list, planned: int | None) -> list:
    return [None if m is None or planned is None else planned - m for m in marks]


def _flat_keys(snapshots: list) -> list[str] | None:
    """The keys of the snapshots when every one is None or an object of scalars with the
    same keys (at least one of them an object); else None (kept whole)."""
    keys = None
    kinds: set[type] = set()   # of the values: checked once at the end, not per snapshot
    for snapshot in snapshots:
        if snapshot is None:
            continue
        if not isinstance(snapshot, dict):
            return None
        kinds.update(map(type, snapshot.values()))
        if keys is None:
            keys = snapshot.keys()
        elif snapshot.keys() != keys:   # as sets: one sort at the end, not one per partition
            return None
    if not kinds <= _SCALAR_TYPES and not all(issubclass(k, _SCALARS) for k in kinds):
        return None
    return None if keys is None else sorted(keys)


class _Omit:
    pass


_OMIT = _Omit()

# Integers whose differences numpy computes exactly (int64); beyond, Python's ints do.
_NUMPY_SAFE = 2 ** 62
# Columns shorter than this stay Python lists: numpy's fixed cost per call is higher there.
_NUMPY_FROM = 64


class _Column:
    """A column's values (one per partition, in partition order), their types, and, when
    every value is a Python int small enough, the same as an int64 array: the forms that
    compare whole columns (``of``/``plus``, differences, the most common value) are then
    computed by numpy, not by a Python loop over thousands of partitions per column."""

    def __init__(self, values: list):
        self.values = values
        self.kinds = set(map(type, values))
        self._ints: np.ndarray | None | bool = False   # False: not computed yet

    @property
    def ints(self) -> np.ndarray | None:
        if self._ints is False:
            self._ints = None
            if self.kinds == {int} and len(self.values) >= _NUMPY_FROM:
                low, high = min(self.values), max(self.values)
                if -_NUMPY_SAFE < low and high < _NUMPY_SAFE:
                    self._ints = np.array(self.values, dtype=np.int64)
        return self._ints


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _encode(name: str, col: _Column, partitions: list[int], written: dict[str, _Column],
            omit: bool = True) -> object:
    """The shortest form of ``col`` (see the module's docstring); ``_OMIT`` when every
    value is the column's default. Deterministic in the values: a replayed batch writes the
    same bytes. Many partitions take the forms that are short by construction without
    measuring every candidate (this runs once per batch on the driver)."""
    column = col.values
    n = len(column)
    kinds = col.kinds
    scalar = kinds <= _SCALAR_TYPES
    first = column[0]
    if len(kinds) == 1 and column.count(first) == n:
        default = _DEFAULTS.get(name, _OMIT)
        if omit and first == default and type(first) is type(default):
            return _OMIT
        return first if scalar else {"all": first}
    candidates: list = []
    if kinds <= _INT_TYPES:
        for other_name, other in written.items():
            plus = _constant_difference(col, other)
            if plus is not None:
                candidates.append({"of": other_name, "plus": plus})
        if candidates and n >= 32:
            return min(candidates, key=lambda c: (len(c["of"]), c["of"]))
    if scalar:
        common, count = _most_common(col)
        if count * 2 > n:
            sparse = {"else": common, "at": {str(p): v for p, v in zip(partitions, column)
                                             if not _same(v, common)}}
            if n >= 32 and (n - count) * 8 <= n:
                return sparse
            candidates.append(sparse)
    if kinds <= _INT_TYPES:
        candidates.append({"d": _deltas(col)})
    candidates.append(column)
    return min(candidates, key=lambda c: len(json.dumps(c, separators=_SEP)))


def _same(a: object, b: object) -> bool:
    """Equal as JSON values: 1, 1.0 and True are equal in Python, not in JSON."""
    return a == b and type(a) is type(b)


def _most_common(col: _Column) -> tuple[object, int]:
    """The most common value of a column of scalars and how often it occurs (the first
    seen of the most common ones)."""
    ints = col.ints
    if ints is not None:
        _, first_at, counts = np.unique(ints, return_index=True, return_counts=True)
        top = counts.max()
        at = first_at[counts == top].min()   # the first seen, as Counter.most_common
        return col.values[at], int(top)
    column = col.values
    # Values told apart by type too (1, 1.0 and True are equal in Python, not in JSON).
    tokens = column if len(col.kinds - {type(None)}) <= 1 else [(type(v), v) for v in column]
    common, count = Counter(tokens).most_common(1)[0]
    return column[tokens.index(common)], count


def _deltas(col: _Column) -> list:
    ints = col.ints
    if ints is not None:
        return np.diff(ints, prepend=0).tolist()
    out, last = [], 0
    for v in col.values:
        if v is None:
            out.append(None)
        else:
            out.append(v - last)
            last = v
    return out


def _constant_difference(col: _Column, other: _Column) -> int | None:
    column, values = col.values, other.values
    if not values or not _is_int(column[0]) or not _is_int(values[0]):
        return None   # a cheap first look: most columns are not
    if len(column) != len(values):
        return None
    a, b = col.ints, other.ints
    if a is not None and b is not None:
        differences = a - b
        plus = int(differences[0])
        return plus if bool((differences == plus).all()) else None
    if type(None) not in col.kinds and type(None) not in other.kinds:
        plus = column[0] - values[0]
        try:
            same = all(type(o) is int and v - o == plus for v, o in zip(column, values))
        except TypeError:
            return None
        return plus if same else None
    plus = None
    for v, o in zip(column, values):
        if v is None or o is None:
            if v is not None or o is not None:
                return None
            continue
        if not _is_int(v) or not _is_int(o):
            return None
        if plus is None:
            plus = v - o
        elif v - o != plus:
            return None
    return plus


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
    planned = _optional_int("offset", "plannedAt", own.get("plannedAt"))
    topics = own.get("topics", {})
    if not isinstance(topics, dict):
        raise OffsetFormatError(f"offset: topics must be an object, got {topics!r}")
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
            numbered.append((int(key), _optional_int(f"{topic}:{key}", "offset", end)))
        numbered.sort()
        columns = topics.get(topic, {})
        if not isinstance(columns, dict):
            raise OffsetFormatError(f"offset: topic {topic!r}: state must be an object")
        for tp, r in _topic_ranges(topic, numbered, columns, planned):
            partitions[tp] = r
    heartbeat = own.get("heartbeat", False)
    if not isinstance(heartbeat, bool):
        raise OffsetFormatError(f"offset: heartbeat must be true or false, got {heartbeat!r}")
    holder = own.get("holder")
    if holder is not None and not isinstance(holder, str):
        raise OffsetFormatError(f"offset: holder must be 'topic:partition', got {holder!r}")
    return BatchOffset(_optional_int("offset", "watermark", own.get("watermark")), partitions,
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
            values[name] = _decode(topic, name, columns[name], partitions, values)
        elif name in ("eventLag", "procLag"):
            continue
        else:
            values[name] = [_DEFAULTS.get(name)] * len(partitions)
    base = {"eventLag": "wm", "procLag": "procWm"}
    for name, mark in base.items():
        if name not in values:
            for partition, value in zip(partitions, values[mark]):
                _optional_int(f"{topic}:{partition}", mark, value)
            values[name] = _lags(values[mark], planned)
    for i, (partition, end) in enumerate(numbered):
        where = f"{topic}:{partition}"
        read = _optional_int(where, "read", values["read"][i])
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
        last_read = _optional_int(where, "lastRead", values["lastRead"][i])
        state = PartitionState(
            generator=generator,
            max_event_ms=_optional_int(where, "maxEvent", values["maxEvent"][i]),
            advanced_ms=_optional_int(where, "advanced", values["advanced"][i]),
            last_read_ms=0 if last_read is None else last_read, idle=idle, held=held)
        lag = PartitionLag(*(_optional_int(where, name, values[name][i]) for name in
                             ("wm", "procWm", "eventLag", "procLag", "unread"))
                           ) if has_lag else None
        yield (topic, partition), PartitionRange(end - read, end, state, lag)


def _decode(topic: str, name: str, encoded: object, partitions: list[int],
            values: dict[str, list]) -> list:
    n = len(partitions)
    where = f"offset: topic {topic!r}: column {name!r}"
    if isinstance(encoded, list):
        if len(encoded) != n:
            raise OffsetFormatError(f"{where} has {len(encoded)} values for {n} partitions")
        return encoded
    if not isinstance(encoded, dict):
        return [encoded] * n
    if set(encoded) == {"all"}:
        return [encoded["all"]] * n
    if set(encoded) == {"d"}:
        deltas = encoded["d"]
        if not isinstance(deltas, list) or len(deltas) != n or not all(
                d is None or _is_int(d) for d in deltas):
            raise OffsetFormatError(f"{where}: 'd' must be {n} integers or nulls")
        out, last = [], 0
        for d in deltas:
            if d is None:
                out.append(None)
            else:
                last += d
                out.append(last)
        return out
    if set(encoded) == {"of", "plus"}:
        other, plus = encoded["of"], encoded["plus"]
        if other not in values or not _is_int(plus):
            raise OffsetFormatError(f"{where}: 'of' must name an earlier column and 'plus' be "
                                    f"an integer")
        if not all(v is None or _is_int(v) for v in values[other]):
            raise OffsetFormatError(f"{where}: column {other!r} is not of integers")
        return [None if v is None else v + plus for v in values[other]]
    if set(encoded) == {"else", "at"} and isinstance(encoded["at"], dict):
        out = [encoded["else"]] * n
        index = {str(p): i for i, p in enumerate(partitions)}
        for key, value in encoded["at"].items():
            if key not in index:
                raise OffsetFormatError(f"{where}: partition {key!r} has no offset")
            out[index[key]] = value
        return out
    raise OffsetFormatError(f"{where}: cannot read {str(encoded)[:100]!r}")


def _optional_int(where: str, name: str, value: object) -> int | None:
    if value is None:
        return None
    if not _is_int(value):
        raise OffsetFormatError(f"offset: {where}: {name} must be an integer, got {value!r}")
    return value


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
        start = _optional_int(key, "from", entry.get("from"))
        end = _optional_int(key, "to", entry.get("to"))
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
    return BatchOffset(_optional_int("offset", "watermark", data.get("watermark")), partitions,
                       heartbeat, _optional_int("offset", "plannedAt", data.get("plannedAt")),
                       parse_tp_key(holder) if holder is not None else None)
