"""What a scenario gets: the API under test and a recording context."""

from __future__ import annotations

import logging
import threading

from jax_diff.values import exc_text, fmt, see

#: JAX's loggers of failed callbacks (hostcb logs its failures there too).
LOGGERS = ("jax._src.callback", "jax._src.debugging")

IMPLS = ("jax", "hostcb", "installed")


class Api:
  """The functions under test, by the names of JAX's:

  * ``jax``: JAX's own (``jax.debug.print``, ``jax.debug.callback``,
    ``jax.experimental.io_callback``, ``jax.pure_callback``);
  * ``hostcb``: hostcb's (``hostcb.debug.print``, ``hostcb.debug.callback``,
    ``hostcb.io_callback``, ``hostcb.pure_callback``);
  * ``installed``: JAX's public names after
    ``hostcb.install(jax_callbacks=True)``, which must then be hostcb's.

  ``effects_barrier`` is ``jax.effects_barrier`` in each, looked up when
  called: the first program that binds one of hostcb's callbacks makes it
  wait for hostcb's callbacks too (importing hostcb changes nothing), so
  the function held before then is JAX's.
  """

  def __init__(self, impl: str):
    import jax
    import jax.experimental

    self.impl = impl
    if impl == "hostcb":
      import hostcb

      self.debug_print = hostcb.debug.print
      self.debug_callback = hostcb.debug.callback
      self.io_callback = hostcb.io_callback
      self.pure_callback = hostcb.pure_callback
    else:
      if impl == "installed":
        import hostcb

        hostcb.install(jax_callbacks=True)
      from jax.experimental import io_callback

      self.debug_print = jax.debug.print
      self.debug_callback = jax.debug.callback
      self.io_callback = io_callback
      self.pure_callback = jax.pure_callback
      if impl == "installed":
        wrong = [
          n
          for n, ours in [
            ("debug_print", hostcb.debug.jax_print),
            ("debug_callback", hostcb.debug.jax_callback),
            ("io_callback", hostcb.io_callback),
            ("pure_callback", hostcb.pure_callback),
          ]
          if getattr(self, n) is not ours
        ]
        if wrong:
          raise RuntimeError(
            f"hostcb.install(jax_callbacks=True) did not replace JAX's {wrong}"
          )

  @staticmethod
  def effects_barrier():
    import jax

    return jax.effects_barrier()


class Context:
  """Records a scenario's output in order, thread-safely; it is the
  scenario's ``sys.stdout`` and gets what JAX's callback loggers log."""

  def __init__(self, api: Api):
    self.api = api
    self._parts: list[str] = []
    self._lock = threading.Lock()

  # -- sys.stdout
  def write(self, s: str) -> int:
    with self._lock:
      self._parts.append(s)
    return len(s)

  def flush(self) -> None:
    """Nothing to flush."""

  def text(self) -> str:
    with self._lock:
      return "".join(self._parts)

  # -- recording
  def log(self, *parts) -> None:
    """Appends one line made of ``parts`` (strings as they are)."""
    self.write(" ".join(str(p) for p in parts) + "\n")

  def recorder(self, name: str, result=None):
    """A callback that logs ``name(<what it received>)`` and returns
    ``result(*args, **kwargs)`` (``None`` when ``result`` is ``None``)."""

    def callback(*args, **kwargs):
      shown = [see(a) for a in args]
      shown += [f"{k}={see(v)}" for k, v in kwargs.items()]
      self.log(f"{name}(" + ", ".join(shown) + ")")
      return None if result is None else result(*args, **kwargs)

    return callback

  def barrier(self) -> None:
    """``api.effects_barrier()``; logs what it raises."""
    try:
      self.api.effects_barrier()
    except Exception as e:  # noqa: BLE001  (the output records it)
      self.log("barrier raised", exc_text(e))

  def show(self, label: str, value) -> None:
    """Waits for the callbacks so far (:meth:`barrier`), then logs
    ``label: <value>``."""
    self.barrier()
    self.log(f"{label}:", fmt(value))

  def attempt(self, label: str, thunk) -> None:
    """Runs ``thunk()``; logs ``label: <value>`` after a barrier, or what
    it raised (and lets the scenario go on)."""
    try:
      value = thunk()
    except Exception as e:  # noqa: BLE001
      self.log(f"{label} raised", exc_text(e))
      return
    self.show(label, value)


class LogRecorder(logging.Handler):
  """Writes what JAX's callback loggers log to the current context:
  ``log <logger> <LEVEL>: <message> [<exception>]``."""

  def __init__(self):
    super().__init__(logging.INFO)
    self.ctx: Context | None = None

  def emit(self, record: logging.LogRecord) -> None:
    ctx = self.ctx
    if ctx is None:
      return
    line = f"log {record.name} {record.levelname}: {record.getMessage()}"
    if record.exc_info and record.exc_info[1] is not None:
      line += f" [{exc_text(record.exc_info[1])}]"
    ctx.log(line)

  @classmethod
  def attach(cls) -> "LogRecorder":
    handler = cls()
    for name in LOGGERS:
      logger = logging.getLogger(name)
      logger.addHandler(handler)
      logger.setLevel(logging.INFO)
      logger.propagate = False
    return handler
