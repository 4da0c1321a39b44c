"""setuptools, with editable installs in strict mode by default.

Spark discovers Python data sources with ``pkgutil.iter_modules()``, which sees only plain
``sys.path`` entries. setuptools' default editable mode serves our remapped layout
(``connector/`` -> ``kwatermark``) through an import hook that ``iter_modules()`` cannot see,
so ``format("kwatermark")`` would not resolve. Strict mode builds a link tree and adds it as a
plain path entry. ``--config-settings editable_mode=...`` still overrides this default.
"""

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    settings = dict(config_settings or {})
    settings.setdefault("editable_mode", "strict")
    return _setuptools.build_editable(wheel_directory, settings, metadata_directory)
