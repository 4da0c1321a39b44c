"""Only the compiled read path's cffi module: everything else is in pyproject.toml.

The extension is optional (docs/operations.md, "Read engines"): where it cannot be compiled
(no C compiler, no Python headers) the install goes on with the Python read engine alone.
setuptools' own ``optional`` flag is not enough for editable installs, which then look for
the missing file, so a failed optional extension is dropped from the build's outputs here.
"""

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def build_extensions(self) -> None:
        built = []
        for ext in list(self.extensions):
            try:
                self.build_extension(ext)
                built.append(ext)
            except Exception as exc:   # compiler missing or failing: CCompilerError, OSError..
                if not getattr(ext, "optional", False):
                    raise
                self.warn(f"the optional extension {ext.name} was not built ({exc}); "
                          f"kwatermark reads with its Python engine")
        self.extensions = built


setup(cmdclass={"build_ext": OptionalBuildExt},
      cffi_modules=["_build/fastread_ffi.py:ffi"])
