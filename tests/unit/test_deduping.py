"""A bucket of deduplicated keys (kwatermark.deduping) decides every row as one
KeyFirsts per key would, releases every first the watermark makes final (timer or not), and
keeps each chunk's wake-up exact, so the timer never misses a release."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kwatermark.deduping import BucketFirsts, DictChunks, FirstsIndex
from kwatermark.joining import KeyFirsts

# (batch, key, event time, row watermark or None) for up to 6 micro-batches; 5 keys over 3
# chunks, so chunks hold several keys and some keys share nothing.
rows_strategy = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4), st.integers(1, 30),
                                   st.one_of(st.none(), st.integers(0, 30))), max_size=40)


@settings(max_examples=1000, deadline=None)
@given(st.integers(0, 8), rows_strategy,
       st.lists(st.integers(0, 6), min_size=7, max_size=7), st.lists(st.booleans(), min_size=6,
                                                                     max_size=6))
def test_a_bucket_decides_as_one_keyfirsts_per_key(within, raw, steps, fires):
    rows = sorted(raw, key=lambda r: r[0])
    marks, mark = [], 0
    for step in steps:                  # Spark's watermark per batch start, never going down
        mark += step
        marks.append(mark)
    store = DictChunks()
    bucket = BucketFirsts(FirstsIndex(), store)
    per_key: dict[int, KeyFirsts] = {}
    for batch in range(6):
        watermark = marks[batch]
        if fires[batch]:                # a timer firing before this batch's rows (or not)
            bucket.fire(within, watermark)
        batch_rows = [(k % 3, (k,), t, m) for b, k, t, m in rows if b == batch]
        got = bucket.apply(within, batch_rows, watermark)
        want: list = [None] * len(batch_rows)       # each key's rows of the batch at once
        for k in {key for _, (key,), _, _ in batch_rows}:
            at = [n for n, (_, (key,), _, _) in enumerate(batch_rows) if key == k]
            kinds = per_key.setdefault(k, KeyFirsts()).apply(
                within, [batch_rows[n][2:] for n in at], watermark)
            for n, kind in zip(at, kinds):
                want[n] = kind
        assert got == want
        # Each chunk's wake-up is its earliest held first + within; no chunk is empty.
        for chunk, firsts in store.chunks.items():
            assert firsts and bucket.index.wakes[chunk] == \
                min(min(ts) for ts in firsts.values()) + within
        assert set(bucket.index.wakes) == set(store.chunks)
    bucket.fire(within, marks[6])
    for k, held in per_key.items():
        held.expire(within, marks[6])
        stored = store.chunks.get(k % 3, {}).get((k,), [])
        assert sorted(stored) == sorted(held.firsts)        # released exactly as per key
    assert all(wake > marks[6] for wake in bucket.index.wakes.values())


def test_a_checkpoint_with_another_chunk_count_is_refused_with_what_to_do():
    """A key's chunk is its hash modulo the chunk count: read with another count, its firsts
    would not be found and its duplicates would come out again."""
    import pickle

    import pytest

    from kwatermark.dedup import CHUNKS, LAYOUT, DedupProcessor
    from kwatermark.joining import JoinError

    class Stored:
        def __init__(self, value):
            self.value = value

        def get(self):
            return self.value

    processor = DedupProcessor(1_000, ["key"], ["key"], ["key", "kind"], CHUNKS)
    processor.index = Stored((LAYOUT, pickle.dumps((CHUNKS, {0: 5}))))
    assert processor._load().wakes == {0: 5}
    processor.index = Stored((LAYOUT, pickle.dumps((CHUNKS + 1, {0: 5}))))
    with pytest.raises(JoinError, match="new checkpoint"):
        processor._load()
    processor.index = Stored((LAYOUT + 1, b""))
    with pytest.raises(JoinError, match=f"layout {LAYOUT + 1}"):
        processor._load()
