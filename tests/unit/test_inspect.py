"""kwatermark.inspect on offset logs laid out as Spark writes them, and its errors. The run on a
real query's checkpoint is in tests/integration/test_observability.py."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kwatermark.inspect import (
    NotACheckpointError,
    checkpoint_table,
    format_table,
    main,
    plot,
    progress_table,
)
from tests.unit.test_timelag_and_lags import OLD_OFFSET, T0, TOPIC

NEW_OFFSET = {
    "v": 1, "watermark": T0 - 60_001, "plannedAt": T0 + 9_000, "holder": f"{TOPIC}:1",
    "partitions": {
        f"{TOPIC}:0": {"from": 20, "to": 20, "state": {"gen": {"max_ts": T0}, "idle": "count"},
                       "lag": {"wm": T0 - 1, "procWm": T0 + 9_000, "eventLag": 9_001,
                               "procLag": 0, "unread": 0}},
        f"{TOPIC}:1": {"from": 1, "to": 3, "state": {"gen": {"max_ts": T0 - 60_000}},
                       "lag": {"wm": T0 - 60_001, "procWm": T0 + 4_000, "eventLag": 69_001,
                               "procLag": 5_000, "unread": 2}}}}

METADATA = {"batchWatermarkMs": 0, "batchTimestampMs": T0, "conf": {}}


def write_log(checkpoint, batches: dict[int, list]) -> str:
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True)
    for batch, sources in batches.items():
        lines = ["v1", json.dumps(METADATA)] + [json.dumps(s) for s in sources]
        (offsets / str(batch)).write_text("\n".join(lines))
        (offsets / f".{batch}.crc").write_bytes(b"\x00")
    return str(checkpoint)


def test_table_from_a_checkpoint_old_and_new_offsets(tmp_path):
    checkpoint = write_log(tmp_path / "cp", {0: [OLD_OFFSET], 1: [NEW_OFFSET]})
    table = checkpoint_table(checkpoint)
    assert list(table["batch"]) == [0, 0, 1, 1]
    assert list(table["partition"]) == [f"{TOPIC}:0", f"{TOPIC}:1"] * 2
    old, new = table[table["batch"] == 0], table[table["batch"] == 1]
    assert old["event_lag_ms"].isna().all() and old["holder"].isna().all()
    assert list(new["event_lag_ms"]) == [9_001, 69_001]
    assert list(new["processing_lag_ms"]) == [0, 5_000]
    assert list(new["holder"]) == [f"{TOPIC}:1"] * 2
    assert new["planned_at"].iloc[0] == pd.Timestamp(T0 + 9_000, unit="ms", tz="UTC")
    assert new["partition_watermark"].iloc[1] == pd.Timestamp(T0 - 60_001, unit="ms", tz="UTC")
    text = format_table(table)
    assert "69.001 s" in text and "5.000 s" in text and f"{TOPIC}:1" in text


def test_table_from_query_progress_matches_the_checkpoints(tmp_path):
    checkpoint = write_log(tmp_path / "cp", {7: [{"other": "source"}, NEW_OFFSET]})
    progress = [{"batchId": 7, "sources": [
        {"description": "another", "endOffset": json.dumps({"other": "source"})},
        {"description": "kwatermark", "endOffset": json.dumps(NEW_OFFSET)}]}]
    from_progress = progress_table(progress)
    assert from_progress.equals(checkpoint_table(checkpoint))
    assert list(from_progress["source"]) == [1, 1]
    assert progress_table(progress[0]).equals(from_progress)    # lastProgress: one dict
    assert progress_table(None).empty


@pytest.mark.parametrize("make, message", [
    (lambda p: str(p / "missing"), "no such directory"),
    (lambda p: str(p), "no offsets/ directory"),
    (lambda p: (p / "offsets").mkdir() or str(p), "offsets/ is empty"),
    (lambda p: write_log(p / "kafka", {0: [{"events": {"0": 12}}]}),
     "no source in its offset log is format"),
    (lambda p: write_log(p, {}) and (p / "offsets" / "0").write_text("garbage") and str(p),
     "not a Spark offset log entry"),
])
def test_a_directory_that_is_not_a_kwatermark_checkpoint_is_named(tmp_path, make, message):
    checkpoint = make(tmp_path)
    with pytest.raises(NotACheckpointError, match=message):
        checkpoint_table(checkpoint)


def test_cli_prints_the_table_and_fails_clearly(tmp_path, capsys):
    checkpoint = write_log(tmp_path / "cp", {0: [OLD_OFFSET], 1: [NEW_OFFSET]})
    assert main([checkpoint, "--last", "1", "--csv", str(tmp_path / "t.csv")]) == 0
    out = capsys.readouterr().out
    assert "69.001 s" in out and "\n     0 " not in out
    assert len(pd.read_csv(tmp_path / "t.csv")) == 2
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "kwatermark.inspect: checkpoint" in err and "no offsets/ directory" in err


def test_plot_writes_a_png(tmp_path):
    checkpoint = write_log(tmp_path / "cp", {0: [OLD_OFFSET], 1: [NEW_OFFSET],
                                             2: [NEW_OFFSET]})
    path = tmp_path / "lag.png"
    plot(checkpoint_table(checkpoint), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="the table is empty"):
        plot(progress_table([]), str(path))
