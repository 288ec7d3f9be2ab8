"""Ships ``hostcb-legacy-import.pth`` next to the package in site-packages,
and builds the native tap engine ``hostcb._native._engine`` (optional).

The ``.pth`` file installs hostcb's import hook for
``jax.experimental.host_callback`` at interpreter start (see
``src/hostcb/import_hook.py``).

The native engine (``src/hostcb/_native``: XLA FFI handlers and a small
CPython/NumPy extension) compiles against the XLA FFI headers that jaxlib
ships (``jaxlib/include``, what ``jax.ffi.include_dir()`` returns) and
NumPy's headers, both found in the build environment.  It is optional: if
the headers are missing or the compiler fails, the install still succeeds
with a warning and hostcb uses XLA's Python callbacks
(``hostcb.engine.available()`` says why).  Everything else is in
``pyproject.toml``.
"""
import importlib.util
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

PTH = "hostcb-legacy-import.pth"
NATIVE = os.path.join("src", "hostcb", "_native")


class build_py_with_pth(build_py):
  def run(self):
    super().run()
    self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH),
                   preserve_mode=0)

  def get_outputs(self, include_bytecode=True):
    return super().get_outputs(include_bytecode) + [
        os.path.join(self.build_lib, PTH)]


def _ffi_include_dir():
  """jaxlib's FFI headers, without importing jax when possible."""
  spec = importlib.util.find_spec("jaxlib")
  if spec is not None and spec.submodule_search_locations:
    for root in spec.submodule_search_locations:
      inc = os.path.join(root, "include")
      if os.path.exists(os.path.join(inc, "xla", "ffi", "api", "ffi.h")):
        return inc
  import jax  # noqa: PLC0415  (fallback: the official way)
  return jax.ffi.include_dir()


def _warn(msg):
  print(f"WARNING: hostcb: {msg}; the native tap engine is not built and "
        "hostcb will use XLA's Python callbacks.", file=sys.stderr)


class build_ext_optional(build_ext):
  """Adds the jaxlib/NumPy include dirs at build time; never fails."""

  def build_extensions(self):
    # Always compile: the objects of a previous build (build/) may come from
    # the headers of another jaxlib, whose FFI API version XLA would refuse.
    self.force = True
    try:
      import numpy  # noqa: PLC0415
      includes = [_ffi_include_dir(), numpy.get_include()]
    except Exception as e:  # noqa: BLE001
      _warn(f"cannot find the XLA FFI or NumPy headers ({e})")
      return
    for ext in self.extensions:
      ext.include_dirs = [NATIVE, *ext.include_dirs]
      # -isystem: no warnings from the third-party headers.
      ext.extra_compile_args = [
          *ext.extra_compile_args,
          *(arg for inc in includes for arg in ("-isystem", inc))]
    super().build_extensions()

  def build_extension(self, ext):
    try:
      super().build_extension(ext)
    except Exception as e:  # noqa: BLE001  (compiler missing or failing)
      _warn(f"building {ext.name} failed ({e})")


engine = Extension(
    "hostcb._native._engine",
    sources=[os.path.join(NATIVE, f)
             for f in ("handlers.cc", "call.cc", "module.cc")],
    depends=[os.path.join(NATIVE, f)
             for f in ("queue.h", "engine.h", "pyarrays.h")],
    language="c++",
    extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden",
                        "-Wno-missing-field-initializers"],
    optional=True,
)

setup(cmdclass={"build_py": build_py_with_pth, "build_ext": build_ext_optional},
      ext_modules=[engine])
