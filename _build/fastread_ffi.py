"""cffi (API mode) build of ``kwatermark._fastread``, the compiled read path (DESIGN §19;
docs/operations.md, "Read engines"). setup.py names it in ``cffi_modules``.

The extension is ``optional``: where no C compiler (or no Python headers) exists, setuptools
warns and the install goes on with the pure-Python engine. librdkafka is not linked here: the
C code dlopen()s the one the confluent-kafka wheel ships, at import (csrc/fastread.h).
"""

from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent
HEADER = (ROOT / "csrc" / "fastread.h").read_text()

ffi = FFI()
# The header without its preprocessor lines, which cdef() does not take.
ffi.cdef("\n".join(line for line in HEADER.splitlines() if not line.startswith("#"))
         .replace("#define", "") + """
#define KW_DRAINED 0
#define KW_FULL 1
#define KW_EVENT 2
#define KW_FAILED 3
extern "Python+C" void kw_log_py(int level, const char *fac, const char *name,
                                 const char *buf);
""")
ffi.set_source(
    "kwatermark._fastread",
    '#include "fastread.h"',
    sources=["csrc/fastread.c"],   # relative to setup.py, as setuptools wants
    include_dirs=["csrc"],
    libraries=["dl"],
    extra_compile_args=["-O2"],
    optional=True,
)

if __name__ == "__main__":
    ffi.compile(verbose=True)
