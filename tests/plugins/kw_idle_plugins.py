"""A user idle policy for the integration tests (must load inside Spark's Python workers)."""


class ExcludePartition:
    """Excludes the partition named by ``idle.excludePartition``; counts every other."""

    def __init__(self, options):
        self.excluded = int(options["idle.excludePartition"])

    def decide(self, partition, now_ms):
        return "exclude" if partition.partition == self.excluded else "count"
