"""hostcb: JAX host callbacks that work.

The ``jax.experimental.host_callback`` API (``id_tap``, ``id_print``,
``call``, ``barrier_wait``), ``xla_computation`` and ``buffer_callback`` on
current JAX.  ``hostcb.install()`` makes legacy imports resolve to hostcb.

``hostcb.debug.print``, ``hostcb.debug.callback``, ``hostcb.io_callback`` and
``hostcb.pure_callback``: JAX's own callbacks, same signatures and behaviour,
on hostcb's engine; ``hostcb.install(jax_callbacks=True)`` puts them in place
of JAX's, ``hostcb.uninstall()`` puts JAX's back.

``hostcb.register(name, fn)``: host functions by name, so that programs
that call them can be exported (``jax.export`` with
``disabled_checks=hostcb.export_checks()``), cached and serialized, and run
in another process (``docs/export.md``).

``hostcb.progress``: tqdm progress bars for ``scan``, ``fori_loop`` and
``while_loop`` (imported on first use; needs ``pip install hostcb[progress]``).
``hostcb.metrics``: metrics from compiled loops to TensorBoard, W&B and
files (imported on first use).
"""

from hostcb import config
from hostcb import engine as engine
from hostcb.host_callback import (
  CallbackException,
  CallbackFlavor,
  TapFunctionException,
  barrier_wait,
  call,
  id_print,
  id_tap,
  stop_outfeed_receiver,
)
from hostcb.buffer_callback import (
  Buffer,
  ExecutionContext,
  ExecutionStage,
  buffer_callback,
)
from hostcb._import_hook import install, uninstall
from hostcb import debug
from hostcb.jax_callbacks import io_callback, pure_callback
from hostcb.xla_computation import XlaComputation, xla_computation
from hostcb.named import export_checks, register
from hostcb._import_hook import (
  install_jax_callbacks,
  jax_callbacks_installed,
  uninstall_jax_callbacks,
)
from hostcb._engine.distributed import get_timeout as get_barrier_timeout
from hostcb._engine.distributed import set_timeout as set_barrier_timeout
from hostcb._core.lowering import BUFFER_CALL_MIN_BYTES

# The one place that states hostcb's version: pyproject.toml reads it
# (``[tool.setuptools.dynamic]``), and ``hostcb info`` prints it.
__version__ = "0.3.0"


def __getattr__(name: str):
  # hostcb.progress (tqdm bars for compiled loops) and hostcb.metrics are
  # imported when first used: tqdm is an optional dependency, and the
  # metrics' writer is not needed by programs that do not log.  Without
  # tqdm, hostcb.progress does not exist (``hasattr(hostcb, "progress")``
  # is False): the AttributeError names the missing package, and ``import
  # hostcb.progress`` raises the ImportError itself.
  if name in ("progress", "metrics"):
    import importlib  # noqa: PLC0415  (tqdm only when used)

    try:
      return importlib.import_module(f"hostcb.{name}")
    except ImportError as e:
      raise AttributeError(
        f"module 'hostcb' has no attribute {name!r}: {e}"
      ) from e
  raise AttributeError(f"module 'hostcb' has no attribute {name!r}")


__all__ = [
  "id_tap",
  "id_print",
  "call",
  "barrier_wait",
  "stop_outfeed_receiver",
  "CallbackException",
  "TapFunctionException",
  "CallbackFlavor",
  "config",
  "install",
  "xla_computation",
  "XlaComputation",
  "buffer_callback",
  "Buffer",
  "ExecutionContext",
  "ExecutionStage",
  "debug",
  "io_callback",
  "pure_callback",
  "uninstall",
  "register",
  "export_checks",
  "install_jax_callbacks",
  "uninstall_jax_callbacks",
  "jax_callbacks_installed",
  "set_barrier_timeout",
  "get_barrier_timeout",
  "BUFFER_CALL_MIN_BYTES",
]
