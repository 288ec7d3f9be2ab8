"""The ``hostcb`` command and what it runs: ``cli`` (the parser, also
``python -m hostcb``), ``demo``, ``legacy_runner`` (``hostcb run``),
``hlo_render`` (``hostcb hlo``) and ``info``.

The library never imports this package: the tools sit on top of it.
"""
