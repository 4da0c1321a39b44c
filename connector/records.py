"""A column-oriented block of Kafka records, as the reading loop collects them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa


@dataclass
class RecordBlock:
    """Records of one partition, in offset order, as parallel columns.

    ``timestamps_ms`` is Kafka's record timestamp (-1 when the record has none);
    ``value_decoded``/``key_decoded`` are filled by the serde step when a format is set.

    A block of several ranges (``reader.RangeColumns``: many small ranges read at once) has
    ``placed``: its topics, and each record's index into them and partition; ``topic`` and
    ``partition`` are then the first range's, and no per-record hook sees the block.
    """

    topic: str
    partition: int
    keys: list
    values: list
    offsets: np.ndarray
    timestamps_ms: np.ndarray
    timestamp_types: np.ndarray
    headers: list | None = None
    key_decoded: pa.Array | None = None
    value_decoded: pa.Array | None = None
    value_objects: list | None = None
    errors: list = field(default_factory=list)
    placed: tuple[list[str], np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    def python_lists(self) -> None:
        """Keys, values and headers as Python lists (the compiled engine fills them as Arrow
        arrays): for the per-record hooks and the decoders, which take lists."""
        if isinstance(self.keys, pa.Array):
            self.keys = self.keys.to_pylist()
            self.values = self.values.to_pylist()
            if self.headers is not None:
                self.headers = self.headers.to_pylist()

    def record(self, i: int) -> dict:
        """The dict a user assigner, predicate or generator receives for record ``i``."""
        self.python_lists()
        rec = {
            "key": self.keys[i], "value": self.values[i], "topic": self.topic,
            "partition": self.partition, "offset": int(self.offsets[i]),
            "timestamp": int(self.timestamps_ms[i]),
            "headers": self.headers[i] if self.headers is not None else None,
        }
        if self.value_decoded is not None:
            if self.value_objects is None:
                self.value_objects = self.value_decoded.to_pylist()
            rec["value_decoded"] = self.value_objects[i]
        return rec
