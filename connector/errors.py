"""One exception family; every message names the option, topic, partition or offset at fault."""


class KWatermarkError(Exception):
    """Base class of every error kwatermark raises on purpose."""


class OptionError(KWatermarkError, ValueError):
    """An option is missing, unknown, malformed or conflicts with another."""


class DataLossError(KWatermarkError):
    """Records that were planned or expected are gone (retention, deleted topic, truncation).

    Raised only while ``failOnDataLoss`` is true; otherwise the loss is logged as a warning.
    """


class BrokerError(KWatermarkError):
    """The brokers in ``kafka.bootstrap.servers`` did not answer within the configured time."""


class PluginError(KWatermarkError):
    """A user generator, assigner or idle policy could not be loaded or misbehaved."""


class DecodeError(KWatermarkError):
    """A record's key or value could not be decoded (``value.onError=fail``)."""
