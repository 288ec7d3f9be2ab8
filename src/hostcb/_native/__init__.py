"""hostcb's native tap engine (C++), built as ``hostcb._native._engine``.

See :mod:`hostcb.engine` for the Python side and ``handlers.cc``,
``queue.h`` and ``module.cc`` here for the design.
"""
