"""A per-partition column of an offset (kwatermark.offset_layout, DESIGN §21) and its shortest
JSON form: absent, a scalar, a list, ``{"d": ...}`` differences, ``{"of": ..., "plus": k}``
another column plus a constant, ``{"else": v, "at": {...}}`` one value but for a few
partitions. :func:`encode` chooses the form, :func:`decode` reads it back.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cached_property

import numpy as np

from kwatermark.offsets import OffsetFormatError

_SEP = (",", ":")
SCALARS = (str, int, float, bool, type(None))
SCALAR_TYPES = frozenset(SCALARS)
INT_TYPES = frozenset((int, type(None)))


class _Omit:
    pass


OMIT = _Omit()   # encode: "leave the column out"; as a default, "there is none"

# Integers whose differences numpy computes exactly (int64); beyond, Python's ints do.
_NUMPY_SAFE = 2 ** 62
# Columns shorter than this stay Python lists: numpy's fixed cost per call is higher there.
_NUMPY_FROM = 64


class Column:
    """A column's values (one per partition, in partition order), their types, and, when
    every value is a Python int small enough, the same as an int64 array: the forms that
    compare whole columns (``of``/``plus``, differences, the most common value) are then
    computed by numpy, not by a Python loop over thousands of partitions per column."""

    def __init__(self, values: list):
        self.values = values
        self.kinds = set(map(type, values))
        self._ints: np.ndarray | None | bool = False   # False: not computed yet

    @property
    def ints(self) -> np.ndarray | None:
        if self._ints is False:
            self._ints = None
            if self.kinds == {int} and len(self.values) >= _NUMPY_FROM:
                low, high = min(self.values), max(self.values)
                if -_NUMPY_SAFE < low and high < _NUMPY_SAFE:
                    self._ints = np.array(self.values, dtype=np.int64)
        return self._ints

    @cached_property
    def masked(self) -> tuple[np.ndarray, np.ndarray] | None:
        """For a long enough column of ints and nulls (at least one int, all small
        enough): the ints as an int64 array (0 at each null) and where the nulls are."""
        if not self.kinds <= INT_TYPES or len(self.values) < _NUMPY_FROM:
            return None
        if self.ints is not None:
            return self.ints, np.zeros(len(self.values), dtype=bool)
        present = [v for v in self.values if v is not None]
        if not present or not -_NUMPY_SAFE < min(present) or not max(present) < _NUMPY_SAFE:
            return None
        nulls = np.array([v is None for v in self.values], dtype=bool)
        filled = np.zeros(len(self.values), dtype=np.int64)
        filled[~nulls] = present
        return filled, nulls

    @cached_property
    def uniform(self) -> bool:
        """Every partition has the same value (of the same type)."""
        return len(self.kinds) == 1 and self.values.count(self.values[0]) == len(self.values)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def shared_forms(col: Column, written: dict[str, Column]) -> list:
    """The forms of ``col`` that say nothing of its partitions, neither how many nor which:
    the one value every partition has, and each earlier column (``written``) it equals plus
    a constant. Topics whose columns share such a form can write it once for all of them
    (``"every"`` in kwatermark.offset_layout)."""
    column = col.values
    forms: list = []
    if col.uniform:
        forms.append(column[0] if col.kinds <= SCALAR_TYPES else {"all": column[0]})
    if col.kinds <= INT_TYPES:
        for other_name, other in written.items():
            plus = _constant_difference(col, other)
            if plus is not None:
                forms.append({"of": other_name, "plus": plus})
    return forms


def encode(col: Column, partitions: list[int], forms: list | None,
           default: object = OMIT) -> object:
    """The shortest form of ``col`` (see kwatermark.offset_layout); ``OMIT`` when every
    value is ``default``, the column's default (``OMIT``: it has none and is always
    written). ``forms``: its :func:`shared_forms` (None will do when ``col.uniform``).
    Deterministic in the values: a replayed batch writes the same bytes. Many partitions
    take the forms that are short by construction without measuring every candidate (this
    runs once per batch on the driver)."""
    column = col.values
    n = len(column)
    kinds = col.kinds
    scalar = kinds <= SCALAR_TYPES
    first = column[0]
    if col.uniform:
        if first == default and type(first) is type(default):
            return OMIT
        return first if scalar else {"all": first}
    candidates = list(forms)
    if candidates and n >= 32:
        return min(candidates, key=lambda c: (len(c["of"]), c["of"]))
    # (form, its JSON's length when known without writing it); the forms that are not the
    # column itself are made only for the one chosen, or to be measured
    sized: list[tuple[object, int | None]] = [(c, None) for c in candidates]
    common = None
    if scalar:
        common, count = _most_common(col)
        if count * 2 > n:
            if n >= 32 and (n - count) * 8 <= n:
                return _sparse(col, partitions, common)
            sized.append((_SPARSE, _sparse_length(col, partitions, common)))
    if kinds <= INT_TYPES:
        sized.append((_DELTAS, _deltas_length(col)))
    sized.append((column, _list_length(col)))
    # a form whose length is not known is made (once) and measured by writing it
    sized = [(form, known) if known is not None else (_made(form, col, partitions, common),
                                                      None) for form, known in sized]
    chosen = min(sized, key=lambda c: c[1] if c[1] is not None
                 else len(json.dumps(c[0], separators=_SEP)))[0]
    return _made(chosen, col, partitions, common)


_DELTAS = object()   # encode: the {"d": ...} form
_SPARSE = object()   # encode: the {"else": ..., "at": ...} form


def _sparse(col: Column, partitions: list[int], common: object) -> dict:
    return {"else": common, "at": _exceptions(col, partitions, common)}


def _made(form: object, col: Column, partitions: list[int], common: object) -> object:
    """The form itself for ``_DELTAS``/``_SPARSE``; any other form is one already."""
    if form is _DELTAS:
        return {"d": _deltas(col)}
    if form is _SPARSE:
        return _sparse(col, partitions, common)
    return form


# 10, 100, ... 10**18: an int64's decimal digits are 1 + how many of these it reaches
_POWERS = np.array([10 ** k for k in range(1, 19)], dtype=np.int64)


def _ints_length(ints: np.ndarray) -> int:
    """The characters of ``ints`` written as JSON numbers (no separators)."""
    digits = np.searchsorted(_POWERS, np.abs(ints), side="right").sum() + len(ints)
    return int(digits + np.count_nonzero(ints < 0))


def _list_length(col: Column) -> int | None:
    """``len(json.dumps(col.values))`` without writing it, for a column of ints and nulls
    numpy holds (``Column.masked``); None for any other column."""
    masked = col.masked
    if masked is None:
        return None
    ints, nulls = masked
    n = len(ints)
    return _ints_length(ints[~nulls]) + 4 * int(np.count_nonzero(nulls)) + (n - 1) + 2


def _sparse_length(col: Column, partitions: list[int], common: object) -> int | None:
    """``len(json.dumps(_sparse(col, partitions, common)))`` as :func:`_list_length`, for a
    column of ints and nulls whose most common value is an int or null."""
    masked = col.masked
    if masked is None or not (common is None or is_int(common)):
        return None
    ints, nulls = masked
    other = ~nulls if common is None else nulls | (ints != common)
    values = ints[other & ~nulls]
    keys = np.array(partitions, dtype=np.int64)[other]
    entries = len(keys)
    common_length = 4 if common is None else _ints_length(np.array([common], dtype=np.int64))
    # {"else":V,"at":{"p":x,...}}: each entry its quoted key, a colon, its value
    return (8 + common_length + 7 + _ints_length(keys) + 3 * entries + _ints_length(values)
            + 4 * (entries - len(values)) + max(0, entries - 1) + 2)


def _deltas_length(col: Column) -> int | None:
    """``len(json.dumps({"d": _deltas(col)}))`` as :func:`_list_length`: each int the
    difference from the previous int, the nulls kept."""
    masked = col.masked
    if masked is None:
        return None
    ints, nulls = masked
    n = len(ints)
    present = ints[~nulls]
    # within +-2**62 (Column.masked): a difference fits an int64
    return (6 + _ints_length(np.diff(present, prepend=0)) + 4 * int(np.count_nonzero(nulls))
            + (n - 1) + 2)


def _exceptions(col: Column, partitions: list[int], common: object) -> dict[str, object]:
    """``{"partition": value}`` where the column is not ``common``."""
    column = col.values
    ints = col.ints
    if ints is not None and is_int(common):
        return {str(partitions[i]): column[i] for i in np.flatnonzero(ints != common).tolist()}
    if len(col.kinds & {bool, int, float}) <= 1:   # Python's equality is JSON's here
        return {str(p): v for p, v in zip(partitions, column) if v != common}
    return {str(p): v for p, v in zip(partitions, column) if not _same(v, common)}


def _same(a: object, b: object) -> bool:
    """Equal as JSON values: 1, 1.0 and True are equal in Python, not in JSON."""
    return a == b and type(a) is type(b)


def _most_common(col: Column) -> tuple[object, int]:
    """The most common value of a column of scalars and how often it occurs (the first
    seen of the most common ones)."""
    ints = col.ints
    if ints is not None:
        _, first_at, counts = np.unique(ints, return_index=True, return_counts=True)
        top = counts.max()
        at = first_at[counts == top].min()   # the first seen, as Counter.most_common
        return col.values[at], int(top)
    column = col.values
    # Values told apart by type too (1, 1.0 and True are equal in Python, not in JSON).
    tokens = column if len(col.kinds - {type(None)}) <= 1 else [(type(v), v) for v in column]
    common, count = Counter(tokens).most_common(1)[0]
    return column[tokens.index(common)], count


def _deltas(col: Column) -> list:
    ints = col.ints
    if ints is not None:
        return np.diff(ints, prepend=0).tolist()
    out, last = [], 0
    for v in col.values:
        if v is None:
            out.append(None)
        else:
            out.append(v - last)
            last = v
    return out


def _constant_difference(col: Column, other: Column) -> int | None:
    column, values = col.values, other.values
    if not values or not is_int(column[0]) or not is_int(values[0]):
        return None   # a cheap first look: most columns are not
    if len(column) != len(values):
        return None
    a, b = col.masked, other.masked
    if a is not None and b is not None:
        (ints, nulls), (other_ints, other_nulls) = a, b
        if not np.array_equal(nulls, other_nulls):
            return None
        differences = (ints - other_ints)[~nulls]
        plus = int(differences[0])
        return plus if bool((differences == plus).all()) else None
    if type(None) not in col.kinds and type(None) not in other.kinds:
        plus = column[0] - values[0]
        try:
            same = all(type(o) is int and v - o == plus for v, o in zip(column, values))
        except TypeError:
            return None
        return plus if same else None
    plus = None
    for v, o in zip(column, values):
        if v is None or o is None:
            if v is not None or o is not None:
                return None
            continue
        if not is_int(v) or not is_int(o):
            return None
        if plus is None:
            plus = v - o
        elif v - o != plus:
            return None
    return plus


def decode(topic: str, name: str, encoded: object, partitions: list[int],
           values: dict[str, list]) -> list:
    """The values of a column written by :func:`encode` (``values``: the columns read
    before it, which ``of`` refers to)."""
    n = len(partitions)
    where = f"offset: topic {topic!r}: column {name!r}"
    if isinstance(encoded, list):
        if len(encoded) != n:
            raise OffsetFormatError(f"{where} has {len(encoded)} values for {n} partitions")
        return encoded
    if not isinstance(encoded, dict):
        return [encoded] * n
    if set(encoded) == {"all"}:
        return [encoded["all"]] * n
    if set(encoded) == {"d"}:
        deltas = encoded["d"]
        if not isinstance(deltas, list) or len(deltas) != n or not all(
                d is None or is_int(d) for d in deltas):
            raise OffsetFormatError(f"{where}: 'd' must be {n} integers or nulls")
        out, last = [], 0
        for d in deltas:
            if d is None:
                out.append(None)
            else:
                last += d
                out.append(last)
        return out
    if set(encoded) == {"of", "plus"}:
        other, plus = encoded["of"], encoded["plus"]
        if other not in values or not is_int(plus):
            raise OffsetFormatError(f"{where}: 'of' must name an earlier column and 'plus' be "
                                    f"an integer")
        if not all(v is None or is_int(v) for v in values[other]):
            raise OffsetFormatError(f"{where}: column {other!r} is not of integers")
        return [None if v is None else v + plus for v in values[other]]
    if set(encoded) == {"else", "at"} and isinstance(encoded["at"], dict):
        out = [encoded["else"]] * n
        index = {str(p): i for i, p in enumerate(partitions)}
        for key, value in encoded["at"].items():
            if key not in index:
                raise OffsetFormatError(f"{where}: partition {key!r} has no offset")
            out[index[key]] = value
        return out
    raise OffsetFormatError(f"{where}: cannot read {str(encoded)[:100]!r}")
