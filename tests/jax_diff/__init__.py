"""The differential harness of hostcb's JAX callbacks against JAX's own.

Every scenario (``s_*.py``) is a small program that uses JAX's callback
functions through an API object; the runner (:mod:`jax_diff.runner`) runs
it, in the same environment (this JAX, 0.10.2), with JAX's own functions,
with hostcb's, and with JAX's names after
``hostcb.install(jax_callbacks=True)``; ``tests/test_jax_callbacks_diff.py``
compares what each run printed, what its callbacks received and how often,
what it returned, raised and logged.  See :mod:`jax_diff.registry`.

Working on scenarios: ``python tests/jax_diff/harness.py [IMPLS [NAMES]]``
runs them (all, or the comma-separated ``NAMES``) under the comma-separated
``IMPLS`` (default ``jax,hostcb``; ``installed`` is the third) and prints
each difference; ``HOSTCB_JAX_DIFF_MODULES=s_io,s_pure`` limits the run to
those modules, ``HOSTCB_TEST_DEVICES`` sets the number of CPU devices.
"""
