"""Parsing and validation of every source option, up front, into frozen dataclasses.

Option names are case-insensitive, as in Spark. Every option of Spark's Kafka source that
makes sense for librdkafka keeps its name, default and meaning; the rest fail here with a
message naming the option. See docs/options.md.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from difflib import get_close_matches

from kwatermark import security
from kwatermark.errors import OptionError

# Spark's own Kafka options (case-insensitive) plus kwatermark's. kafka.* is passed through.
SPARK_KAFKA_OPTIONS = (
    "subscribe", "subscribePattern", "assign",
    "startingOffsets", "endingOffsets",
    "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
    "startingTimestamp", "endingTimestamp", "startingOffsetsByTimestampStrategy",
    "failOnDataLoss", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "minPartitions", "maxRecordsPerPartition", "includeHeaders",
    "kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries", "fetchOffset.retryIntervalMs",
    "groupIdPrefix",
)
KWATERMARK_OPTIONS = (
    "eventTime.field", "eventTime.assigner",
    "watermark.strategy", "watermark.maxOutOfOrderness", "watermark.punctuation",
    "watermark.maxTimeLag", "watermark.combine", "watermark.percentile",
    "watermark.stateLocation", "watermark.heartbeat", "watermark.alignment.maxDrift",
    "idle.policy", "idle.timeout", "idle.maxDelay",
    "lateRecords", "allowedLateness",
    "key.format", "value.format", "key.onError", "value.onError",
    "arrow.maxRecordsPerBatch", "minRecordsPerPartition", "readEngine",
)
# readEngine (DESIGN §19, docs/operations.md "Read engines"): "compiled" reads librdkafka's
# messages straight into Arrow buffers (kwatermark.compiled), "python" through
# confluent-kafka's message objects; unset, the compiled one where it is built. The
# environment variable sets the default where the option is not given (the tests run the
# read tests once per engine with it).
READ_ENGINES = ("compiled", "python")
READ_ENGINE_ENV = "KWATERMARK_READ_ENGINE"
# Spark pays ~30 ms per Python task: below this many records a range shares its task with
# others (bench/README.md, "many partitions").
DEFAULT_MIN_RECORDS_PER_PARTITION = 20_000
# arrow.maxRecordsPerBatch unset: each engine's own. Spark pays a fixed cost per Arrow batch
# a Python source yields: 50,000 made the compiled engine's 4-partition stream ~5 % cheaper
# per record than 10,000; the Python engine's lists of message values cost more per record
# past 10,000 (2.02 us a record against 1.70 outside Spark; bench/README.md).
COMPILED_BATCH_RECORDS = 50_000
PYTHON_BATCH_RECORDS = 10_000
# Serde options are open-ended (schemas, registry auth); they are validated by kwatermark.serde.
SERDE_PREFIXES = ("key.avro.", "value.avro.", "key.json.", "value.json.",
                  "key.protobuf.", "value.protobuf.",
                  "key.schema.registry.", "value.schema.registry.")
# The {role}.format values (kwatermark.serde.FORMATS; serde is imported lazily).
FORMATS = ("binary", "string", "json", "avro", "avro-confluent", "protobuf-confluent",
           "json-schema-confluent")
# Plug-in options are passed through to user classes with their full names.
PLUGIN_PREFIXES = ("watermark.", "idle.")

_CANONICAL = {name.lower(): name for name in SPARK_KAFKA_OPTIONS + KWATERMARK_OPTIONS}

# kafka.* keys that Spark's source rejects, or that the reader must own, with the reason.
REJECTED_KAFKA_KEYS = {
    "group.id": None,  # allowed, see below: Spark accepts kafka.group.id
    "auto.offset.reset": "set the source option 'startingOffsets' instead; the source owns "
                         "offset positioning",
    "key.deserializer": "keys are always read as bytes; use 'key.format' to decode them",
    "value.deserializer": "values are always read as bytes; use 'value.format' to decode them",
    "enable.auto.commit": "the source does not commit offsets to Kafka; progress lives in "
                          "Spark's checkpoint",
    "interceptor.classes": "Java consumer interceptors do not exist in librdkafka",
    "enable.partition.eof": "the reader needs end-of-partition events to stop at gaps",
}

# Spark's security options (JAAS, keystores) are translated by kwatermark.security.
SECRET_MARKERS = ("password", "secret", "jaas", "user.info", "token", "credentials",
                  "ssl.key.pem", "ssl.keystore.key", "oauthbearer.config")

STRATEGIES = ("monotonous", "bounded", "punctuated", "timelag", "none")
COMBINES = ("min", "percentile")
IDLE_POLICIES = ("none", "timeout", "caught-up", "advance")
LATE_MODES = ("keep", "flag", "drop")
ON_ERROR_MODES = ("fail", "null")
TIMESTAMP_STRATEGIES = ("error", "latest")

EARLIEST = -2
LATEST = -1

_UNIT_MS = {
    "ms": 1, "millisecond": 1, "milliseconds": 1, "msec": 1, "msecs": 1,
    "us": 0.001, "microsecond": 0.001, "microseconds": 0.001,
    "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "mins": 60_000, "minute": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
    "d": 86_400_000, "day": 86_400_000, "days": 86_400_000,
    "week": 604_800_000, "weeks": 604_800_000,
}
_DURATION_PART = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([a-z]+)\s*")


def is_secret(key: str) -> bool:
    """True for option names whose values must never be logged or shown."""
    lowered = key.lower()
    return any(marker in lowered for marker in SECRET_MARKERS)


def redact(options: Mapping[str, str]) -> dict[str, str]:
    return {k: ("***" if is_secret(k) else v) for k, v in options.items()}


def parse_duration_ms(option: str, text: str) -> int:
    """Milliseconds from a Spark interval string: ``"5 seconds"``, ``"1 minute 30 seconds"``,
    ``"interval 250 milliseconds"``, ``"10s"``, ``"100ms"``; a bare number is milliseconds."""
    raw = text.strip().lower()
    raw = raw.removeprefix("interval ")
    if re.fullmatch(r"[0-9]{1,18}", raw):
        return int(raw)
    total = 0.0
    pos = 0
    for match in _DURATION_PART.finditer(raw):
        if match.start() != pos or match.group(2) not in _UNIT_MS:
            break
        total += float(match.group(1)) * _UNIT_MS[match.group(2)]
        pos = match.end()
    if pos != len(raw) or not raw:
        raise OptionError(
            f"option {option}: cannot parse duration {text!r}; use a Spark interval string "
            f"such as '5 seconds', '250 milliseconds' or '1 minute'")
    if total < 0:
        raise OptionError(f"option {option}: duration {text!r} is negative")
    if total >= 2**62:  # also inf: an absurdly long number of units
        raise OptionError(f"option {option}: duration {text!r} is too large")
    return round(total)


def _parse_bool(option: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise OptionError(f"option {option}: expected 'true' or 'false', got {text!r}")


def _parse_int(option: str, text: str, minimum: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f"option {option}: expected a whole number, got {text!r}") from None
    if value < minimum:
        raise OptionError(f"option {option}: must be >= {minimum}, got {value}")
    return value


def _parse_choice(option: str, text: str, choices: tuple[str, ...], plugin: bool = False) -> str:
    lowered = text.strip().lower()
    if lowered in choices:
        return lowered
    if plugin and ":" in text:
        return text.strip()
    accepted = ", ".join(choices) + (", or 'package.module:ClassName'" if plugin else "")
    raise OptionError(f"option {option}: unknown value {text!r}; accepted: {accepted}")


def _read_engine(opts: Mapping[str, str]) -> str | None:
    text = opts.get("readEngine", os.environ.get(READ_ENGINE_ENV) or None)
    return None if text is None else _parse_choice("readEngine", text, READ_ENGINES)


def _parse_percentile(option: str, text: str) -> str:
    """A percentile p in (0, 100], normalised (``"50.0"`` -> ``"50"``)."""
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise OptionError(f"option {option}: expected a number in (0, 100], e.g. '50' or "
                          f"'99.5', got {text!r}") from None
    if not value.is_finite() or not 0 < value <= 100:
        raise OptionError(f"option {option}: must be in (0, 100] (100 is the minimum over "
                          f"partitions, 50 the median), got {text!r}")
    normal = value.normalize()
    return f"{normal:f}"


def percentile_rank(percentile: str, n: int) -> int:
    """k = ceil(p * n / 100): the combined watermark is the k-th largest of n (DESIGN §13)."""
    return max(1, math.ceil(Decimal(percentile) * n / 100)) if n else 0


def _parse_json(option: str, text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option {option}: malformed JSON ({exc.msg} at char {exc.pos}): "
                          f"{text!r}") from None
    except RecursionError:
        raise OptionError(f"option {option}: JSON nested too deeply") from None


def _parse_partition_map(option: str, text: str, *, values: str) -> dict[tuple[str, int], int]:
    """``{"topic": {"0": 23, "1": -2}}`` -> ``{("topic", 0): 23, ...}``."""
    parsed = _parse_json(option, text)
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise OptionError(f"option {option}: expected a JSON object of topic -> "
                          f"{{partition: {values}}}, e.g. {{\"events\": {{\"0\": 23}}}}")
    result: dict[tuple[str, int], int] = {}
    for topic, partitions in parsed.items():
        for partition, value in partitions.items():
            try:
                pnum = int(partition)
            except ValueError:
                raise OptionError(f"option {option}: topic {topic}: partition {partition!r} "
                                  f"is not a number") from None
            if not isinstance(value, int) or isinstance(value, bool):
                raise OptionError(f"option {option}: topic {topic} partition {pnum}: "
                                  f"{values} must be an integer, got {value!r}")
            result[(topic, pnum)] = value
    return result


@dataclass(frozen=True)
class Subscription:
    """Exactly one of Spark's three ways to choose partitions."""

    kind: str  # "subscribe", "subscribePattern" or "assign"
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] = ()

    def selects(self, topic: str) -> bool:
        """Whether ``subscribePattern`` reads ``topic``, as Spark's default offset reader
        decides (``SubscribePatternStrategy``): the pattern *found* anywhere in the name (Java's
        ``Matcher.find()``, Python's ``re.search``), not the whole name; Kafka's internal
        topics never (``Admin.listTopics()`` leaves them out).

        >>> Subscription("subscribePattern", pattern="orders-(eu|us)").selects("orders-eu-old")
        True
        >>> Subscription("subscribePattern", pattern="^orders-(eu|us)$").selects("orders-eu-old")
        False
        """
        return topic not in INTERNAL_TOPICS and re.search(self.pattern or "", topic) is not None


# Apache Kafka's internal topics (Topic.INTERNAL_TOPICS, 4.x; 3.x has the first two): the
# broker flags exactly these as internal. Other names starting with "__" are ordinary topics.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


@dataclass(frozen=True)
class OffsetBound:
    """Where a read starts or ends: ``earliest``/``latest``, per-partition offsets, or times.

    ``offsets`` values may be EARLIEST (-2) or LATEST (-1). ``timestamps`` map partitions to
    epoch ms; ``timestamp`` applies to every partition.
    """

    kind: str  # "earliest", "latest", "offsets", "timestamps", "timestamp"
    offsets: tuple[tuple[tuple[str, int], int], ...] = ()
    timestamp: int | None = None


@dataclass(frozen=True)
class WatermarkConfig:
    strategy: str = "monotonous"
    max_out_of_orderness_ms: int = 0
    punctuation: str | None = None
    event_time_field: str | None = None
    event_time_assigner: str | None = None
    plugin_options: tuple[tuple[str, str], ...] = ()
    max_time_lag_ms: int = 0           # watermark.maxTimeLag, for timelag (DESIGN §13)
    # watermark.combine=percentile: the percentile as given, e.g. "50" or "99.5"; "100" is
    # the minimum. Kept as text so ceil(p * n / 100) is exact (Decimal), not float-rounded.
    percentile: str = "100"

    def fingerprint(self) -> dict:
        """What a partition's watermark state depends on (keys the progress ledger)."""
        data = {
            "strategy": self.strategy, "bound": self.max_out_of_orderness_ms,
            "punctuation": self.punctuation, "field": self.event_time_field,
            "assigner": self.event_time_assigner, "options": list(self.plugin_options),
        }
        # Only when set, so the keys of records written before these options existed hold.
        if self.strategy == "timelag":
            data["timeLag"] = self.max_time_lag_ms
        if self.percentile != "100":
            data["percentile"] = self.percentile
        return data


@dataclass(frozen=True)
class IdleConfig:
    policy: str = "none"
    timeout_ms: int = 30_000
    max_delay_ms: int = 0
    plugin_options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SourceOptions:
    """Every option, validated. Built once on the driver and pickled to executors."""

    bootstrap_servers: str
    kafka_conf: tuple[tuple[str, str], ...] = field(repr=False)  # may hold secrets
    subscription: Subscription
    starting: OffsetBound
    ending: OffsetBound
    timestamp_strategy: str = "error"
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    # Ranges smaller than this share a Spark task (DESIGN §12); 1 = one task per range.
    min_records_per_partition: int = DEFAULT_MIN_RECORDS_PER_PARTITION
    include_headers: bool = False
    poll_timeout_ms: int = 120_000
    fetch_offset_retries: int = 3
    fetch_offset_retry_interval_ms: int = 10
    group_id_prefix: str = "spark-kafka-source"
    group_id: str | None = None
    watermark: WatermarkConfig = field(default_factory=WatermarkConfig)
    idle: IdleConfig = field(default_factory=IdleConfig)
    late_records: str = "keep"
    allowed_lateness_ms: int = 0
    heartbeat: bool = False            # watermark.heartbeat: watermark-only batches (§10)
    alignment_max_drift_ms: int | None = None  # watermark.alignment.maxDrift (§11); None = off
    state_location: str = ""
    state_location_is_default: bool = False   # unset: the driver's temp directory
    serde_options: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # secrets
    key_format: str = "binary"
    value_format: str = "binary"
    key_on_error: str = "fail"
    value_on_error: str = "fail"
    max_records_per_batch: int | None = None   # arrow.maxRecordsPerBatch; see records_per_batch
    read_engine: str | None = None    # readEngine; None: compiled where built

    def records_per_batch(self, compiled: bool) -> int:
        """Records per Arrow batch a task yields: ``arrow.maxRecordsPerBatch``, else the
        engine's own default (``COMPILED_BATCH_RECORDS``, ``PYTHON_BATCH_RECORDS``)."""
        if self.max_records_per_batch is not None:
            return self.max_records_per_batch
        return COMPILED_BATCH_RECORDS if compiled else PYTHON_BATCH_RECORDS

    def consumer_conf(self) -> dict[str, str]:
        """librdkafka configuration for every consumer and admin client the source creates.
        Keystores are read here, in the process that creates the client (kwatermark.security)."""
        # Kafka's Java clients, so Spark's source, set TCP_NODELAY on every broker
        # connection; librdkafka leaves Nagle's algorithm on unless told, and a request
        # written behind one not yet acknowledged waited for the broker's delayed ACK.
        conf = {"bootstrap.servers": self.bootstrap_servers, "socket.nagle.disable": "true"}
        conf.update(security.librdkafka_conf(dict(self.kafka_conf)))
        return conf


# Keys Spark itself adds beside the user's OPTIONS when a catalog table is created or its
# schema inferred (V2SessionCatalog.createTable0 -> TableProvider.inferSchema): the table
# properties, and each option again under TableCatalog.OPTION_PREFIX. Recognised only when
# "provider" names kwatermark, so a user's own .option("owner", ...) still fails as unknown.
TABLE_PROPERTY_KEYS = ("provider", "owner", "location", "path", "comment", "collation",
                       "external", "is_managed_location")
TABLE_OPTION_PREFIX = "option."


def user_options(raw: Mapping[str, str]) -> dict[str, str]:
    """The user's options without what Spark adds for a ``CREATE TABLE ... USING kwatermark``
    (docs/sql.md): the reserved table properties, and an ``option.K`` copy only where K is
    also given with the same value; anything else stays, to be validated as an option."""
    opts = {str(k): str(v) for k, v in raw.items()}
    lowered = {k.lower(): v for k, v in opts.items()}
    if lowered.get("provider", "").strip().lower() != "kwatermark":
        return opts
    kept = {}
    for key, value in opts.items():
        low = key.lower()
        if low in TABLE_PROPERTY_KEYS:
            continue
        if low.startswith(TABLE_OPTION_PREFIX) and \
                lowered.get(low[len(TABLE_OPTION_PREFIX):]) == value:
            continue
        kept[key] = value
    return kept


def _canonical_key(key: str) -> str:
    lowered = key.lower()
    if lowered.startswith("kafka."):
        return "kafka." + key[len("kafka."):]
    if lowered in _CANONICAL:
        return _CANONICAL[lowered]
    for prefix in SERDE_PREFIXES + PLUGIN_PREFIXES:
        if lowered.startswith(prefix):
            return key
    raise _unknown_option(key)


def _unknown_option(key: str) -> OptionError:
    """Spark hands a Python data source its option names lower-cased, so the user's own
    spelling is lost: name the closest documented option in its documented spelling."""
    close = get_close_matches(key.lower(), list(_CANONICAL), n=1)
    hint = f"; did you mean '{_CANONICAL[close[0]]}'?" if close else ""
    spelling = (" (as Spark passes it: option names reach the source lower-cased)"
                if key == key.lower() and key != key.upper() else "")
    return OptionError(f"unknown option '{key}'{spelling}{hint} (see docs/options.md; "
                       f"librdkafka properties take the 'kafka.' prefix)")


def _reject_unused_plugin_options(opts: Mapping[str, str], prefix: str, builtin: bool) -> None:
    """``watermark.*``/``idle.*`` beyond kwatermark's own go to a user class; with a built-in
    strategy or policy nothing would read them, and no option is silently ignored."""
    if not builtin:
        return
    for key in opts:
        if key.lower().startswith(prefix) and key.lower() not in _CANONICAL:
            raise _unknown_option(key)


def _subscription(opts: Mapping[str, str]) -> Subscription:
    given = [name for name in ("subscribe", "subscribePattern", "assign") if name in opts]
    if len(given) != 1:
        raise OptionError("exactly one of the options 'subscribe', 'subscribePattern' or "
                          f"'assign' must be set; got {given or 'none'}")
    kind = given[0]
    text = opts[kind]
    if kind == "subscribe":
        topics = tuple(t.strip() for t in text.split(",") if t.strip())
        if not topics:
            raise OptionError("option subscribe: give one or more comma-separated topics")
        return Subscription(kind, topics=topics)
    if kind == "subscribePattern":
        try:
            with warnings.catch_warnings():
                # Java's class operators ([a-z&&[^x]]) mean something else in Python, which
                # only warns (FutureWarning); a fresh compile, as the cache would not warn.
                warnings.simplefilter("error", FutureWarning)
                re.purge()
                re.compile(text)
        except (re.error, FutureWarning, OverflowError, RecursionError) as exc:
            raise OptionError(f"option subscribePattern: invalid regex {text!r}: {exc} (Python "
                              f"re syntax, which differs from Java's in a few constructs: "
                              f"docs/options.md)") from None
        return Subscription(kind, pattern=text)
    parsed = _parse_json("assign", text)
    # type() is int: JSON true/false are bools, and bool is an int subclass.
    if not isinstance(parsed, dict) or not parsed or not all(
            isinstance(v, list) and all(type(p) is int and p >= 0 for p in v)
            for v in parsed.values()):
        raise OptionError("option assign: expected JSON like {\"topicA\": [0, 1]}, "
                          f"got {text!r}")
    pairs = tuple(sorted((t, p) for t, parts in parsed.items() for p in parts))
    if not pairs:
        raise OptionError(f"option assign: no partitions to assign in {text!r}")
    return Subscription(kind, assigned=pairs)


def _offset_bound(opts: Mapping[str, str], which: str, default: str, streaming: bool
                  ) -> OffsetBound:
    by_ts = f"{which}OffsetsByTimestamp"
    global_ts = f"{which}Timestamp"
    offsets = f"{which}Offsets"
    if global_ts in opts:
        return OffsetBound("timestamp", timestamp=_parse_int(global_ts, opts[global_ts], 0))
    if by_ts in opts:
        parsed = _parse_partition_map(by_ts, opts[by_ts], values="timestamp")
        return OffsetBound("timestamps", offsets=tuple(sorted(parsed.items())))
    text = opts.get(offsets, default).strip()
    if text.lower() in ("earliest", "latest"):
        kind = text.lower()
        if which == "starting" and kind == "latest" and streaming is False:
            raise OptionError("option startingOffsets: 'latest' is not allowed for batch "
                              "queries (it would read nothing); use 'earliest' or JSON")
        if which == "ending" and kind == "earliest":
            raise OptionError("option endingOffsets: 'earliest' is not allowed; use 'latest' "
                              "or JSON")
        return OffsetBound(kind)
    parsed = _parse_partition_map(offsets, text, values="offset")
    for (topic, partition), value in parsed.items():
        if value < EARLIEST:
            raise OptionError(f"option {offsets}: topic {topic} partition {partition}: offset "
                              f"{value} is invalid (use >= 0, -2 for earliest, -1 for latest)")
        if which == "ending" and value == EARLIEST:
            raise OptionError(f"option {offsets}: topic {topic} partition {partition}: -2 "
                              f"(earliest) is not allowed as an ending offset")
        if which == "starting" and value == LATEST and streaming is False:
            raise OptionError(f"option {offsets}: topic {topic} partition {partition}: -1 "
                              f"(latest) is not allowed as a starting offset of a batch query")
    return OffsetBound("offsets", offsets=tuple(sorted(parsed.items())))


def _kafka_conf(opts: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    conf = []
    for key, value in opts.items():
        if not key.startswith("kafka.") or key == "kafka.bootstrap.servers":
            continue
        name = key[len("kafka."):]
        reason = REJECTED_KAFKA_KEYS.get(name.lower())
        if reason:
            raise OptionError(f"option kafka.{name} is not supported: {reason}")
        conf.append((name, value))
    security.check(dict(conf))
    return tuple(sorted(conf))


def _alignment(opts: Mapping[str, str], strategy: str, streaming: bool | None) -> int | None:
    """``watermark.alignment.maxDrift``: a duration, unset = off (DESIGN §11)."""
    name = "watermark.alignment.maxDrift"
    if name not in opts:
        return None
    if not opts[name].strip():
        raise OptionError(f"option {name}: empty; give a duration such as '5 minutes', or "
                          f"leave the option unset to turn alignment off")
    drift = parse_duration_ms(name, opts[name])
    if strategy == "none":
        raise OptionError(f"option {name} needs event-time watermarks, but watermark.strategy "
                          f"is 'none'; choose a strategy or leave {name} unset")
    if streaming is False:
        raise OptionError(f"option {name} applies to streaming queries only; a batch read "
                          f"(spark.read) reads the whole range in one batch")
    return drift


# Spark 4.x hands a Python data source no options at all when it reads a catalog table:
# PythonDataSourceV2.getTable ignores the table's properties (docs/sql.md).
NO_OPTIONS = (
    "option kafka.bootstrap.servers is required, and kwatermark got no options at all. If "
    "this reads a table made by CREATE TABLE ... USING kwatermark OPTIONS (...): Spark does "
    "not pass a catalog table's OPTIONS to a Python data source when the table is read "
    "(PythonDataSourceV2.getTable ignores them). Use CREATE TEMPORARY VIEW ... USING "
    "kwatermark OPTIONS (...) for batch SQL, or give the options where the table is read: "
    "SELECT ... FROM [STREAM] t WITH ('kafka.bootstrap.servers'='host:9092', ...); see "
    "docs/sql.md")


def default_state_location() -> str:
    return os.path.join(tempfile.gettempdir(), "kwatermark-ledger")


def parse_options(raw: Mapping[str, str], *, streaming: bool | None = True) -> SourceOptions:
    """Validate every option; raise OptionError naming the first bad one.

    ``streaming=None`` skips the rules that depend on the kind of query (Spark asks for the
    schema before it says whether the read is a stream or a batch).

    >>> parse_options({"kafka.bootstrap.servers": "localhost:9092", "subscribe": "events"})
    ... # doctest: +ELLIPSIS
    SourceOptions(bootstrap_servers='localhost:9092', ...)
    """
    given = user_options(raw)
    if not given:
        raise OptionError(NO_OPTIONS)
    opts: dict[str, str] = {}
    for key, value in given.items():
        canonical = _canonical_key(key)
        opts[canonical] = value
    lowered = {k.lower(): v for k, v in opts.items()}
    servers = lowered.get("kafka.bootstrap.servers", "").strip()
    if not servers:
        raise OptionError("option kafka.bootstrap.servers is required, e.g. 'localhost:9092'")
    group_id = lowered.get("kafka.group.id")
    kafka_conf = tuple((k, v) for k, v in _kafka_conf(opts) if k.lower() != "group.id")

    strategy = _parse_choice("watermark.strategy", opts.get("watermark.strategy", "monotonous"),
                             STRATEGIES, plugin=True)
    punctuation = opts.get("watermark.punctuation")
    if strategy == "punctuated" and not punctuation:
        raise OptionError("option watermark.punctuation is required when watermark.strategy "
                          "is 'punctuated' (a 'package.module:function' predicate)")
    if punctuation and ":" not in punctuation:
        raise OptionError(f"option watermark.punctuation: expected 'package.module:function', "
                          f"got {punctuation!r}")
    assigner = opts.get("eventTime.assigner")
    if assigner and ":" not in assigner:
        raise OptionError(f"option eventTime.assigner: expected 'package.module:function', "
                          f"got {assigner!r}")
    field_path = opts.get("eventTime.field")
    if field_path and assigner:
        raise OptionError("options eventTime.field and eventTime.assigner conflict; set one")
    value_format = _parse_choice("value.format", opts.get("value.format", "binary"), FORMATS)
    key_format = _parse_choice("key.format", opts.get("key.format", "binary"), FORMATS)
    if field_path and value_format in ("binary", "string"):
        raise OptionError("option eventTime.field needs a structured value.format "
                          "(json, avro, avro-confluent, protobuf-confluent or "
                          "json-schema-confluent)")
    if strategy == "timelag" and "watermark.maxTimeLag" not in opts:
        raise OptionError("option watermark.maxTimeLag is required when watermark.strategy "
                          "is 'timelag' (how far the watermark trails processing time, e.g. "
                          "'30 seconds')")
    if "watermark.maxTimeLag" in opts and strategy != "timelag":
        raise OptionError(f"option watermark.maxTimeLag applies to watermark.strategy="
                          f"timelag only (the strategy is {strategy!r})")
    combine = _parse_choice("watermark.combine", opts.get("watermark.combine", "min"),
                            COMBINES)
    if combine == "percentile" and "watermark.percentile" not in opts:
        raise OptionError("option watermark.percentile is required when watermark.combine is "
                          "'percentile' (a number in (0, 100], e.g. '50' for the median)")
    if "watermark.percentile" in opts and combine != "percentile":
        raise OptionError("option watermark.percentile applies to watermark.combine="
                          "percentile only; set watermark.combine=percentile as well")
    watermark = WatermarkConfig(
        max_time_lag_ms=parse_duration_ms("watermark.maxTimeLag",
                                          opts.get("watermark.maxTimeLag", "0")),
        percentile=(_parse_percentile("watermark.percentile", opts["watermark.percentile"])
                    if combine == "percentile" else "100"),
        strategy=strategy,
        max_out_of_orderness_ms=parse_duration_ms(
            "watermark.maxOutOfOrderness", opts.get("watermark.maxOutOfOrderness", "0")),
        punctuation=punctuation,
        event_time_field=field_path,
        event_time_assigner=assigner,
        plugin_options=tuple(sorted((k, v) for k, v in opts.items()
                                    if k.lower().startswith("watermark."))),
    )
    idle = IdleConfig(
        policy=_parse_choice("idle.policy", opts.get("idle.policy", "none"), IDLE_POLICIES,
                             plugin=True),
        timeout_ms=parse_duration_ms("idle.timeout", opts.get("idle.timeout", "30 seconds")),
        max_delay_ms=parse_duration_ms("idle.maxDelay", opts.get("idle.maxDelay", "0")),
        plugin_options=tuple(sorted((k, v) for k, v in opts.items()
                                    if k.lower().startswith("idle."))),
    )
    _reject_unused_plugin_options(opts, "watermark.", watermark.strategy in STRATEGIES)
    _reject_unused_plugin_options(opts, "idle.", idle.policy in IDLE_POLICIES)

    def optional_int(name: str, minimum: int) -> int | None:
        return _parse_int(name, opts[name], minimum) if name in opts else None

    max_per_trigger = optional_int("maxOffsetsPerTrigger", 1)
    min_per_trigger = optional_int("minOffsetsPerTrigger", 1)
    if max_per_trigger and min_per_trigger and min_per_trigger > max_per_trigger:
        raise OptionError(f"option minOffsetsPerTrigger ({min_per_trigger}) is larger than "
                          f"maxOffsetsPerTrigger ({max_per_trigger})")
    if streaming is False:
        for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
            if name in opts:
                raise OptionError(f"option {name} applies to streaming queries only; a batch "
                                  f"read (spark.read) reads the whole range")
    elif streaming and any(name in opts for name in ("endingOffsets", "endingOffsetsByTimestamp",
                                        "endingTimestamp")):
        raise OptionError("options endingOffsets/endingOffsetsByTimestamp/endingTimestamp "
                          "apply to batch queries only (spark.read), as in Spark")

    state_location = opts.get("watermark.stateLocation") or default_state_location()
    max_drift = _alignment(opts, strategy, streaming)
    return SourceOptions(
        bootstrap_servers=servers,
        kafka_conf=kafka_conf,
        subscription=_subscription(opts),
        starting=_offset_bound(opts, "starting", "latest" if streaming else "earliest",
                               streaming),
        ending=(_offset_bound(opts, "ending", "latest", streaming) if not streaming
                else OffsetBound("latest")),
        timestamp_strategy=_parse_choice(
            "startingOffsetsByTimestampStrategy",
            opts.get("startingOffsetsByTimestampStrategy", "error"), TIMESTAMP_STRATEGIES),
        fail_on_data_loss=_parse_bool("failOnDataLoss", opts.get("failOnDataLoss", "true")),
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=parse_duration_ms("maxTriggerDelay",
                                               opts.get("maxTriggerDelay", "15m")),
        min_partitions=optional_int("minPartitions", 1),
        max_records_per_partition=optional_int("maxRecordsPerPartition", 1),
        min_records_per_partition=_parse_int(
            "minRecordsPerPartition",
            opts.get("minRecordsPerPartition", str(DEFAULT_MIN_RECORDS_PER_PARTITION)), 1),
        include_headers=_parse_bool("includeHeaders", opts.get("includeHeaders", "false")),
        poll_timeout_ms=_parse_int("kafkaConsumer.pollTimeoutMs",
                                   opts.get("kafkaConsumer.pollTimeoutMs", "120000"), 1),
        fetch_offset_retries=_parse_int("fetchOffset.numRetries",
                                        opts.get("fetchOffset.numRetries", "3"), 0),
        fetch_offset_retry_interval_ms=_parse_int(
            "fetchOffset.retryIntervalMs", opts.get("fetchOffset.retryIntervalMs", "10"), 0),
        group_id_prefix=opts.get("groupIdPrefix", "spark-kafka-source"),
        group_id=group_id,
        watermark=watermark,
        idle=idle,
        late_records=_parse_choice("lateRecords", opts.get("lateRecords", "keep"), LATE_MODES),
        allowed_lateness_ms=parse_duration_ms("allowedLateness",
                                              opts.get("allowedLateness", "0")),
        heartbeat=_parse_bool("watermark.heartbeat", opts.get("watermark.heartbeat", "false")),
        alignment_max_drift_ms=max_drift,
        state_location=state_location,
        state_location_is_default=not opts.get("watermark.stateLocation"),
        serde_options=tuple(sorted((k, v) for k, v in opts.items()
                                   if k.lower().startswith(("key.", "value.")))),
        key_format=key_format,
        value_format=value_format,
        key_on_error=_parse_choice("key.onError", opts.get("key.onError", "fail"),
                                   ON_ERROR_MODES),
        value_on_error=_parse_choice("value.onError", opts.get("value.onError", "fail"),
                                     ON_ERROR_MODES),
        max_records_per_batch=(None if opts.get("arrow.maxRecordsPerBatch") is None else
                               _parse_int("arrow.maxRecordsPerBatch",
                                          opts["arrow.maxRecordsPerBatch"], 1)),
        read_engine=_read_engine(opts),
    )
