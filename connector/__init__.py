"""kwatermark: Spark's Kafka source with per-partition event-time watermarks.

>>> df = spark.readStream.format("kwatermark").option("subscribe", "events")  # doctest: +SKIP
"""

from kwatermark.sparkversion import require_supported

# On a pyspark kwatermark does not run on, say so here (installed version, supported range)
# rather than let Spark's discovery answer DATA_SOURCE_NOT_FOUND (DESIGN §23).
require_supported()

from kwatermark.errors import (
    BrokerError,
    DataLossError,
    DecodeError,
    KWatermarkError,
    OptionError,
    PluginError,
)
from kwatermark.idle import IdlePolicy, PartitionView
from kwatermark.watermarks import WatermarkGenerator

__version__ = "0.1.0"

__all__ = [
    "BrokerError", "DataLossError", "DecodeError", "IdlePolicy", "KWatermarkError",
    "OptionError", "PartitionView", "PluginError", "WatermarkGenerator", "__version__",
]
