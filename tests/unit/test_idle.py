"""Idle-partition policies (DESIGN §5), decided from hand-made PartitionViews."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.errors import PluginError
from kwatermark.idle import (
    COUNT,
    EXCLUDE,
    AdvanceWhenCaughtUp,
    CaughtUp,
    NeverIdle,
    PartitionView,
    ProcessingTimeout,
    decide,
    make_policy,
)
from kwatermark.options import IdleConfig, parse_options

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
NOW = 1_700_000_000_000


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))


def view(unread: int = 0, silent_ms: int = 0, watermark_ms: int | None = 5000,
         idle: str = "count") -> PartitionView:
    return PartitionView(topic="events", partition=3, watermark_ms=watermark_ms,
                         max_event_time_ms=None if watermark_ms is None else watermark_ms + 1,
                         unread=unread, last_read_ms=NOW - silent_ms, idle=idle)


def idle_config(**raw: str) -> IdleConfig:
    return parse_options({"kafka.bootstrap.servers": "b:1", "subscribe": "t", **raw}).idle


def test_none_never_excludes():
    policy = make_policy(idle_config())
    assert isinstance(policy, NeverIdle)
    assert policy.decide(view(unread=0, silent_ms=10**9), NOW) == COUNT
    assert policy.decide(view(unread=0, silent_ms=10**9, watermark_ms=None), NOW) == COUNT


def test_timeout_excludes_after_the_timeout_backlog_or_not():
    policy = make_policy(idle_config(**{"idle.policy": "timeout", "idle.timeout": "30 seconds"}))
    assert isinstance(policy, ProcessingTimeout)
    assert policy.decide(view(unread=0, silent_ms=29_999), NOW) == COUNT
    assert policy.decide(view(unread=0, silent_ms=30_000), NOW) == EXCLUDE
    # Flink's flaw, on purpose: a starved partition with a backlog is called idle
    assert policy.decide(view(unread=5000, silent_ms=30_000), NOW) == EXCLUDE
    assert policy.decide(view(unread=5000, silent_ms=10), NOW) == COUNT


def test_caught_up_excludes_only_without_backlog():
    policy = make_policy(idle_config(**{"idle.policy": "caught-up", "idle.timeout": "10s"}))
    assert isinstance(policy, CaughtUp)
    assert policy.decide(view(unread=1, silent_ms=10**9), NOW) == COUNT
    assert policy.decide(view(unread=0, silent_ms=9_999), NOW) == COUNT
    assert policy.decide(view(unread=0, silent_ms=10_000), NOW) == EXCLUDE


@settings(deadline=None, max_examples=200)
@given(timeout=st.integers(0, 10**7), unread=st.integers(1, 10**9),
       silent=st.integers(-10**6, 10**12))
def test_caught_up_and_advance_never_act_while_unread(timeout, unread, silent):
    partition = view(unread=unread, silent_ms=silent)
    assert CaughtUp(timeout).decide(partition, NOW) == COUNT
    assert AdvanceWhenCaughtUp(timeout, 0).decide(partition, NOW) == COUNT


def test_advance_moves_a_caught_up_silent_partition_to_now_minus_max_delay():
    policy = make_policy(idle_config(**{"idle.policy": "advance", "idle.timeout": "1 minute",
                                        "idle.maxDelay": "5 seconds"}))
    assert isinstance(policy, AdvanceWhenCaughtUp)
    assert policy.decide(view(unread=0, silent_ms=60_000), NOW) == 1_699_999_995_000
    assert policy.decide(view(unread=0, silent_ms=59_999), NOW) == COUNT
    assert policy.decide(view(unread=3, silent_ms=10**9), NOW) == COUNT
    assert AdvanceWhenCaughtUp(0, 0).decide(view(), NOW) == NOW


# -- decide(): the answer is checked ------------------------------------------------------


class Answers:
    def __init__(self, answer):
        self.answer = answer

    def decide(self, partition, now_ms):
        return self.answer


class Raises:
    def decide(self, partition, now_ms):
        raise RuntimeError("boom")


@pytest.mark.parametrize("answer", ["count", "exclude", 0, -5, NOW])
def test_decide_passes_valid_answers_through(answer):
    assert decide(Answers(answer), view(), NOW) == answer


@pytest.mark.parametrize("answer", [None, "advance", "COUNT", "idle", "", 1.5, True, False,
                                    [1], {"exclude": True}])
def test_decide_rejects_nonsense_naming_the_class_and_partition(answer):
    with pytest.raises(PluginError) as info:
        decide(Answers(answer), view(), NOW)
    message = str(info.value)
    assert "Answers" in message
    assert "topic events partition 3" in message
    assert repr(answer) in message


def test_decide_wraps_a_raising_policy_with_its_class_name():
    with pytest.raises(PluginError) as info:
        decide(Raises(), view(), NOW)
    assert "Raises" in str(info.value)
    assert "boom" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


# -- user policies -----------------------------------------------------------------------


def test_custom_policy_gets_every_idle_option(plugins):
    config = idle_config(**{"idle.policy": "kw_test_plugins:QuietPolicy",
                            "idle.quietMs": "500", "idle.timeout": "1 second"})
    policy = make_policy(config)
    assert type(policy).__name__ == "QuietPolicy"
    # every idle.* option, looked up by its documented name (Spark may lower-case names)
    assert len(policy.options) == 3
    assert policy.options["idle.policy"] == "kw_test_plugins:QuietPolicy"
    assert policy.options["idle.quietMs"] == "500"
    assert policy.options["idle.timeout"] == "1 second"
    assert decide(policy, view(unread=0, silent_ms=500), NOW) == EXCLUDE
    assert decide(policy, view(unread=0, silent_ms=499), NOW) == COUNT
    assert decide(policy, view(unread=1, silent_ms=10**6), NOW) == COUNT


@pytest.mark.parametrize("reference, match", [
    ("kw_test_plugins:NoDecidePolicy", "no decide"),
    ("kw_test_plugins:QuietPolicy", "failed to construct"),   # idle.quietMs missing
    ("kw_test_plugins:Missing", "no attribute"),
    ("kw_no_such_module_anywhere:Policy", "cannot import"),
])
def test_bad_custom_policies_fail_naming_the_option(plugins, reference, match):
    with pytest.raises(PluginError, match=match) as info:
        make_policy(IdleConfig(policy=reference))
    assert "idle.policy" in str(info.value)
