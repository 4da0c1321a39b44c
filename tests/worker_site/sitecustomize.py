"""Spark's Python workers in the tests import pyspark from the installed package, not its zip.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every Python
worker's path. With a pip-installed pyspark that zip holds the same files as the package
beside it, but Python never caches bytecode for a zip: each worker compiles pyspark again,
2.4 CPU seconds on the CI machine against 0.7 from the package. Spark waits a fixed 10 s for
a driver-side worker (a query's streaming source runner) to connect back, and on two busy
cores (a 3-node Kafka starting, a second Spark beside the first) the compile alone took
longer: the query died INITIALIZING with "Python worker failed to connect back". So, for the
tests only (tests/conftest.py puts this directory on PYTHONPATH), a zip inside an installed
pyspark package moves behind the package's own directory; a Spark distribution's zips
(SPARK_HOME elsewhere) stay where Spark put them.
"""

import os
import sys


def _inside_installed_pyspark(entry: str) -> bool:
    """``<site>/pyspark/python/lib/<name>.zip`` with ``<site>`` on the path."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(entry)))
    return (entry.endswith(".zip") and os.path.basename(package) == "pyspark"
            and os.path.dirname(package) in sys.path)


for _entry in [p for p in sys.path if _inside_installed_pyspark(p)]:
    sys.path.remove(_entry)
    sys.path.append(_entry)
