"""What the running pyspark's Python Data Source API has (DESIGN §23).

pyspark 4.2 added admission control for Python stream readers: the module
``pyspark.sql.streaming.datasource`` (``ReadLimit``, ``ReadMaxRows``, ``ReadMinRows``,
``ReadAllAvailable``, ``SupportsTriggerAvailableNow``) and ``latestOffset(start, limit)``.
pyspark 4.0 and 4.1 call ``latestOffset()`` with no argument, pass no read limit and never
call ``prepareForTriggerAvailableNow``; there the source keeps its own start and read limits
(:mod:`kwatermark.source`). This module imports what the running Spark has and nothing else:
importing 4.2's module on 4.1 made Spark's discovery hide the source behind
``DATA_SOURCE_NOT_FOUND``.
"""

from __future__ import annotations

import pyspark

from kwatermark.sparkversion import version_tuple

# The first pyspark with admission control for Python stream readers.
ADMISSION_CONTROL_SINCE = "4.2.0"

VERSION = pyspark.__version__
VERSION_TUPLE = version_tuple(VERSION)

try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )

    ADMISSION_CONTROL = True
except ImportError:  # pyspark < 4.2: Spark never passes or asks for a read limit
    ADMISSION_CONTROL = False

    class ReadLimit:  # type: ignore[no-redef]
        """Stand-in for pyspark 4.2's ``ReadLimit`` (never built by Spark < 4.2)."""

    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        pass

    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        def __init__(self, max_rows: int):
            self.max_rows = max_rows

    class ReadMinRows(ReadLimit):  # type: ignore[no-redef]
        def __init__(self, min_rows: int, max_trigger_delay_ms: int | None = None):
            self.min_rows = min_rows
            self.max_trigger_delay_ms = max_trigger_delay_ms

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in mixin: Spark < 4.2 never calls ``prepareForTriggerAvailableNow``."""

