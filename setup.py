"""Ships ``hostcb-legacy-import.pth`` next to the package in site-packages,
and builds the native tap engine ``hostcb._native._engine`` (optional).

The ``.pth`` file installs hostcb's import hook for
``jax.experimental.host_callback`` at interpreter start (see
``src/hostcb/_import_hook.py``).

The native engine (``src/hostcb/_native``: XLA FFI handlers and a small
CPython/NumPy extension) compiles against the XLA FFI headers that jaxlib
ships (``jaxlib/include``, what ``jax.ffi.include_dir()`` returns) and
NumPy's headers.  ``pyproject.toml`` puts both in pip's isolated build
environment (a pinned jaxlib: the oldest that hostcb supports); with
``--no-build-isolation`` they come from the environment that builds.

The engine is optional: if the headers are missing or the compiler fails,
the install still succeeds, with a warning, and hostcb uses XLA's Python
callbacks.  The reason, one line, is then written into the built package as
``hostcb/_native/_build_failure.txt``, which
``hostcb._native.build_failure()`` reads at run time (pip hides the
warning).  A build that compiles nothing never ships an extension from an
earlier build: the extension's output is removed before compiling.  (An
in-place or editable build gets the extension when it compiles, and
records a failure in the build folder only.)  Everything else is in
``pyproject.toml``.

``HOSTCB_TEST_BUILD=1`` in the environment makes the test build of the
extension (``make install``, which ``make test`` uses): it adds the sources
of ``tests/native`` that the tests drive, a simulated CUDA driver
(``cuda_fake.cc``) and the functions that control it and inject faults
(``engine_testing.cc``), compiled with the macro ``HOSTCB_TEST_BUILD``.
Without it (wheels, ``pip install .``) the build is the production one,
which carries none of them.  A test build needs a clone: the sdist has no
``tests/``.
"""

import importlib.machinery
import importlib.util
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

PTH = "hostcb-legacy-import.pth"
NATIVE = os.path.join("src", "hostcb", "_native")
# The test build's sources (HOSTCB_TEST_BUILD=1): in the clone, not the
# package.
TEST_NATIVE = os.path.join("tests", "native")
TEST_SOURCES = ("cuda_fake.cc", "engine_testing.cc")
# Written next to the extension when it is not built; see build_failure()
# in src/hostcb/_native/__init__.py.
FAILURE_FILE = "_build_failure.txt"


class build_py_with_pth(build_py):
  """Copies the import hook's ``.pth`` file to the top of the build."""

  def run(self):
    super().run()
    self.copy_file(
      os.path.join("src", PTH),
      os.path.join(self.build_lib, PTH),
      preserve_mode=0,
    )

  def get_outputs(self, include_bytecode=True):
    return super().get_outputs(include_bytecode) + [
      os.path.join(self.build_lib, PTH)
    ]


def _ffi_include_dir():
  """jaxlib's FFI headers, found without importing jax when possible."""
  spec = importlib.util.find_spec("jaxlib")
  if spec is not None and spec.submodule_search_locations:
    for root in spec.submodule_search_locations:
      inc = os.path.join(root, "include")
      if os.path.exists(os.path.join(inc, "xla", "ffi", "api", "ffi.h")):
        return inc
  try:
    import jax  # noqa: PLC0415  (fallback: the official way)

    inc = jax.ffi.include_dir()
  except Exception as e:  # noqa: BLE001
    raise RuntimeError(
      "the XLA FFI headers (jaxlib/include/xla/ffi/api/ffi.h) are not in "
      f"the build environment: no jaxlib with them, and jax failed ({e})"
    ) from None
  if not os.path.exists(os.path.join(inc, "xla", "ffi", "api", "ffi.h")):
    raise RuntimeError(f"the XLA FFI headers are not in {inc}")
  return inc


def _numpy_include_dir():
  """NumPy's C headers of the build environment."""
  try:
    import numpy  # noqa: PLC0415
  except ImportError:
    raise RuntimeError(
      "NumPy's headers are not in the build environment (no numpy)"
    ) from None
  return numpy.get_include()


def _origin():
  """Which jaxlib and NumPy the headers come from, for the build log."""
  from importlib import metadata  # noqa: PLC0415

  found = []
  for dist in ("jaxlib", "numpy"):
    try:
      found.append(f"{dist} {metadata.version(dist)}")
    except metadata.PackageNotFoundError:
      found.append(f"{dist} (version unknown)")
  return " and ".join(found)


def _one_line(text):
  """``text`` with its whitespace runs (newlines too) made single spaces."""
  return " ".join(text.split())


def _warn(reason):
  print(
    f"WARNING: hostcb: {reason}; the native tap engine is not built and "
    "hostcb will use XLA's Python callbacks.",
    file=sys.stderr,
  )


class build_ext_optional(build_ext):
  """Adds the jaxlib/NumPy include dirs at build time and never fails.

  Before compiling it removes the extension left by any earlier build, so
  that a failed build ships no extension; it records why the extension was
  not built in :data:`FAILURE_FILE`, and removes that file when it was.
  """

  def build_extensions(self):
    # Always compile: the objects of a previous build (build/) may come from
    # the headers of another jaxlib, whose FFI API version XLA would refuse.
    self.force = True
    self._failure = None
    for ext in self.extensions:
      self._remove_outputs(ext)
    try:
      includes = [_ffi_include_dir(), _numpy_include_dir()]
    except RuntimeError as e:
      self._fail(f"cannot find the headers to build against: {e}")
    else:
      print(f"hostcb: building the native tap engine against {_origin()}")
      for ext in self.extensions:
        ext.include_dirs = [NATIVE, *ext.include_dirs]
        # -isystem: no warnings from the third-party headers.
        ext.extra_compile_args = [
          *ext.extra_compile_args,
          *(arg for inc in includes for arg in ("-isystem", inc)),
        ]
      super().build_extensions()
    for ext in self.extensions:
      self._write_failure_file(ext)

  def build_extension(self, ext):
    try:
      super().build_extension(ext)
      return
    except Exception as e:  # noqa: BLE001  (compiler missing or failing:
      error = e  # the pure-Python engine, with the reason below)
    self._remove_outputs(ext)  # no half-linked file either
    # The compiler's own messages are in the build log above; the reason
    # kept is setuptools' (which command failed, with which status).
    self._fail(
      f"compiling {ext.name} failed: "
      f"{_one_line(str(error))[:500] or type(error).__name__} "
      "(the compiler's messages are in the build log)"
    )

  def _fail(self, reason):
    """Warns now and keeps ``reason`` (one line) for the failure file."""
    reason = _one_line(reason)
    _warn(reason)
    self._failure = self._failure or reason

  def _remove_outputs(self, ext):
    """Removes ``ext``'s built file, under any extension-module suffix."""
    path = self.get_ext_fullpath(ext.name)
    folder = os.path.dirname(path)
    stem = ext.name.rsplit(".", 1)[-1]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
      stale = os.path.join(folder, stem + suffix)
      if os.path.exists(stale):
        os.remove(stale)

  def _write_failure_file(self, ext):
    """Writes the failure reason next to ``ext``'s output, or removes a
    failure file left by an earlier build when the extension is built."""
    path = os.path.join(
      os.path.dirname(self.get_ext_fullpath(ext.name)), FAILURE_FILE
    )
    if self._failure is None and os.path.exists(
      self.get_ext_fullpath(ext.name)
    ):
      if os.path.exists(path):
        os.remove(path)
      return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write((self._failure or f"{ext.name} was not built") + "\n")

  def get_outputs(self):
    outputs = super().get_outputs()
    for ext in self.extensions:
      path = os.path.join(
        os.path.dirname(self.get_ext_fullpath(ext.name)), FAILURE_FILE
      )
      if os.path.exists(path):
        outputs.append(path)
    return outputs


def _test_build():
  """Whether the environment asks for the test build (HOSTCB_TEST_BUILD=1);
  stops the build where it does but the test sources are missing."""
  value = os.environ.get("HOSTCB_TEST_BUILD", "")
  if value not in ("", "0", "1"):
    sys.exit(f"hostcb: HOSTCB_TEST_BUILD must be 0 or 1, not {value!r}")
  if value != "1":
    return False
  missing = [
    f for f in TEST_SOURCES if not os.path.exists(os.path.join(TEST_NATIVE, f))
  ]
  if missing:
    sys.exit(
      f"hostcb: HOSTCB_TEST_BUILD=1 needs {', '.join(missing)} in "
      f"{TEST_NATIVE}: build the test build from a clone, not an sdist"
    )
  print(
    "hostcb: the test build of the native engine (HOSTCB_TEST_BUILD=1)",
    file=sys.stderr,
  )
  return True


def _engine(test_build):
  """The extension ``hostcb._native._engine``; ``test_build``: with the
  test sources and the HOSTCB_TEST_BUILD macro."""
  sources = [
    os.path.join(NATIVE, f)
    for f in (
      "handlers.cc",
      "call.cc",
      "module.cc",
      "cuda.cc",
      "cuda_py.cc",
      "exit_guard.cc",
      "named.cc",
      "lifetimes.cc",
      "print_line.cc",
      "array_text.cc",
    )
  ]
  depends = [
    os.path.join(NATIVE, f)
    for f in ("queue.h", "engine.h", "entries.h", "pyarrays.h", "cuda_api.h")
  ]
  # NPY_TARGET_VERSION: the oldest NumPy C API the extension may use, so
  # that NumPy 2's headers build an extension that also runs on NumPy
  # 1.26 (the oldest that pyproject.toml admits), whatever newer NumPy
  # the build environment has.
  macros = [("NPY_TARGET_VERSION", "NPY_1_25_API_VERSION")]
  includes = []
  if test_build:
    sources += [os.path.join(TEST_NATIVE, f) for f in TEST_SOURCES]
    depends.append(os.path.join(TEST_NATIVE, "cuda_fake.h"))
    macros.append(("HOSTCB_TEST_BUILD", "1"))
    includes.append(TEST_NATIVE)
  return Extension(
    "hostcb._native._engine",
    sources=sources,
    depends=depends,
    language="c++",
    define_macros=macros,
    include_dirs=includes,
    extra_compile_args=[
      "-std=c++17",
      "-O2",
      "-fvisibility=hidden",
      "-Wno-missing-field-initializers",
    ],
    # The GPU back end loads the CUDA driver at run time (cuda_api.h):
    # nothing of CUDA is needed to build.
    libraries=["dl"],
    optional=True,
  )


setup(
  cmdclass={"build_py": build_py_with_pth, "build_ext": build_ext_optional},
  ext_modules=[_engine(_test_build())],
)
