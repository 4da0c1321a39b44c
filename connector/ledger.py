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
import uuid
from dataclasses import asdict, dataclass

import pyarrow.fs as pafs

from kwatermark.errors import OptionError
from kwatermark.offsets import RangeTask

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
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ProgressRecord:
        return cls(**{k: data[k] for k in ("generator", "count", "min_event_ms",
                                            "max_event_ms", "max_row_watermark")})


def record_key(task: RangeTask, fingerprint: dict) -> str:
    content = {
        "topic": task.topic, "partition": task.partition, "from": task.start,
        "to": task.end, "state": task.state.to_json(), "counted": task.counted,
        "previous": task.previous_ms, "others": task.others_ms, "config": fingerprint,
    }
    if task.floor_ms is not None:
        content["floor"] = task.floor_ms
    content = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(content.encode()).hexdigest()[:32]


class ProgressLedger:
    """``watermark.stateLocation``: a directory of small JSON progress records.

    >>> ledger = ProgressLedger("/tmp/kwatermark-ledger")  # or "s3://bucket/ledger"
    """

    def __init__(self, location: str):
        self.location = location
        self._fs: pafs.FileSystem | None = None
        self._root = ""

    def __getstate__(self) -> dict:
        return {"location": self.location, "_fs": None, "_root": ""}

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

    def publish(self, task: RangeTask, fingerprint: dict, record: ProgressRecord) -> None:
        fs, _ = self._filesystem()
        path = self._path(task, fingerprint)
        fs.create_dir(self._dir(task), recursive=True)
        # Write then rename, so a reader never sees half a record from a task cut short.
        temporary = f"{path}.{uuid.uuid4().hex}.tmp"
        with fs.open_output_stream(temporary) as out:
            out.write(json.dumps(record.to_json(), sort_keys=True).encode())
        fs.move(temporary, path)

    def lookup(self, task: RangeTask, fingerprint: dict) -> ProgressRecord | None:
        fs, _ = self._filesystem()
        path = self._path(task, fingerprint)
        try:
            with fs.open_input_stream(path) as source:
                return ProgressRecord.from_json(json.loads(source.read()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("progress record %s is unreadable (%s); it will be recomputed",
                        path, exc)
            return None

    def forget_before(self, topic: str, partition: int, offset: int) -> None:
        """Delete records of ranges ending at or before ``offset`` (no longer needed)."""
        fs, root = self._filesystem()
        directory = f"{root}/{topic.replace('/', '_')}/{partition}"
        try:
            infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
        except OSError:
            return
        for info in infos:
            name = info.base_name
            try:
                end = int(name.split("-")[1])
            except (IndexError, ValueError):
                continue
            if end <= offset:
                try:
                    fs.delete_file(info.path)
                except OSError:
                    pass
