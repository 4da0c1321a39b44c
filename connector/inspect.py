"""Who holds the watermark, and why: a per-batch table of every partition's watermark and lags
(DESIGN §13), from a query's checkpoint or from its progress.

    python -m kwatermark.inspect CHECKPOINT [--plot FILE.png] [--csv FILE.csv]

>>> from kwatermark.inspect import progress_table, checkpoint_table   # doctest: +SKIP
>>> progress_table(query.recentProgress)     # a pandas DataFrame, one row per batch+partition
>>> checkpoint_table("/checkpoints/orders")  # the same, from <checkpoint>/offsets/

Each row: the batch, when it was planned, the combined watermark at its start, the partition
holding it, and one partition's range, unread records, idle decision, event-time watermark,
processing-time watermark, event-time lag and processing lag (lags in ms, at planning time).
Offsets written before kwatermark 0.2 have no lag fields: those columns are empty.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable

from kwatermark.errors import KWatermarkError
from kwatermark.offsets import BatchOffset, OffsetFormatError, tp_key

COLUMNS = ["batch", "source", "planned_at", "watermark", "holder", "partition", "from", "to",
           "unread", "idle", "partition_watermark", "processing_watermark", "event_lag_ms",
           "processing_lag_ms"]
_TIMES = ("planned_at", "watermark", "partition_watermark", "processing_watermark")
_COUNTS = ("from", "to", "unread", "event_lag_ms", "processing_lag_ms")


class NotACheckpointError(KWatermarkError):
    """The directory given is not the checkpoint of a query reading format("kwatermark")."""


def offset_rows(batch: int, offset: BatchOffset, source: int = 0) -> list[dict]:
    """The table's rows for one batch's end offset (one row per partition)."""
    rows = []
    for tp, r in sorted(offset.partitions.items()):
        lag = r.lag
        rows.append({
            "batch": batch, "source": source, "planned_at": offset.planned_ms,
            "watermark": offset.watermark,
            "holder": tp_key(offset.holder) if offset.holder is not None else None,
            "partition": tp_key(tp), "from": r.start, "to": r.end,
            "unread": lag.unread if lag else None, "idle": r.state.idle,
            "partition_watermark": lag.watermark_ms if lag else None,
            "processing_watermark": lag.processing_wm_ms if lag else None,
            "event_lag_ms": lag.event_lag_ms if lag else None,
            "processing_lag_ms": lag.processing_lag_ms if lag else None,
        })
    return rows


def to_frame(rows: list[dict]):
    """Rows as a pandas DataFrame: times as UTC timestamps, counts and lags as Int64."""
    import pandas as pd

    frame = pd.DataFrame(rows, columns=COLUMNS)
    for name in _TIMES:
        frame[name] = pd.to_datetime(frame[name].astype("Float64"), unit="ms", utc=True)
    for name in _COUNTS + ("batch", "source"):
        frame[name] = frame[name].astype("Int64")
    return frame


def _parse(text: object) -> BatchOffset | None:
    """A kwatermark offset, or None for another source's."""
    try:
        return BatchOffset.from_json(json.loads(text) if isinstance(text, str) else text)
    except (OffsetFormatError, json.JSONDecodeError, TypeError):
        return None


def progress_table(progress: dict | Iterable[dict]):
    """The table from ``query.lastProgress`` or ``query.recentProgress`` (a DataFrame).

    Every kwatermark source of each progress report contributes its ``endOffset`` (the
    offset of that batch); other sources are skipped.
    """
    reports = [progress] if isinstance(progress, dict) else list(progress or [])
    rows = []
    for report in reports:
        if not report:
            continue
        for index, source in enumerate(report.get("sources", [])):
            offset = _parse(source.get("endOffset"))
            if offset is not None:
                rows.extend(offset_rows(int(report["batchId"]), offset, index))
    return to_frame(rows)


def read_offset_log(checkpoint: str) -> list[tuple[int, list[BatchOffset | None]]]:
    """``(batch id, [offset of each source, None where not kwatermark's])`` in batch order,
    from Spark's ``<checkpoint>/offsets/<batch>`` files (a version line, a metadata line, one
    line per source)."""
    if not os.path.isdir(checkpoint):
        raise NotACheckpointError(f"checkpoint {checkpoint!r}: no such directory")
    log_dir = os.path.join(checkpoint, "offsets")
    if not os.path.isdir(log_dir):
        raise NotACheckpointError(
            f"checkpoint {checkpoint!r} is not a Spark streaming checkpoint: it has no "
            f"offsets/ directory (give the query's checkpointLocation)")
    batches = []
    for name in os.listdir(log_dir):
        if not name.isdigit():
            continue  # Spark's .crc and temp files
        with open(os.path.join(log_dir, name), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
        if not lines or not lines[0].startswith("v"):
            raise NotACheckpointError(f"checkpoint {checkpoint!r}: offsets/{name} is not a "
                                      f"Spark offset log entry")
        batches.append((int(name), [None if line.strip() == "-" else _parse(line)
                                    for line in lines[2:]]))
    if not batches:
        raise NotACheckpointError(f"checkpoint {checkpoint!r}: offsets/ is empty (the query "
                                  f"has not planned a batch yet)")
    batches.sort(key=lambda item: item[0])
    if not any(offset is not None for _, offsets in batches for offset in offsets):
        raise NotACheckpointError(
            f"checkpoint {checkpoint!r}: no source in its offset log is format(\"kwatermark\")"
            f" (offsets/{batches[-1][0]} holds: {_first_source(log_dir, batches[-1][0])})")
    return batches


def _first_source(log_dir: str, batch: int) -> str:
    with open(os.path.join(log_dir, str(batch)), encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    return (lines[2][:120] if len(lines) > 2 else "no source line")


def checkpoint_table(checkpoint: str):
    """The table from a checkpoint's offset log (a DataFrame); NotACheckpointError when the
    directory is not a kwatermark query's checkpoint."""
    rows = []
    for batch, offsets in read_offset_log(checkpoint):
        for index, offset in enumerate(offsets):
            if offset is not None:
                rows.extend(offset_rows(batch, offset, index))
    return to_frame(rows)


def format_table(frame) -> str:
    """The table as text: times in UTC to the millisecond, lags in seconds."""
    import pandas as pd

    shown = frame.copy()
    if shown["source"].nunique() <= 1:
        shown = shown.drop(columns=["source"])
    for name in _TIMES:
        shown[name] = shown[name].map(
            lambda t: "-" if pd.isna(t) else t.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3])
    for name in ("event_lag_ms", "processing_lag_ms"):
        shown[name.replace("_ms", "")] = shown.pop(name).map(
            lambda v: "-" if pd.isna(v) else f"{v / 1000:.3f} s")
    shown = shown.rename(columns={"partition_watermark": "partition_wm",
                                  "processing_watermark": "processing_wm"})
    shown = shown.astype(object)
    return shown.where(shown.notna(), "-").to_string(index=False)


def plot(frame, path: str, title: str | None = None) -> None:
    """Event-time lag and processing lag per partition over batches, with a strip naming
    the partition that holds the combined watermark in each batch (PNG at ``path``)."""
    if frame.empty:
        raise ValueError("kwatermark.inspect.plot: the table is empty (no kwatermark batch "
                         "in the progress or checkpoint given)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    data = frame[frame["source"] == frame["source"].min()]
    partitions = sorted(data["partition"].unique(), key=_partition_order)
    colours = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(partitions)}
    fig, (event_ax, proc_ax, strip_ax) = plt.subplots(
        3, 1, sharex=True, figsize=(10, 7.2),
        gridspec_kw={"height_ratios": [4, 4, 0.8], "hspace": 0.12})
    holders = data.drop_duplicates("batch").set_index("batch")["holder"]
    for order, partition in enumerate(partitions):
        rows = data[data["partition"] == partition].sort_values("batch")
        colour = colours[partition]
        # Partitions often share a value: earlier ones are drawn wider, so none is hidden.
        width = max(1.2, 4.0 - 1.1 * order)
        for ax, column in ((event_ax, "event_lag_ms"), (proc_ax, "processing_lag_ms")):
            values = rows[column].astype("Float64") / 1000
            ax.plot(rows["batch"], values.astype(float), marker="o", markersize=3,
                    linewidth=width, color=colour, label=partition, zorder=2 + order,
                    alpha=0.9)
        excluded = rows[rows["idle"] == "exclude"]
        for ax, column in ((event_ax, "event_lag_ms"), (proc_ax, "processing_lag_ms")):
            ax.scatter(excluded["batch"], (excluded[column].astype("Float64") / 1000)
                       .astype(float), marker="x", s=45, color=colour, zorder=6)
        held = rows[rows["holder"] == partition]
        event_ax.scatter(held["batch"], (held["event_lag_ms"].astype("Float64") / 1000)
                         .astype(float), s=110, facecolors="none", edgecolors=colour,
                         linewidths=2, zorder=3)
    batches = sorted(holders.index)
    for batch in batches:
        owner = holders[batch]
        strip_ax.axvspan(batch - 0.5, batch + 0.5,
                         color=colours.get(owner, "lightgrey") if owner else "lightgrey")
    event_ax.set_ylabel("event-time lag (s)\nnow - partition watermark")
    proc_ax.set_ylabel("processing lag (s)\nnow - processing-time wm")
    event_ax.set_title(title or "kwatermark: lag per partition", loc="left")
    fig.text(0.01, -0.01,
             "Circled, and in the strip: the partition holding the combined watermark. "
             "x: excluded by the idle policy.\n"
             "Event-time lag high, processing lag low: data lag (its records are old or it "
             "is silent; the query is keeping up).\n"
             "Processing lag high: the query is behind on that partition (unread records: a "
             "backlog, a read limit or a stuck pipeline).",
             ha="left", va="top", fontsize=9)
    for ax in (event_ax, proc_ax):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    event_ax.legend(title="partition", loc="upper left", bbox_to_anchor=(1.0, 1.0),
                    fontsize=8.5, frameon=False)
    strip_ax.set_yticks([])
    strip_ax.set_ylabel("holds\nwatermark", rotation=0, ha="right", va="center")
    strip_ax.set_xlabel("batch id")
    strip_ax.legend(handles=[Patch(color=colours[p], label=p) for p in partitions
                             if p in set(holders.dropna())],
                    loc="upper left", bbox_to_anchor=(1.0, 1.3), fontsize=8, frameon=False)
    if batches:
        strip_ax.set_xlim(batches[0] - 0.5, batches[-1] + 0.5)
    strip_ax.xaxis.get_major_locator().set_params(integer=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _partition_order(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition(":")
    return topic, int(partition) if partition.isdigit() else -1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kwatermark.inspect",
        description="Per batch: the combined watermark, the partition holding it, and every "
                    "partition's watermark and lags, from a kwatermark query's checkpoint.")
    parser.add_argument("checkpoint", help="the query's checkpointLocation")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw event-time lag and processing lag per partition")
    parser.add_argument("--csv", metavar="FILE.csv", help="also write the table as CSV")
    parser.add_argument("--last", type=int, metavar="N", help="only the last N batches")
    args = parser.parse_args(argv)
    try:
        frame = checkpoint_table(args.checkpoint)
    except NotACheckpointError as exc:
        print(f"kwatermark.inspect: {exc}", file=sys.stderr)
        return 2
    if args.last:
        keep = sorted(frame["batch"].unique())[-args.last:]
        frame = frame[frame["batch"].isin(keep)]
    print(format_table(frame))
    if args.csv:
        frame.to_csv(args.csv, index=False)
    if args.plot:
        try:
            plot(frame, args.plot, title=f"kwatermark lag per partition: {args.checkpoint}")
        except ImportError:
            print("kwatermark.inspect: --plot needs matplotlib (pip install matplotlib)",
                  file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
