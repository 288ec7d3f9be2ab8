"""hostcb's internal core: the primitives and their lowering, the
named-function signatures, the printing of taps, the pieces that
the front ends share, and the multi-process barrier.  Private: its
modules may change in any release; the public API is what
``hostcb`` exports (``hostcb.__all__``)."""
