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
