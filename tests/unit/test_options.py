"""Option parsing: Spark's defaults and names, durations, and one clear error per bad input."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.errors import OptionError
from kwatermark.options import (
    KWATERMARK_OPTIONS,
    SPARK_KAFKA_OPTIONS,
    OffsetBound,
    SourceOptions,
    Subscription,
    is_secret,
    parse_duration_ms,
    parse_options,
    redact,
)

BASE = {"kafka.bootstrap.servers": "broker:9092", "subscribe": "events"}


def parse(streaming: bool = True, **extra: str) -> SourceOptions:
    return parse_options({**BASE, **extra}, streaming=streaming)


def parse_raw(raw: dict, streaming: bool = True) -> SourceOptions:
    return parse_options({**BASE, **raw}, streaming=streaming)


def option_error(raw: dict, streaming: bool = True) -> str:
    with pytest.raises(OptionError) as info:
        parse_options(raw, streaming=streaming)
    return str(info.value)


# -- defaults ---------------------------------------------------------------------------


def test_streaming_defaults_match_sparks_kafka_source():
    options = parse()
    assert options.bootstrap_servers == "broker:9092"
    assert options.subscription == Subscription("subscribe", topics=("events",))
    assert options.starting == OffsetBound("latest")
    assert options.fail_on_data_loss is True
    assert options.max_trigger_delay_ms == 15 * 60 * 1000
    assert options.include_headers is False
    assert options.poll_timeout_ms == 120_000
    assert options.fetch_offset_retries == 3
    assert options.fetch_offset_retry_interval_ms == 10
    assert options.max_offsets_per_trigger is None
    assert options.min_offsets_per_trigger is None
    assert options.min_partitions is None
    assert options.max_records_per_partition is None
    assert options.group_id is None
    assert options.kafka_conf == ()


def test_batch_defaults_read_from_earliest_to_latest():
    options = parse(streaming=False)
    assert options.starting == OffsetBound("earliest")
    assert options.ending == OffsetBound("latest")


def test_kwatermark_defaults_follow_the_design_table():
    options = parse()
    assert options.watermark.strategy == "monotonous"
    assert options.watermark.max_out_of_orderness_ms == 0
    assert options.watermark.punctuation is None
    assert options.watermark.event_time_field is None
    assert options.watermark.event_time_assigner is None
    assert options.idle.policy == "none"
    assert options.idle.timeout_ms == 30_000
    assert options.idle.max_delay_ms == 0
    assert options.late_records == "keep"
    assert options.allowed_lateness_ms == 0
    assert (options.key_format, options.value_format) == ("binary", "binary")
    assert (options.key_on_error, options.value_on_error) == ("fail", "fail")
    assert options.state_location != ""


def test_records_per_arrow_batch_default_to_each_engines_own_unless_set():
    assert parse().records_per_batch(compiled=True) == 50_000
    assert parse().records_per_batch(compiled=False) == 10_000
    chosen = parse_options({**BASE, "arrow.maxRecordsPerBatch": "64"})
    assert chosen.records_per_batch(compiled=True) == 64
    assert chosen.records_per_batch(compiled=False) == 64


def test_every_documented_option_is_accepted_with_its_value():
    options = parse_options({
        "kafka.bootstrap.servers": "a:1,b:2",
        "assign": '{"t": [1, 0], "s": [2]}',
        "startingOffsets": '{"t": {"0": 23, "1": -2}, "s": {"2": -1}}',
        "failOnDataLoss": "false",
        "maxOffsetsPerTrigger": "1000",
        "minOffsetsPerTrigger": "10",
        "maxTriggerDelay": "2 minutes",
        "minPartitions": "8",
        "maxRecordsPerPartition": "500",
        "includeHeaders": "true",
        "kafkaConsumer.pollTimeoutMs": "5000",
        "fetchOffset.numRetries": "0",
        "fetchOffset.retryIntervalMs": "50",
        "groupIdPrefix": "mine",
        "kafka.group.id": "fixed-group",
        "kafka.security.protocol": "SASL_SSL",
        "watermark.strategy": "bounded",
        "watermark.maxOutOfOrderness": "5 seconds",
        "watermark.stateLocation": "/tmp/somewhere",
        "idle.policy": "advance",
        "idle.timeout": "1 minute",
        "idle.maxDelay": "250 milliseconds",
        "lateRecords": "flag",
        "allowedLateness": "2 seconds",
        "value.format": "json",
        "value.json.schema": "a INT",
        "eventTime.field": "a",
        "value.onError": "null",
        "arrow.maxRecordsPerBatch": "64",
    })
    assert options.bootstrap_servers == "a:1,b:2"
    assert options.subscription == Subscription("assign", assigned=(("s", 2), ("t", 0),
                                                                    ("t", 1)))
    assert options.starting == OffsetBound("offsets", offsets=((("s", 2), -1), (("t", 0), 23),
                                                               (("t", 1), -2)))
    assert options.fail_on_data_loss is False
    assert options.max_offsets_per_trigger == 1000
    assert options.min_offsets_per_trigger == 10
    assert options.max_trigger_delay_ms == 120_000
    assert options.min_partitions == 8
    assert options.max_records_per_partition == 500
    assert options.include_headers is True
    assert options.poll_timeout_ms == 5000
    assert options.fetch_offset_retries == 0
    assert options.fetch_offset_retry_interval_ms == 50
    assert options.group_id_prefix == "mine"
    assert options.group_id == "fixed-group"
    assert options.kafka_conf == (("security.protocol", "SASL_SSL"),)
    # TCP_NODELAY, as Kafka's Java clients: a user's kafka.socket.nagle.disable would win
    assert options.consumer_conf() == {"bootstrap.servers": "a:1,b:2",
                                       "socket.nagle.disable": "true",
                                       "security.protocol": "SASL_SSL"}
    assert options.watermark.strategy == "bounded"
    assert options.watermark.max_out_of_orderness_ms == 5000
    assert options.state_location == "/tmp/somewhere"
    assert options.idle.policy == "advance"
    assert options.idle.timeout_ms == 60_000
    assert options.idle.max_delay_ms == 250
    assert options.late_records == "flag"
    assert options.allowed_lateness_ms == 2000
    assert options.value_format == "json"
    assert options.watermark.event_time_field == "a"
    assert options.value_on_error == "null"
    assert options.max_records_per_batch == 64
    assert ("value.json.schema", "a INT") in options.serde_options


def test_subscribe_pattern_and_topic_lists():
    assert parse_options({"kafka.bootstrap.servers": "b:1", "subscribePattern": "ev.*"}
                         ).subscription == Subscription("subscribePattern", pattern="ev.*")
    assert parse_options({"kafka.bootstrap.servers": "b:1", "subscribe": " a, b ,,c "}
                         ).subscription.topics == ("a", "b", "c")


# Spark's default offset reader (SubscribePatternStrategy over Admin.listTopics()) keeps a
# topic when the pattern is *found* in its name (Scala's findFirstIn, Java's Matcher.find());
# Kafka's internal topics are never listed. Expected values written from that rule by hand.
@pytest.mark.parametrize("pattern, topic, selected", [
    ("orders-(ct|lat)", "orders-ct", True),
    ("orders-(ct|lat)", "orders-lat", True),
    ("orders-(ct|lat)", "orders-ct-x", True),          # found in a part of the name
    ("orders-(ct|lat)", "old-orders-lat", True),
    ("orders-(ct|lat)", "orders-c", False),
    ("^orders-(ct|lat)$", "orders-ct-x", False),       # anchors ask for the whole name
    ("^orders-(ct|lat)$", "orders-ct", True),
    ("ev.*", "events", True),
    ("ev.*", "prev", True),
    ("x", "events", False),
    (".*", "__consumer_offsets", False),               # internal topics never
    ("transaction", "__transaction_state", False),
    ("share", "__share_group_state", False),
    ("^__", "__remote_log_metadata", True),            # "__" alone does not make one internal
    ("(?i)EVENTS", "events", True),
])
def test_subscribe_pattern_selects_a_topic_as_spark_does(pattern, topic, selected):
    subscription = parse_options({"kafka.bootstrap.servers": "b:1",
                                  "subscribePattern": pattern}).subscription
    assert subscription.selects(topic) is selected


@pytest.mark.parametrize("java", [r"\Qa.b\E", r"\p{Alpha}+", r"[a-z&&[^x]]", r"(?<n>ev)",
                                  r"events\z"])
def test_a_java_only_pattern_construct_fails_naming_the_option_and_the_syntax(java):
    text = option_error({"kafka.bootstrap.servers": "b:1", "subscribePattern": java})
    assert text.startswith(f"option subscribePattern: invalid regex {java!r}")
    assert "Python re syntax" in text and "docs/options.md" in text


def test_starting_by_timestamp_forms():
    assert parse(startingTimestamp="1700000000000").starting == OffsetBound(
        "timestamp", timestamp=1_700_000_000_000)
    by_partition = parse(startingOffsetsByTimestamp='{"t": {"0": 1000, "1": 2000}}').starting
    assert by_partition == OffsetBound("timestamps", offsets=((("t", 0), 1000),
                                                               (("t", 1), 2000)))
    assert parse(startingOffsetsByTimestampStrategy="LATEST").timestamp_strategy == "latest"


def test_batch_ending_offsets():
    assert parse(streaming=False, endingOffsets='{"t": {"0": 5, "1": -1}}').ending == \
        OffsetBound("offsets", offsets=((("t", 0), 5), (("t", 1), -1)))


def test_schema_time_parse_accepts_options_of_either_kind_of_query():
    """``streaming=None`` (Spark asks for the schema first) skips query-kind rules."""
    options = parse(streaming=None, endingOffsets="latest", maxOffsetsPerTrigger="10")
    assert options.max_offsets_per_trigger == 10


# -- names -------------------------------------------------------------------------------


def test_option_names_are_case_insensitive():
    options = parse_options({
        "Kafka.Bootstrap.Servers": "b:1",
        "SUBSCRIBE": "events",
        "startingoffsets": "EARLIEST",
        "FailOnDataLoss": "FALSE",
        "MAXOFFSETSPERTRIGGER": "7",
        "kafkaconsumer.polltimeoutms": "999",
        "Watermark.Strategy": "Bounded",
        "WATERMARK.MAXOUTOFORDERNESS": "3 SECONDS",
        "idle.POLICY": "Caught-Up",
        "LateRecords": "DROP",
        "includeheaders": "True",
    })
    assert options.bootstrap_servers == "b:1"
    assert options.subscription.topics == ("events",)
    assert options.starting == OffsetBound("earliest")
    assert options.fail_on_data_loss is False
    assert options.max_offsets_per_trigger == 7
    assert options.poll_timeout_ms == 999
    assert options.watermark.strategy == "bounded"
    assert options.watermark.max_out_of_orderness_ms == 3000
    assert options.idle.policy == "caught-up"
    assert options.late_records == "drop"
    assert options.include_headers is True


@pytest.mark.parametrize("wrong, meant", [
    ("subscrib", "subscribe"),
    ("startingOffset", "startingOffsets"),
    ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"),
    ("failOnDataLos", "failOnDataLoss"),
    ("lateRecord", "lateRecords"),
    ("watermark.stratgy", "watermark.strategy"),
    ("watermark.maxOutOfOrderness_ms", "watermark.maxOutOfOrderness"),
    ("idle.timout", "idle.timeout"),
])
def test_unknown_option_names_it_and_suggests_the_close_one(wrong, meant):
    message = option_error({**BASE, wrong: "x"})
    assert f"unknown option '{wrong}'" in message
    assert f"did you mean '{meant}'" in message


def test_unknown_option_without_a_close_match_still_names_it():
    message = option_error({**BASE, "zzqqxx": "1"})
    assert "'zzqqxx'" in message
    assert "did you mean" not in message


def test_plugin_options_pass_through_to_custom_classes_with_full_names():
    options = parse(**{"watermark.strategy": "mymod:Gen", "watermark.lagMs": "250",
                       "idle.policy": "mymod:Policy", "idle.quietMs": "500"})
    assert ("watermark.lagMs", "250") in options.watermark.plugin_options
    assert ("watermark.strategy", "mymod:Gen") in options.watermark.plugin_options
    assert ("idle.quietMs", "500") in options.idle.plugin_options
    assert ("idle.policy", "mymod:Policy") in options.idle.plugin_options


# -- durations ---------------------------------------------------------------------------


@pytest.mark.parametrize("text, ms", [
    ("5 seconds", 5000),
    ("250 milliseconds", 250),
    ("1 minute 30 seconds", 90_000),
    ("10s", 10_000),
    ("100ms", 100),
    ("interval 2 seconds", 2000),
    ("INTERVAL 3 SECONDS", 3000),
    ("1500", 1500),
    ("0", 0),
    ("0 seconds", 0),
    ("15m", 900_000),
    ("2 hours", 7_200_000),
    ("1 day", 86_400_000),
    ("1 week", 604_800_000),
    ("1.5 seconds", 1500),
    ("  7 sec  ", 7000),
])
def test_durations(text, ms):
    assert parse_duration_ms("idle.timeout", text) == ms
    assert parse(**{"watermark.maxOutOfOrderness": text}).watermark.max_out_of_orderness_ms \
        == ms


@pytest.mark.parametrize("text", [
    "", "   ", "seconds", "5 fortnights", "5 seconds extra", "-1 seconds", "1.2.3 s", "abc",
    "interval", "5,000 ms", "s5", "1e3 ms",
])
@pytest.mark.parametrize("option", ["watermark.maxOutOfOrderness", "idle.timeout",
                                    "idle.maxDelay", "allowedLateness", "maxTriggerDelay"])
def test_bad_durations_name_the_option(option, text):
    message = option_error({**BASE, option: text})
    assert f"option {option}" in message


def test_absurdly_long_duration_is_an_option_error():
    with pytest.raises(OptionError, match="idle.timeout"):
        parse_duration_ms("idle.timeout", "9" * 400 + " seconds")
    with pytest.raises(OptionError, match="idle.timeout"):
        parse_duration_ms("idle.timeout", "9" * 5000)


# -- bad values ----------------------------------------------------------------------------


@pytest.mark.parametrize("raw, named", [
    ({"kafka.bootstrap.servers": "b:1", "assign": "{not json"}, "option assign"),
    ({"kafka.bootstrap.servers": "b:1", "assign": '{"t": "0"}'}, "option assign"),
    ({"kafka.bootstrap.servers": "b:1", "assign": "[0, 1]"}, "option assign"),
    ({"kafka.bootstrap.servers": "b:1", "assign": "{}"}, "option assign"),
    ({"kafka.bootstrap.servers": "b:1", "assign": '{"t": []}'}, "option assign"),
    ({"kafka.bootstrap.servers": "b:1", "assign": '{"t": [true]}'}, "option assign"),
    ({"kafka.bootstrap.servers": "b:1", "assign": '{"t": [-1]}'}, "option assign"),
    ({"kafka.bootstrap.servers": "b:1", "assign": '{"t": [1.0]}'}, "option assign"),
    ({**BASE, "startingOffsets": '{"t": {"0": '}, "option startingOffsets"),
    ({**BASE, "startingOffsets": "middle"}, "option startingOffsets"),
    ({**BASE, "startingOffsets": '{"t": [0]}'}, "option startingOffsets"),
    ({**BASE, "startingOffsets": '{"t": {"zero": 1}}'}, "option startingOffsets"),
    ({**BASE, "startingOffsets": '{"t": {"0": "1"}}'}, "option startingOffsets"),
    ({**BASE, "startingOffsets": '{"t": {"0": true}}'}, "option startingOffsets"),
    ({**BASE, "startingOffsets": '{"t": {"0": -3}}'}, "option startingOffsets"),
    ({**BASE, "startingOffsetsByTimestamp": '{"t": {"0": }}'},
     "option startingOffsetsByTimestamp"),
    ({**BASE, "startingTimestamp": "yesterday"}, "option startingTimestamp"),
    ({**BASE, "startingOffsetsByTimestampStrategy": "closest"},
     "option startingOffsetsByTimestampStrategy"),
    ({**BASE, "failOnDataLoss": "yes"}, "option failOnDataLoss"),
    ({**BASE, "includeHeaders": "1"}, "option includeHeaders"),
    ({**BASE, "kafkaConsumer.pollTimeoutMs": "0"}, "option kafkaConsumer.pollTimeoutMs"),
    ({**BASE, "minPartitions": "0"}, "option minPartitions"),
    ({**BASE, "maxRecordsPerPartition": "many"}, "option maxRecordsPerPartition"),
    ({**BASE, "fetchOffset.numRetries": "-1"}, "option fetchOffset.numRetries"),
    ({**BASE, "watermark.strategy": "fastest"}, "option watermark.strategy"),
    ({**BASE, "idle.policy": "sometimes"}, "option idle.policy"),
    ({**BASE, "lateRecords": "discard"}, "option lateRecords"),
    ({**BASE, "value.format": "xml"}, "option value.format"),
    ({**BASE, "key.format": "protobuf"}, "option key.format"),
    ({**BASE, "value.onError": "skip"}, "option value.onError"),
    ({**BASE, "arrow.maxRecordsPerBatch": "0"}, "option arrow.maxRecordsPerBatch"),
    ({**BASE, "subscribe": " , "}, "option subscribe"),
    ({"kafka.bootstrap.servers": "b:1", "subscribePattern": "(unclosed"},
     "option subscribePattern"),
    ({"kafka.bootstrap.servers": "b:1", "subscribePattern": "a{4294967296}"},
     "option subscribePattern"),
    ({"subscribe": "t"}, "kafka.bootstrap.servers"),
    ({"kafka.bootstrap.servers": "  ", "subscribe": "t"}, "kafka.bootstrap.servers"),
    ({**BASE, "eventTime.assigner": "no_colon"}, "option eventTime.assigner"),
    ({**BASE, "watermark.punctuation": "no_colon"}, "option watermark.punctuation"),
])
def test_malformed_values_name_the_option(raw, named):
    assert named in option_error(raw)


@pytest.mark.parametrize("extra", [
    {"assign": '{"t": [0]}'},
    {"subscribePattern": "e.*"},
])
def test_conflicting_subscriptions(extra):
    message = option_error({**BASE, **extra})
    for name in ("subscribe", "subscribePattern", "assign"):
        assert f"'{name}'" in message


def test_missing_subscription_names_all_three_ways():
    message = option_error({"kafka.bootstrap.servers": "b:1"})
    for name in ("subscribe", "subscribePattern", "assign"):
        assert f"'{name}'" in message


@pytest.mark.parametrize("value", ["0", "-5", "ten", "1.5"])
def test_max_offsets_per_trigger_must_be_a_positive_number(value):
    assert "option maxOffsetsPerTrigger" in option_error({**BASE, "maxOffsetsPerTrigger": value})


def test_min_offsets_above_max_offsets_names_both():
    message = option_error({**BASE, "minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "10"})
    assert "minOffsetsPerTrigger" in message and "maxOffsetsPerTrigger" in message


def test_equal_min_and_max_offsets_are_fine():
    options = parse(minOffsetsPerTrigger="10", maxOffsetsPerTrigger="10")
    assert (options.min_offsets_per_trigger, options.max_offsets_per_trigger) == (10, 10)


@pytest.mark.parametrize("key", [
    "kafka.auto.offset.reset", "kafka.enable.auto.commit", "kafka.key.deserializer",
    "kafka.value.deserializer", "kafka.interceptor.classes",
    "kafka.enable.partition.eof", "kafka.ssl.engine.factory.class", "kafka.AUTO.OFFSET.RESET",
])
def test_rejected_kafka_keys_name_the_option(key):
    message = option_error({**BASE, key: "x"})
    assert f"option kafka.{key[len('kafka.'):]} is not supported" in message


def test_kafka_group_id_is_accepted_and_kept_out_of_the_pass_through():
    options = parse(**{"kafka.group.id": "g1", "kafka.client.id": "c1"})
    assert options.group_id == "g1"
    assert options.kafka_conf == (("client.id", "c1"),)


def test_punctuated_needs_a_punctuation_predicate():
    assert "watermark.punctuation" in option_error({**BASE, "watermark.strategy": "punctuated"})
    options = parse(**{"watermark.strategy": "punctuated", "watermark.punctuation": "m:f"})
    assert options.watermark.punctuation == "m:f"


@pytest.mark.parametrize("value_format", [None, "binary", "string"])
def test_event_time_field_needs_a_structured_value_format(value_format):
    raw = {**BASE, "eventTime.field": "payload.ts"}
    if value_format:
        raw["value.format"] = value_format
    assert "eventTime.field" in option_error(raw)


def test_event_time_field_and_assigner_conflict():
    message = option_error({**BASE, "value.format": "json", "eventTime.field": "ts",
                            "eventTime.assigner": "m:f"})
    assert "eventTime.field" in message and "eventTime.assigner" in message


@pytest.mark.parametrize("name, value", [
    ("endingOffsets", "latest"),
    ("endingOffsetsByTimestamp", '{"t": {"0": 1}}'),
    ("endingTimestamp", "1000"),
])
def test_ending_offsets_on_a_streaming_query(name, value):
    assert name in option_error({**BASE, name: value}, streaming=True)


@pytest.mark.parametrize("name, value", [
    ("maxOffsetsPerTrigger", "10"),
    ("minOffsetsPerTrigger", "10"),
    ("maxTriggerDelay", "1 minute"),
])
def test_trigger_options_on_a_batch_query(name, value):
    assert f"option {name}" in option_error({**BASE, name: value}, streaming=False)


@pytest.mark.parametrize("raw, named", [
    ({"startingOffsets": "latest"}, "option startingOffsets"),
    ({"startingOffsets": '{"t": {"0": -1}}'}, "option startingOffsets"),
    ({"endingOffsets": "earliest"}, "option endingOffsets"),
    ({"endingOffsets": '{"t": {"0": -2}}'}, "option endingOffsets"),
])
def test_batch_offset_bounds_that_would_read_nothing(raw, named):
    assert named in option_error({**BASE, **raw}, streaming=False)


def test_secrets_are_redacted():
    assert is_secret("kafka.sasl.password")
    assert is_secret("value.schema.registry.basic.auth.user.info")
    assert not is_secret("kafka.bootstrap.servers")
    assert redact({"kafka.sasl.password": "hunter2", "subscribe": "t"}) == {
        "kafka.sasl.password": "***", "subscribe": "t"}


# -- fuzz --------------------------------------------------------------------------------

OPTION_NAMES = (list(SPARK_KAFKA_OPTIONS) + list(KWATERMARK_OPTIONS) + [
    "kafka.bootstrap.servers", "kafka.group.id", "kafka.auto.offset.reset",
    "kafka.sasl.jaas.config", "value.json.schema", "value.avro.schema",
    "value.schema.registry.url", "watermark.lagMs", "idle.quietMs",
])
INTERESTING_VALUES = [
    "", "0", "1", "-1", "10", "true", "false", "earliest", "latest", "5 seconds", "100ms",
    "interval 2 seconds", "bounded", "punctuated", "none", "monotonous", "timeout",
    "caught-up", "advance", "json", "avro", "binary", "m:f", "keep", "flag", "drop", "null",
    '{"t": [0, 1]}', '{"t": {"0": 5}}', '{"t": {"0": -2}}', "{", "[]", '{"t": {"x": 1}}',
    "a{4294967296}", "(", "9" * 400 + " seconds", "[" * 5000,
]
names = st.one_of(st.sampled_from(OPTION_NAMES),
                  st.sampled_from(OPTION_NAMES).map(str.upper),
                  st.text(max_size=20))
values = st.one_of(st.sampled_from(INTERESTING_VALUES), st.text(max_size=30))


@settings(deadline=None, max_examples=300)
@given(raw=st.dictionaries(names, values, max_size=8), with_base=st.booleans(),
       streaming=st.sampled_from([True, False, None]))
def test_fuzz_any_options_parse_or_raise_option_error(raw, with_base, streaming):
    options = {**BASE, **raw} if with_base else raw
    try:
        parsed = parse_options(options, streaming=streaming)
    except OptionError as exc:
        assert str(exc)
    else:
        assert isinstance(parsed, SourceOptions)
        assert parsed.bootstrap_servers



@pytest.mark.parametrize("typed, meant", [
    ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"),
    ("startingOffset", "startingOffsets"),
    ("watermark.maxOutOfOrderess", "watermark.maxOutOfOrderness"),
])
def test_unknown_option_as_spark_passes_it_suggests_the_documented_spelling(typed, meant):
    # Spark lower-cases option names before the source sees them (issue 14).
    message = option_error({**BASE, typed.lower(): "1"})
    assert (f"unknown option '{typed.lower()}' (as Spark passes it: option names reach the "
            f"source lower-cased); did you mean '{meant}'?") in message


def test_known_options_in_any_case_are_reported_in_their_documented_spelling():
    message = option_error({**BASE, "maxoffsetspertrigger": "0"})
    assert message.startswith("option maxOffsetsPerTrigger: must be >= 1")


def test_default_ledger_path_is_the_parsing_processes_temp_path_kept_when_pickled(
        monkeypatch, tmp_path):
    import pickle
    import tempfile

    options = parse_options(BASE)
    assert options.state_location == os.path.join(tempfile.gettempdir(), "kwatermark-ledger")
    # An executor with another temp directory unpickles the driver's path as it is.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert pickle.loads(pickle.dumps(options)).state_location == options.state_location


# -- watermark alignment (DESIGN §11) ----------------------------------------------------


def test_alignment_is_off_unless_max_drift_is_set():
    assert parse().alignment_max_drift_ms is None
    assert parse(**{"watermark.alignment.maxDrift": "5 minutes"}).alignment_max_drift_ms \
        == 300_000
    assert parse(**{"WATERMARK.ALIGNMENT.MAXDRIFT": "0"}).alignment_max_drift_ms == 0
    assert parse(streaming=None, **{"watermark.alignment.maxDrift": "1s"}
                 ).alignment_max_drift_ms == 1000


@pytest.mark.parametrize(("raw", "says"), [
    ({"watermark.alignment.maxDrift": "five minutes"}, "cannot parse duration"),
    ({"watermark.alignment.maxDrift": "-1 minute"}, "negative"),
    ({"watermark.alignment.maxDrift": "  "}, "empty"),
    ({"watermark.alignment.maxDrift": "1 minute", "watermark.strategy": "none"},
     "watermark.strategy is 'none'"),
])
def test_bad_alignment_options_name_the_option(raw, says):
    message = option_error({**BASE, **raw})
    assert "watermark.alignment.maxDrift" in message and says in message


def test_alignment_on_a_batch_query_is_refused():
    message = option_error({**BASE, "watermark.alignment.maxDrift": "1 minute"},
                           streaming=False)
    assert "watermark.alignment.maxDrift" in message and "streaming queries only" in message


def test_a_misspelt_alignment_option_is_unknown_with_a_suggestion():
    message = option_error({**BASE, "watermark.alignment.maxDrfit": "1 minute"})
    assert "did you mean 'watermark.alignment.maxDrift'" in message


# What Spark 4.3 hands the source for CREATE TABLE t USING kwatermark OPTIONS (...) (measured:
# lower-cased keys, every option again under "option.", plus the table's own properties).
TABLE_KEYS = {"provider": "kwatermark", "owner": "someone",
              "option.kafka.bootstrap.servers": "broker:9092", "option.subscribe": "events",
              "path": "file:/tmp/t", "location": "file:/tmp/t"}


def test_keys_spark_adds_for_a_catalog_table_are_not_user_options():
    assert parse_raw(TABLE_KEYS) == parse()
    with_option = {**TABLE_KEYS, "watermark.maxoutoforderness": "5 seconds",
                   "option.watermark.maxoutoforderness": "5 seconds"}
    assert parse_raw(with_option).watermark.max_out_of_orderness_ms == 5_000


def test_an_unknown_option_beside_the_table_keys_still_fails_naming_it():
    raw = {**BASE, **TABLE_KEYS, "watermark.maxoutofordernes": "5 seconds",
           "option.watermark.maxoutofordernes": "5 seconds"}
    message = option_error(raw)
    assert "unknown option 'watermark.maxoutofordernes'" in message
    assert "did you mean 'watermark.maxOutOfOrderness'?" in message


def test_table_keys_without_kwatermark_as_provider_are_the_users_and_fail():
    assert "unknown option 'owner'" in option_error({**BASE, "owner": "someone"})
    assert "unknown option 'provider'" in option_error({**BASE, "provider": "other"})


def test_an_option_copy_that_differs_from_its_option_is_not_sparks_and_fails():
    raw = {**BASE, "provider": "kwatermark", "option.subscribe": "other"}
    assert "unknown option 'option.subscribe'" in option_error(raw)


def test_no_options_at_all_explains_the_catalog_table_limit():
    message = option_error({})
    assert message.startswith("option kafka.bootstrap.servers is required")
    assert "PythonDataSourceV2.getTable" in message and "docs/sql.md" in message


def test_broker_connections_disable_nagle_as_kafkas_java_clients_unless_told_otherwise():
    told = parse_options({"kafka.bootstrap.servers": "a:1", "subscribe": "t",
                          "kafka.socket.nagle.disable": "false"})
    assert told.consumer_conf()["socket.nagle.disable"] == "false"
    default = parse_options({"kafka.bootstrap.servers": "a:1", "subscribe": "t"})
    assert default.consumer_conf()["socket.nagle.disable"] == "true"
