"""The clock that drives Spark's event-time operators from kwatermark's ``watermark`` column
(DESIGN §10, §16), shared by :mod:`kwatermark.windows`, :mod:`kwatermark.joins` and
:mod:`kwatermark.dedup`.

Spark's stateful operators drop rows at or below the previous watermark. So each input gets
a clock column of ``watermark + 1 ms`` with a 1 ms delay: Spark's watermark is then exactly
the highest row watermark it has seen, and no row of ours is ever below it. An event-time
timer at ``t`` fires in the first micro-batch whose watermark is ``>= t`` (measured; not
strictly above it): a window that the watermark ``window_end - 1`` completes takes its timer
at ``window_end - 1``. The clock only feeds Spark's watermark and is
projected away above it (a projection, unlike a filter, cannot move below the watermark node).

Several inputs: Spark's watermark over a union is what the one ``withWatermark`` above it
sees, the maximum of the inputs' row watermarks. Each input therefore gets its own clock and
``withWatermark`` *before* the union; Spark's ``multipleWatermarkPolicy`` (``min`` by default,
required here) then drives the operator by the lowest input's watermark.

>>> from kwatermark.clock import follow_watermarks          # doctest: +SKIP
>>> driven = follow_watermarks([clicks, views], "kwatermark_watermark", who="my operator")
>>> driven.groupBy("k").transformWithStateInPandas(processor, schema, "Append", "EventTime")
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kwatermark import sparkversion
from kwatermark.errors import KWatermarkError, OptionError

log = logging.getLogger("kwatermark.clock")

CLOCK = "kwatermark_clock"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
POLICY = "spark.sql.streaming.multipleWatermarkPolicy"
# A union node in an analyzed plan's tree string: "~Union false, false" (~: streaming) after
# the tree drawing.
_UNION = re.compile(r"^[\s:+|~-]*Union\b", re.MULTILINE)


def streams(frames: DataFrame | Sequence[DataFrame]) -> list[DataFrame]:
    """One input or several, as a list."""
    return [frames] if isinstance(frames, DataFrame) else list(frames)


def check_heartbeat(df: DataFrame, who: str, error: type[KWatermarkError]) -> None:
    """A ``format("kwatermark")`` stream with ``watermark.heartbeat`` on, or a clear error."""
    columns = set(df.columns)
    if "is_heartbeat" not in columns or "watermark" not in columns:
        raise OptionError(
            f"{who} needs a format('kwatermark') stream read with "
            ".option('watermark.heartbeat', 'true') (it has no 'is_heartbeat' column): the "
            "heartbeat micro-batches let the last results come out without a new record")
    if not df.isStreaming:
        raise error(f"{who} needs a streaming DataFrame (spark.readStream.format('kwatermark'))")


def refuse_union(df: DataFrame, who: str, route: str | None,
                 error: type[KWatermarkError]) -> None:
    """Refuse a stream that is a union of several streams: one clock above a union follows
    the fastest input, so results would come out before the slower input's rows arrive.
    ``route``: the caller's own way to take several streams, if it has one."""
    plan = _analyzed_plan(df)
    if plan is not None and _UNION.search(plan):
        instead = f"pass the streams as a list, {route}, or " if route else ""
        raise error(
            f"{who} was given a union of streams: Spark's watermark above a union follows the "
            f"fastest input, so results would come out before the slower input's rows. "
            f"Instead, {instead}read the topics with one source "
            f"(.option('subscribe', 'a,b')): the lowest watermark then drives the operator")


def _analyzed_plan(df: DataFrame) -> str | None:
    """The analyzed logical plan as text; None where it cannot be had (Spark Connect)."""
    try:
        return df._jdf.queryExecution().analyzed().toString()
    except Exception:  # noqa: BLE001 - Spark Connect has no JVM handle: nothing to inspect
        return None


# The first Spark whose Python API has each of Spark's transformWithState family (DESIGN
# §23): pyspark 4.0 has only the pandas one, 4.1 added the Row one.
STATEFUL_API_SINCE = {"transformWithStateInPandas": "4.0.0", "transformWithState": "4.1.0"}


def prepare_session(df: DataFrame, who: str, error: type[KWatermarkError],
                    api: str = "transformWithState") -> None:
    """transformWithState (``api``: the one ``who`` runs on) needs a Spark that has it,
    protobuf in the Python workers and the RocksDB state store; several inputs need Spark's
    ``min`` watermark policy."""
    if not hasattr(df.groupBy(), api):
        raise error(f"{who} runs on Spark's {api}, which needs Spark "
                    f"{STATEFUL_API_SINCE[api]} or later; this is pyspark "
                    f"{sparkversion.installed()} (docs/operations.md, \"Spark versions\")")
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        raise error(f"{who} needs the 'protobuf' package (Spark's transformWithState talks "
                    "to its state store with it): pip install protobuf") from None
    conf = df.sparkSession.conf
    provider = conf.get(PROVIDER, None)
    if provider is None or provider.endswith("HDFSBackedStateStoreProvider"):
        # Only new checkpoints take it: a restarted query keeps the provider it started with.
        conf.set(PROVIDER, ROCKSDB)
        log.info("set %s=%s (Spark's transformWithState needs it)", PROVIDER, ROCKSDB)
    elif provider != ROCKSDB:
        raise error(f"{who} needs {PROVIDER}={ROCKSDB} (transformWithState supports only "
                    f"RocksDB); it is {provider}")


def require_min_policy(df: DataFrame, who: str, error: type[KWatermarkError]) -> None:
    """Several inputs are combined by Spark's ``multipleWatermarkPolicy``: it must be min."""
    policy = df.sparkSession.conf.get(POLICY, "min")
    if str(policy).lower() != "min":
        raise error(f"{who} over several streams needs {POLICY}=min (the lowest input's "
                    f"watermark drives the operator); it is {policy}")


def clock_of(mark_ms: Column) -> Column:
    """The clock column for a row whose watermark is ``mark_ms`` (epoch ms, null: none)."""
    return F.timestamp_millis(F.coalesce(mark_ms, F.lit(0)) + 1)


def follow_watermark(df: DataFrame, mark_ms: str | Column) -> DataFrame:
    """``df`` with Spark's watermark following its ``mark_ms`` column (epoch ms; a column
    expression to leave some rows out, null for them): the +1 ms clock with a 1 ms delay
    (module docstring); the columns are unchanged."""
    mark = F.col(mark_ms) if isinstance(mark_ms, str) else mark_ms
    return (df.withColumn(CLOCK, clock_of(mark))
            .withWatermark(CLOCK, "1 millisecond")
            .drop(CLOCK))


def follow_watermarks(frames: Sequence[DataFrame], mark_ms: str | Column) -> DataFrame:
    """Each input following its own watermark, then their union by name: Spark's ``min``
    policy drives whatever is above by the lowest of them."""
    driven = [follow_watermark(f, mark_ms) for f in frames]
    union = driven[0]
    for other in driven[1:]:
        union = union.unionByName(other)
    return union


def wake_at(handle, wake_up: int | None, watermark: int) -> None:
    """Make sure the key is woken at the first watermark (``wake_up``, None: none) at which
    it has something to do. Spark fires a timer once its watermark *reaches* the timer's time
    (module docstring), so the timer goes at ``wake_up`` itself, and never at or below the
    current watermark: such a timer is the one firing now (or due in this batch), which Spark
    deletes as ``handleExpiredTimer`` returns, so it would never fire again. Earlier timers
    are left to fire: the processors' expiry is idempotent, and keeping no timer bookkeeping
    in state leaves nothing to disagree with Spark's own timer list."""
    if wake_up is None:
        return
    wanted = max(wake_up, watermark + 1)
    if wanted not in set(handle.listTimers()):
        handle.registerTimer(wanted)
