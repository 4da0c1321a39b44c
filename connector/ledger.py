"""The progress ledger: tasks publish the state after their range; the driver folds it in.

Records are keyed by everything the state depends on (topic, partition, range, start state,
watermark configuration), so a retried or speculative task writes the same bytes, and a record
can never be applied to the wrong range. Storage goes through ``pyarrow.fs``: a local
directory, ``s3://``, ``hdfs://``, ``gs://``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import uuid
from dataclasses import dataclass, fields
from operator import attrgetter

import pyarrow.fs as pafs

from kwatermark.errors import OptionError
from kwatermark.offsets import PartitionState, RangeTask, TaskColumns

log = logging.getLogger("kwatermark.ledger")


@dataclass(frozen=True)
class ProgressRecord:
    """What a task learned reading its range."""

    generator: object             # generator snapshot after the range
    count: int                    # records read
    min_event_ms: int | None
    max_event_ms: int | None
    max_row_watermark: int | None  # highest watermark emitted on a row of the range

    def to_json(self) -> dict:
        # Not dataclasses.asdict: it deep-copies the generator snapshot, ~25 µs a record
        # (a 512-range pack's file: ~13 ms of the task), for a dict that is only written.
        return {name: getattr(self, name) for name in _RECORD_FIELDS}

    @classmethod
    def from_json(cls, data: dict) -> ProgressRecord:
        return cls(*map(data.__getitem__, _RECORD_FIELDS))


_RECORD_FIELDS = tuple(f.name for f in fields(ProgressRecord))


def new_record(generator: object, count: int, min_event_ms: int | None,
               max_event_ms: int | None, max_row_watermark: int | None) -> ProgressRecord:
    """``ProgressRecord(...)`` without the frozen dataclass's ``__init__`` (five
    ``object.__setattr__``): a task of 4,096 ranges makes one a range."""
    record = object.__new__(ProgressRecord)
    record.__dict__.update(generator=generator, count=count, min_event_ms=min_event_ms,
                           max_event_ms=max_event_ms, max_row_watermark=max_row_watermark)
    return record


def records_of_columns(columns: dict) -> list[ProgressRecord]:
    """A pack file's records from its columns, without the frozen dataclass's ``__init__``
    (five ``object.__setattr__`` each): the driver reads thousands per planning."""
    records = []
    for values in zip(*(columns[name] for name in _RECORD_FIELDS)):
        record = object.__new__(ProgressRecord)
        record.__dict__.update(zip(_RECORD_FIELDS, values))
        records.append(record)
    return records


def record_columns(records: list[ProgressRecord]) -> dict[str, list]:
    """``records`` as a pack file holds them: a list per field, one value a record."""
    return {name: [getattr(record, name) for record in records] for name in _RECORD_FIELDS}


def record_content(task: RangeTask, fingerprint: dict) -> str:
    """What a record's key is the hash of: every input of the range's rows and state, as
    sorted, compact JSON (the partition state in its layout-1 form, so records written by
    kwatermark 0.1 are found after an upgrade)."""
    content = {
        "topic": task.topic, "partition": task.partition, "from": task.start,
        "to": task.end, "state": task.state.to_json(), "counted": task.counted,
        "previous": task.previous_ms, "others": task.others_ms, "config": fingerprint,
    }
    if task.floor_ms is not None:
        content["floor"] = task.floor_ms
    return json.dumps(content, sort_keys=True, separators=(",", ":"))


_COMPACT = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
_config_json: tuple[dict, str] | None = None


def record_key(task: RangeTask, fingerprint: dict) -> str:
    """The hash of :func:`record_content`, built field by field in its key order (the driver
    computes one per range of the last batch when it plans: thousands at thousands of
    partitions); tests/unit/test_ledger.py pins it to :func:`record_content`."""
    global _config_json
    if _config_json is None or _config_json[0] is not fingerprint:
        _config_json = (fingerprint, _COMPACT(fingerprint))
    floor = "" if task.floor_ms is None else f'"floor":{task.floor_ms},'
    content = (f'{{"config":{_config_json[1]},"counted":{_COMPACT(task.counted)},{floor}'
               f'"from":{task.start},"others":{task.others_ms},'
               f'"partition":{task.partition},"previous":{_COMPACT(task.previous_ms)},'
               f'"state":{_COMPACT(task.state.to_json())},"to":{task.end},'
               f'"topic":{_COMPACT(task.topic)}}}')
    return hashlib.sha256(content.encode()).hexdigest()[:32]


def pack_key(tasks: tuple[RangeTask, ...], fingerprint: dict) -> str:
    """A pack's key: the hash of every input of its ranges, in order (the same ranges packed
    otherwise, or in another order, are another pack), as one compact JSON document of
    field tuples: a third of the cost of a key per range (~2 µs a range, where the driver
    computes one per range of the last batch when it plans)."""
    content = _COMPACT(["pack", fingerprint, [(_TASK_FIELDS(task), _STATE_FIELDS(task.state))
                                              for task in tasks]])
    return hashlib.sha256(content.encode()).hexdigest()[:32]


def pack_keys(offset_json: dict, fingerprint: dict, packing: tuple, count: int) -> list[str]:
    """The keys of the ``count`` packs of the batch whose offset is ``offset_json`` (as
    written to Spark's offset log), in the order they were planned: one hash of the offset,
    the watermark configuration and the packing options, then one per pack index (~7 ms at
    4,096 ranges against ~40 for :func:`pack_key` of every range, on the driver at each
    planning and in each task). The offset holds every range and its start state, and the
    ranges and packs are a pure function of it and the options; the file also names its
    ranges, checked when read, so a pack planned otherwise (another kwatermark version) is
    never applied to the wrong ranges."""
    batch = hashlib.sha256(_COMPACT(["packs", fingerprint, list(packing), offset_json])
                           .encode()).hexdigest()
    return [hashlib.sha256(f"{batch}:{index}".encode()).hexdigest()[:32]
            for index in range(count)]


# Every field a range's rows and state depend on, in declaration order.
_TASK_FIELDS = attrgetter(*(f.name for f in fields(RangeTask) if f.name != "state"))
_STATE_FIELDS = attrgetter(*(f.name for f in fields(PartitionState)))


def _ranges_of(tasks: TaskColumns) -> list[list]:
    """A pack's ranges as its file named them before :func:`_range_columns`: a list a range."""
    return [list(r) for r in zip(tasks.topic, tasks.partition, tasks.start, tasks.end)]


def _range_columns(topics: list[str], partitions: list[int], starts: list[int],
                   ends: list[int]) -> dict[str, object]:
    """A pack's ranges as its file names them: a column per field, the topic once when the
    pack reads one topic. A list a range made the driver's fold at 4,096 ranges parse and
    build 4,096 lists, then as many again to compare them (bench/README.md, "Fewer objects,
    and none walked again")."""
    return {"topic": topics[0] if topics.count(topics[0]) == len(topics) else topics,
            "partition": partitions, "from": starts, "to": ends}


def _names_ranges(named: object, tasks: TaskColumns) -> bool:
    """Whether a pack file's ``at`` (either layout) names exactly ``tasks``, in order."""
    if isinstance(named, list):
        return named == _ranges_of(tasks)
    return named == _range_columns(tasks.topic, tasks.partition, tasks.start, tasks.end)


class ProgressLedger:
    """``watermark.stateLocation``: a directory of small JSON progress records.

    A task that reads one range writes that range's record; a task that reads a pack of
    several ranges (DESIGN §12) writes one file holding all of their records, in the
    directory of its first range, so a 512-range pack costs one write, one read and one
    delete instead of 512 of each.

    >>> ledger = ProgressLedger("/tmp/kwatermark-ledger")  # or "s3://bucket/ledger"
    """

    def __init__(self, location: str, *, default: bool = False):
        self.location = location
        self.default = default      # the user left watermark.stateLocation unset
        self._fs: pafs.FileSystem | None = None
        self._root = ""
        self._mark: str | None = None

    def __getstate__(self) -> dict:
        return {"location": self.location, "default": self.default, "_fs": None, "_root": "",
                "_mark": None}

    def _filesystem(self) -> tuple[pafs.FileSystem, str]:
        if self._fs is None:
            try:
                if "://" in self.location:
                    self._fs, self._root = pafs.FileSystem.from_uri(self.location)
                else:
                    self._fs, self._root = pafs.LocalFileSystem(), os.path.abspath(
                        self.location)
            except Exception as exc:
                raise OptionError(f"option watermark.stateLocation: cannot open "
                                  f"{self.location!r}: {exc}") from exc
        return self._fs, self._root

    def _dir(self, task: RangeTask) -> str:
        _, root = self._filesystem()
        safe_topic = task.topic.replace("/", "_")
        return f"{root}/{safe_topic}/{task.partition}"

    def _path(self, task: RangeTask, fingerprint: dict) -> str:
        return (f"{self._dir(task)}/{task.start:020d}-{task.end:020d}-"
                f"{record_key(task, fingerprint)}.json")

    def _pack_path(self, first: RangeTask, key: str) -> str:
        # Named like its first range's record (``forget_before`` reads the end offset from
        # the name): it is deleted once that partition has moved past the first range, when
        # every range of the pack, all from the same batch, is behind its partition's start.
        return f"{self._dir(first)}/{first.start:020d}-{first.end:020d}-{key}.pack.json"

    def publish(self, task: RangeTask, fingerprint: dict, record: ProgressRecord) -> None:
        self._write(task, self._path(task, fingerprint), record.to_json())

    def publish_pack(self, tasks: TaskColumns, fingerprint: dict, records: dict[str, list],
                     key: str | None = None) -> None:
        """The records of a pack's ranges (``records``: a list per ``ProgressRecord`` field,
        one value a range, in the pack's order) as one file under ``key`` (:func:`pack_keys`;
        :func:`pack_key` when None); a pack of one range writes that range's record. The file
        names its ranges and holds the records as columns."""
        if len(tasks) == 1:
            self.publish(tasks.task(0), fingerprint, records_of_columns(records)[0])
            return
        first = tasks.task(0)
        at = _range_columns(tasks.topic, tasks.partition, tasks.start, tasks.end)
        self._write(first, self._pack_path(first, key or pack_key(tasks.tasks, fingerprint)),
                    {"at": at, "records": records})

    def _write(self, first: RangeTask, path: str, content: dict) -> None:
        fs, _ = self._filesystem()
        fs.create_dir(self._dir(first), recursive=True)
        # Write then rename, so a reader never sees half a record from a task cut short.
        temporary = f"{path}.{uuid.uuid4().hex}.tmp"
        with fs.open_output_stream(temporary) as out:
            out.write(json.dumps(content, sort_keys=True, separators=(",", ":")).encode())
        fs.move(temporary, path)

    # -- is the default location shared? -------------------------------------------------
    # The default is a path in the driver's temp directory. An executor on another host (or
    # with a private /tmp) would write its records where the driver never looks, and the driver
    # would silently re-read every range. So the driver leaves a mark there, each task carries
    # its name, and an executor that cannot see it refuses before reading anything.

    def driver_mark(self) -> str | None:
        """On the driver: the mark's path (one small file per driver host, written once per
        query start), or None when the user chose the location (then a missing record is
        recomputed with a warning, as documented)."""
        if not self.default:
            return None
        if self._mark is None:
            fs, root = self._filesystem()
            mark = f"{root}/driver-{socket.gethostname()}.mark"
            fs.create_dir(root, recursive=True)
            with fs.open_output_stream(mark) as out:
                out.write(b"a kwatermark driver on this host keeps progress records here\n")
            self._mark = mark
        return self._mark

    def require_shared(self, mark: str | None) -> None:
        """On an executor: refuse to read when the driver's default location is not here."""
        if mark is None:
            return
        fs, _ = self._filesystem()
        try:
            visible = fs.get_file_info(mark).type != pafs.FileType.NotFound
        except OSError:
            visible = False
        if not visible:
            raise OptionError(
                f"option watermark.stateLocation is unset, so progress records go to the "
                f"driver's temp directory {self.location!r}, which this executor (host "
                f"{socket.gethostname()}) does not share with the driver (it cannot see the "
                f"driver's mark {mark}): set it to a location the driver and every executor "
                f'can write, e.g. .option("watermark.stateLocation", '
                f'"s3://bucket/ledgers/my-query") (or hdfs://..., or a shared file system path)')

    def offer(self, task: RangeTask, fingerprint: dict, record: ProgressRecord) -> bool:
        """``publish`` from an executor: a record that cannot be written (a location this host
        cannot reach) is recomputed by the driver, so it never fails the task."""
        try:
            self.publish(task, fingerprint, record)
            return True
        except (OSError, OptionError) as exc:
            log.warning("cannot write the progress record of topic %s partition %s offsets "
                        "[%d, %d) to watermark.stateLocation=%s (%s); the driver will "
                        "recompute it", task.topic, task.partition, task.start, task.end,
                        self.location, exc)
            return False

    def offer_pack(self, tasks: TaskColumns, fingerprint: dict, records: dict[str, list],
                   key: str | None = None) -> bool:
        """``offer`` for the ranges of one Spark task (``publish_pack``'s arguments)."""
        if len(tasks) == 1:
            return self.offer(tasks.task(0), fingerprint, records_of_columns(records)[0])
        try:
            self.publish_pack(tasks, fingerprint, records, key)
            return True
        except (OSError, OptionError) as exc:
            log.warning("cannot write the progress records of %d ranges (topic %s partition "
                        "%s offsets [%d, %d) and %d more) to watermark.stateLocation=%s "
                        "(%s); the driver will recompute them", len(tasks), tasks.topic[0],
                        tasks.partition[0], tasks.start[0], tasks.end[0], len(tasks) - 1,
                        self.location, exc)
            return False

    def lookup(self, task: RangeTask, fingerprint: dict) -> ProgressRecord | None:
        data = self._read(self._path(task, fingerprint))
        try:
            return None if data is None else ProgressRecord.from_json(data)
        except (KeyError, TypeError) as exc:
            return self._unreadable(self._path(task, fingerprint), exc)

    def lookup_pack(self, tasks: tuple[RangeTask, ...], fingerprint: dict,
                    key: str | None = None) -> list[ProgressRecord] | None:
        """The records ``publish_pack`` wrote for these ranges under ``key``, in their order,
        or None. A pack written under its ranges' own key (:func:`pack_key`: kwatermark
        before pack_keys, whose tasks may have run just before an upgrade) is looked for
        when there is none under ``key``."""
        columns = self.lookup_pack_columns(TaskColumns.of(tasks), fingerprint, key)
        return None if columns is None else records_of_columns(columns)

    def lookup_pack_columns(self, tasks: TaskColumns, fingerprint: dict,
                            key: str | None = None) -> dict[str, list] | None:
        """``lookup_pack`` as the file holds it: a list per ``ProgressRecord`` field, one
        value a range (the driver's fold reads them so, without a record object a range)."""
        first = tasks.task(0)
        if len(tasks) == 1:
            record = self.lookup(first, fingerprint)
            return None if record is None else record_columns([record])
        path = self._pack_path(first, key or pack_key(tasks.tasks, fingerprint))
        data = self._read(path)
        if data is None and key is not None:
            path = self._pack_path(first, pack_key(tasks.tasks, fingerprint))
            data = self._read(path)
        if data is None:
            return None
        try:
            if "ranges" in data:   # before pack_keys: a list of records, keyed by its ranges
                columns = record_columns([ProgressRecord.from_json(r) for r in data["ranges"]])
            elif not _names_ranges(data["at"], tasks):
                return self._unreadable(path, "written for other ranges")
            else:
                columns = {name: data["records"][name] for name in _RECORD_FIELDS}
        except (KeyError, TypeError) as exc:
            return self._unreadable(path, exc)
        counts = {len(column) if isinstance(column, list) else -1
                  for column in columns.values()}
        if counts != {len(tasks)}:
            return self._unreadable(path, f"{max(counts)} records for {len(tasks)} ranges")
        return columns

    def _read(self, path: str) -> dict | None:
        fs, _ = self._filesystem()
        try:
            with fs.open_input_stream(path) as source:
                data = json.loads(source.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            return self._unreadable(path, exc)
        return data if isinstance(data, dict) else self._unreadable(path, "not an object")

    @staticmethod
    def _unreadable(path: str, reason: object) -> None:
        log.warning("progress record %s is unreadable (%s); it will be recomputed",
                    path, reason)

    def forget_before(self, topic: str, partition: int, offset: int) -> bool:
        """Delete records of ranges ending at or before ``offset`` (no longer needed);
        True when the partition's directory still holds files (or could not be listed)."""
        fs, root = self._filesystem()
        directory = f"{root}/{topic.replace('/', '_')}/{partition}"
        try:
            infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
        except OSError:
            return True
        left = False
        for info in infos:
            name = info.base_name
            try:
                end = int(name.split("-")[1])
            except (IndexError, ValueError):
                left = True
                continue
            if end <= offset:
                try:
                    fs.delete_file(info.path)
                except OSError:
                    left = True
            else:
                left = True
        return left
