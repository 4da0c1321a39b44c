"""Entry point Spark discovers at start-up: ``format("kwatermark")`` with no register call.

Spark's discovery imports every ``pyspark_*`` module and, when one fails to import, answers
only ``DATA_SOURCE_NOT_FOUND``. So when kwatermark cannot load (a pyspark it does not support,
a broken install), this module still offers a ``kwatermark`` source whose every use raises
the reason: the installed pyspark, the supported versions and the import error (DESIGN §23).
"""

try:
    from kwatermark.source import KWatermarkDataSource as DefaultSource
except Exception as _exc:  # noqa: BLE001 - any failure must reach the user
    from kwatermark.sparkversion import load_failure

    _WHY = load_failure(_exc)
    try:
        from pyspark.sql.datasource import DataSource
    except ImportError:  # pyspark < 4.0: Spark does not discover Python sources at all
        raise ImportError(_WHY) from _exc

    class DefaultSource(DataSource):  # type: ignore[no-redef]
        """Stands in for kwatermark's source when it cannot load: says why on every use."""

        @classmethod
        def name(cls) -> str:
            return "kwatermark"

        def schema(self):
            raise ImportError(_WHY)

        def reader(self, schema):
            raise ImportError(_WHY)

        def streamReader(self, schema):
            raise ImportError(_WHY)

__all__ = ["DefaultSource"]
