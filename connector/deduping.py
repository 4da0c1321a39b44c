"""Deduplication state for a bucket of keys, as pure values (DESIGN §16): what
:mod:`kwatermark.dedup` keeps per grouping key of Spark's state store when many keys share one
(a bucket, as :mod:`kwatermark.windows` does), so a micro-batch costs a processor call per
bucket rather than per key, and a state read and write per touched chunk rather than per key.

A bucket's keys are spread over chunks (the key's hash, computed by Spark); a chunk is one
``{key: [first event time, ...]}`` dict in a :class:`ChunkStore`. The bucket's
:class:`FirstsIndex` (one small value) knows each chunk's earliest release, so a watermark
touches only the chunks that have something to release. The per-key decision is
:class:`kwatermark.joining.KeyFirsts`'s, unchanged.

>>> store = DictChunks()
>>> bucket = BucketFirsts(FirstsIndex(), store)
>>> bucket.apply(1_000, [(0, ("a",), 5_000, None), (0, ("a",), 5_200, 4_000),
...                      (1, ("b",), 5_100, None)], watermark=0)
['first', None, 'first']
>>> bucket.index.wakes, bucket.index.wake_up()
({0: 6000, 1: 6100}, 6000)
>>> bucket.fire(1_000, 6_000); bucket.index.wakes, store.chunks
({1: 6100}, {1: {('b',): [5100]}})
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kwatermark.joining import KeyFirsts


class ChunkStore:
    """Where a bucket's chunks live (Spark's map state in :mod:`kwatermark.dedup`)."""

    def get(self, chunk: int) -> dict:
        raise NotImplementedError

    def put(self, chunk: int, firsts: dict) -> None:
        raise NotImplementedError

    def remove(self, chunk: int) -> None:
        raise NotImplementedError


class DictChunks(ChunkStore):
    """Chunks in a dict (tests, doctests)."""

    def __init__(self):
        self.chunks: dict[int, dict] = {}

    def get(self, chunk: int) -> dict:
        return {k: list(v) for k, v in self.chunks.get(chunk, {}).items()}

    def put(self, chunk: int, firsts: dict) -> None:
        self.chunks[chunk] = {k: list(v) for k, v in firsts.items()}

    def remove(self, chunk: int) -> None:
        self.chunks.pop(chunk, None)


@dataclass
class FirstsIndex:
    """Per chunk that holds firsts, the lowest watermark at which one of them is released."""

    wakes: dict[int, int] = field(default_factory=dict)

    def wake_up(self) -> int | None:
        return min(self.wakes.values(), default=None)


@dataclass
class BucketFirsts:
    index: FirstsIndex
    store: ChunkStore

    def apply(self, within_ms: int, rows: Iterable[tuple[int, tuple, int | None, int | None]],
              watermark: int) -> list[str | None]:
        """Rows ``(chunk, key, event time, row watermark)`` in arrival order; per row
        ``first``, ``late`` or None (a duplicate), as :meth:`KeyFirsts.apply` decides for its
        key. Every chunk read is also released up to ``watermark``."""
        rows = list(rows)
        by_key: dict[tuple, list[int]] = {}
        for n, (chunk, key, _, _) in enumerate(rows):
            by_key.setdefault((chunk, key), []).append(n)
        chunks: dict[int, dict] = {}
        kinds: list[str | None] = [None] * len(rows)
        for (chunk, key), positions in by_key.items():
            firsts = chunks.get(chunk)
            if firsts is None:
                firsts = chunks[chunk] = self.store.get(chunk) if chunk in self.index.wakes \
                    else {}
            held = KeyFirsts(firsts.get(key, []))
            got = held.apply(within_ms, [rows[n][2:] for n in positions], watermark)
            for n, kind in zip(positions, got):
                kinds[n] = kind
            if held.firsts:
                firsts[key] = held.firsts
            else:
                firsts.pop(key, None)
        for chunk, firsts in chunks.items():
            self._store(chunk, _released(firsts, within_ms, watermark), within_ms)
        return kinds

    def fire(self, within_ms: int, watermark: int) -> None:
        """Release, in every chunk due at ``watermark``, the firsts it makes final."""
        for chunk in [c for c, wake in self.index.wakes.items() if wake <= watermark]:
            self._store(chunk, _released(self.store.get(chunk), within_ms, watermark),
                        within_ms)

    def _store(self, chunk: int, firsts: dict, within_ms: int) -> None:
        if firsts:
            self.store.put(chunk, firsts)
            self.index.wakes[chunk] = min(min(ts) for ts in firsts.values()) + within_ms
        else:
            if chunk in self.index.wakes:
                self.store.remove(chunk)
            self.index.wakes.pop(chunk, None)


def _released(firsts: dict, within_ms: int, watermark: int) -> dict:
    """The chunk without the firsts ``watermark`` releases (:meth:`KeyFirsts.expire`)."""
    kept = {}
    for key, ts in firsts.items():
        alive = [f for f in ts if f + within_ms > watermark]
        if alive:
            kept[key] = alive
    return kept
