"""Loading user code named ``"package.module:Name"`` (generators, assigners, policies)."""

from __future__ import annotations

import importlib

from kwatermark.errors import OptionError, PluginError


def load_object(reference: str, option: str) -> object:
    """Import ``"package.module:Name"``; the error names the option and the reference.

    >>> load_object("json:dumps", "eventTime.assigner")  # doctest: +ELLIPSIS
    <function dumps at ...>
    """
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise OptionError(f"option {option}: expected 'package.module:Name', got {reference!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an ImportError or anything the module raises at import
        raise PluginError(
            f"option {option}: cannot import module {module_name!r} for {reference!r} "
            f"({type(exc).__name__}: {exc}); it must be importable on the driver and in "
            f"Spark's Python workers (PYTHONPATH)") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise PluginError(f"option {option}: module {module_name!r} has no attribute "
                          f"{attribute!r}") from None


class PluginOptions(dict):
    """The ``watermark.*`` / ``idle.*`` options a user class receives. Spark lower-cases option
    names, so look-ups here ignore case: ``options["idle.quietMs"]`` works."""

    def __init__(self, items=()):
        super().__init__((str(k).lower(), v) for k, v in dict(items).items())

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())

    def get(self, key: str, default=None):
        return super().get(key.lower(), default)
