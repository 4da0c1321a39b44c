"""Entry point Spark discovers at start-up: ``format("kwatermark")`` with no register call."""

from kwatermark.source import KWatermarkDataSource as DefaultSource

__all__ = ["DefaultSource"]
