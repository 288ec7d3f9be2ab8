"""hostcb's internal core: the primitives and their lowering, what the
front ends' callbacks take and give back (:mod:`.callback_types`), the
printing of taps, what the JAX-API drop-ins share (:mod:`.dropins`) and
the identity of host functions.  Private: its modules may change in any
release; the public API is what ``hostcb`` exports (``hostcb.__all__``)."""
