"""Layout 1 of kwatermark's offset, as kwatermark 0.1 wrote it to Spark's offset log and
progress before issue 36 (connector/offsets.py at 0b9b1f5: ``BatchOffset.to_json``,
``PartitionState.to_json`` and ``PartitionLag.to_json``, verbatim but for being functions).
Kept here to turn a checkpoint into one of that layout, so tests can check that today's
source goes on from it."""

from __future__ import annotations

import json
from pathlib import Path

from kwatermark.offsets import BatchOffset, PartitionLag, PartitionState


def tp_key(tp: tuple[str, int]) -> str:
    return f"{tp[0]}:{tp[1]}"


def state_json(state: PartitionState) -> dict:
    data = {"gen": state.generator, "maxEvent": state.max_event_ms,
            "advanced": state.advanced_ms, "lastRead": state.last_read_ms,
            "idle": state.idle}
    if state.held:
        data["held"] = True   # written only when true: older offsets have no such key
    return data


def lag_json(lag: PartitionLag) -> dict:
    return {"wm": lag.watermark_ms, "procWm": lag.processing_wm_ms,
            "eventLag": lag.event_lag_ms, "procLag": lag.processing_lag_ms,
            "unread": lag.unread}


def offset_json(offset: BatchOffset) -> dict:
    partitions = {}
    for tp, r in sorted(offset.partitions.items()):
        entry = {"from": r.start, "to": r.end, "state": state_json(r.state)}
        if r.lag is not None:
            entry["lag"] = lag_json(r.lag)
        partitions[tp_key(tp)] = entry
    data = {"v": 1, "watermark": offset.watermark, "partitions": partitions}
    if offset.heartbeat:
        data["heartbeat"] = True
    if offset.planned_ms is not None:
        data["plannedAt"] = offset.planned_ms
    if offset.holder is not None:
        data["holder"] = tp_key(offset.holder)
    return data


def rewrite_checkpoint(checkpoint: str | Path) -> int:
    """Rewrite every kwatermark offset in ``<checkpoint>/offsets/`` in layout 1, as pyspark
    sends an offset (``json.dumps`` of the dict); returns how many entries were rewritten.
    Spark's entry is a version line, a metadata line, then one line per source."""
    rewritten = 0
    directory = Path(checkpoint) / "offsets"
    for entry in sorted(directory.iterdir()):
        if not entry.name.isdigit():
            continue
        lines = entry.read_text(encoding="utf-8").split("\n")
        for i in range(2, len(lines)):
            if lines[i].strip() in ("", "-"):
                continue
            lines[i] = json.dumps(offset_json(BatchOffset.from_json(lines[i])))
            rewritten += 1
        entry.write_text("\n".join(lines), encoding="utf-8")
        crc = entry.with_name(f".{entry.name}.crc")
        if crc.exists():
            crc.unlink()   # Hadoop's checksum of the old bytes; Spark reads on without it
    return rewritten
