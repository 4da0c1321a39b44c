"""Which pyspark is installed, and whether kwatermark runs on it (DESIGN §23).

Read from the imported pyspark where there is one, else from the package metadata without
importing pyspark, so ``import kwatermark`` stays light and can say why it cannot run before
Spark's discovery hides the reason behind ``DATA_SOURCE_NOT_FOUND``.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

# The pyspark versions kwatermark runs on (pyproject's dependency says the same).
SUPPORTED = "pyspark 4.0 or later, below 5 (pyspark>=4.0,<5)"
LOWEST = (4, 0, 0)
BELOW = (5, 0, 0)


def version_tuple(text: str) -> tuple[int, int, int]:
    """``"4.1.4"`` -> ``(4, 1, 4)``; a suffix (``4.2.0.dev1``, ``4.1.0rc2``) is ignored."""
    numbers = [int(n) for n in re.findall(r"\d+", text)[:3]]
    return tuple(numbers + [0] * (3 - len(numbers)))  # type: ignore[return-value]


def installed() -> str | None:
    """The running pyspark's version, or None when there is none.

    Where pyspark is already imported — always in Spark's Python workers and in the process
    that plans a Python stream — its own ``__version__`` says which one runs. Those processes
    import it from Spark's ``pyspark.zip``, which has no package metadata: a Spark
    distribution's executors may have no pip-installed pyspark to find, or another version,
    and the lookup walked every archive on the path (~0.08 s of CPU at each query's start,
    in the process that plans the stream)."""
    version = getattr(sys.modules.get("pyspark"), "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return None


def unsupported_reason(version: str | None) -> str | None:
    """Why kwatermark cannot run with pyspark ``version`` (None: it can)."""
    if version is None:
        return (f"kwatermark needs pyspark, and none is installed in {sys.prefix}; it "
                f"supports {SUPPORTED}")
    if not LOWEST <= version_tuple(version) < BELOW:
        why = (" (Python streaming data sources came with Spark 4.0)"
               if version_tuple(version) < LOWEST else "")
        return (f"kwatermark does not run on the installed pyspark {version}{why}; it "
                f"supports {SUPPORTED}")
    return None


def require_supported() -> None:
    """Raise ImportError naming the installed pyspark and the supported versions."""
    reason = unsupported_reason(installed())
    if reason is not None:
        raise ImportError(reason)


def load_failure(exc: BaseException) -> str:
    """The message for a source that could not be imported: the cause, the installed
    pyspark and the supported versions (docs/operations.md, "Troubleshooting")."""
    version = installed()
    reason = unsupported_reason(version)
    if reason is not None:
        return f"{reason} (importing it failed with {type(exc).__name__}: {exc})"
    return (f"kwatermark could not load its Spark source on pyspark {version} (Python "
            f"{sys.version.split()[0]}): {type(exc).__name__}: {exc}. kwatermark supports "
            f"{SUPPORTED}; see docs/operations.md, \"Troubleshooting\"")
