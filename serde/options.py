"""The serde options of one role (``key`` or ``value``), looked up case-insensitively."""

from __future__ import annotations

from collections.abc import Mapping

from kwatermark.options import is_secret  # one list of credential markers for all options

from .base import SerdeError

ROLES = ("key", "value")


class RoleOptions:
    """The ``{role}.*`` options of a source, with the role prefix kept in every name.

    Spark option names are case-insensitive and may arrive in any case, so
    ``value.avro.readerSchema`` and ``VALUE.AVRO.READERSCHEMA`` are the same option.

    >>> opts = RoleOptions("value", {"Value.Format": "JSON"})
    >>> opts.get("format"), opts.name("format")
    ('JSON', 'value.format')
    """

    def __init__(self, role: str, options: Mapping[str, str]):
        if role not in ROLES:
            raise SerdeError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        self.role = role
        self._options = {str(k).lower(): v for k, v in options.items()}

    def name(self, suffix: str) -> str:
        """The full option name as documented, e.g. ``value.avro.readerSchema``."""
        return f"{self.role}.{suffix}"

    def get(self, suffix: str, default: str | None = None) -> str | None:
        value = self._options.get(self.name(suffix).lower())
        if value is None or (isinstance(value, str) and not value.strip()):
            return default
        return value

    def require(self, suffix: str, fmt: str, what: str = "") -> str:
        """``get(suffix)``, or a SerdeError naming the option that ``{role}.format=fmt`` needs
        (``what`` describes it, e.g. " (the writer's Avro schema JSON)")."""
        value = self.get(suffix)
        if value is None:
            raise SerdeError(f"{self.name(suffix)}{what} is required when "
                             f"{self.name('format')} is {fmt}")
        return value

    def with_prefix(self, suffix_prefix: str) -> dict[str, str]:
        """Options under ``{role}.{suffix_prefix}``, keyed by the rest of their lower-cased name."""
        prefix = self.name(suffix_prefix).lower()
        return {k[len(prefix):]: v for k, v in self._options.items() if k.startswith(prefix)}

    def secrets(self) -> list[str]:
        """Values of every credential-like option of this role, for scrubbing messages."""
        prefix = f"{self.role}."
        return [
            str(v)
            for k, v in self._options.items()
            if k.startswith(prefix) and is_secret(k) and v
        ]


def scrub(message: str, secrets: list[str]) -> str:
    """``message`` with every secret value (and each half of a ``user:password``) masked."""
    for secret in secrets:
        for part in (secret, *secret.split(":", 1)[1:]):
            if len(part) >= 3:
                message = message.replace(part, "***")
    return message
