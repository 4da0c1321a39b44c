"""Which partitions a subscription covers (``KafkaMetadata.coverage``), given the topics the
brokers list: Spark's consumer strategies, with the broker's answer stood in for."""

from __future__ import annotations

from kwatermark.broker import KafkaMetadata
from kwatermark.options import parse_options

LISTED = {"orders-ct": 2, "orders-lat": 1, "orders-ct-x": 1, "other": 3,
          "__consumer_offsets": 50, "__transaction_state": 50}


class Listed(KafkaMetadata):
    def topics(self, ahead=None) -> dict[str, int]:
        return dict(LISTED)

    def _refuse_unauthorized(self, topics: list[str]) -> None:
        pass


def coverage(**choice: str):
    options = parse_options({"kafka.bootstrap.servers": "b:1", **choice})
    return Listed(options).coverage(options.subscription)


def test_a_pattern_covers_every_topic_it_is_found_in_but_internal_ones():
    assert coverage(subscribePattern="orders-(ct|lat)") == (
        [("orders-ct", 0), ("orders-ct", 1), ("orders-ct-x", 0), ("orders-lat", 0)], [])
    assert coverage(subscribePattern="^orders-(ct|lat)$")[0] == [
        ("orders-ct", 0), ("orders-ct", 1), ("orders-lat", 0)]
    assert coverage(subscribePattern=".*")[0] == [
        ("orders-ct", 0), ("orders-ct", 1), ("orders-ct-x", 0), ("orders-lat", 0),
        ("other", 0), ("other", 1), ("other", 2)]


def test_assign_covers_the_partitions_that_exist_and_names_the_others():
    assert coverage(assign='{"orders-ct": [1, 0, 5], "gone": [0]}') == (
        [("orders-ct", 0), ("orders-ct", 1)], [("gone", None), ("orders-ct", 5)])


def test_subscribe_names_a_topic_that_does_not_exist():
    assert coverage(subscribe="other,gone") == (
        [("other", 0), ("other", 1), ("other", 2)], [("gone", None)])
