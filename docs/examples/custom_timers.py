import pandas as pd
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

SIZE = 10_000                                    # 10-second tumbling windows, in ms
OUTPUT = "key string, window_start timestamp, n long, kind string"


class WindowCounts(StatefulProcessor):
    """Per key, a count per window, emitted when kwatermark's watermark completes it."""

    def init(self, handle):
        self.handle = handle
        self.counts = handle.getMapState("counts", "start long", "n long")

    def handleInputRows(self, key, rows, timerValues):
        late = {}
        for frame in rows:
            # Heartbeat rows carry only a watermark: they move Spark's clock, nothing else.
            # Filter them here, not before groupBy: Spark pushes a filter below withWatermark.
            frame = frame[(frame["is_heartbeat"] != True) & frame["t"].notna()]
            for t, w in zip(frame["t"].astype("int64"), frame["w"]):
                start = t - t % SIZE
                if pd.notna(w) and start + SIZE - 1 <= w:   # completed before it came
                    late[start] = late.get(start, 0) + 1
                    continue
                seen = self.counts.getValue((start,))
                self.counts.updateValue((start,), ((seen[0] if seen else 0) + 1,))
                if seen is None:
                    # Spark fires a timer once its watermark reaches it: at end - 1, the
                    # timer fires when the combined watermark completes the window.
                    self.handle.registerTimer(start + SIZE - 1)
        if late:
            yield self._rows(key, list(late), list(late.values()), "late")

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        start = expiredTimerInfo.getExpiryTimeInMs() + 1 - SIZE
        (n,) = self.counts.getValue((start,))
        self.counts.removeKey((start,))
        yield self._rows(key, [start], [n], "final")

    def _rows(self, key, starts, counts, kind):
        return pd.DataFrame({"key": key[0], "n": counts, "kind": kind,
                             "window_start": pd.to_datetime(starts, unit="ms", utc=True)})

    def close(self):
        pass


# transformWithState runs only on the RocksDB state store (kwatermark.windows sets it itself).
spark.conf.set("spark.sql.streaming.stateStore.providerClass",
               "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
clocked = events.select(
    "key", "is_heartbeat",
    F.unix_millis("event_time").alias("t"),
    F.unix_millis("watermark").alias("w"),
    # Spark's clock: the row's watermark + 1 ms, watermarked with a 1 ms delay.
    F.timestamp_millis(F.coalesce(F.unix_millis("watermark"), F.lit(0)) + 1).alias("clock"))
windowed = (clocked.withWatermark("clock", "1 millisecond")
            .groupBy("key")
            .transformWithStateInPandas(WindowCounts(), OUTPUT, "Append", "EventTime"))
run(windowed, "custom").orderBy("window_start", "key").show()
