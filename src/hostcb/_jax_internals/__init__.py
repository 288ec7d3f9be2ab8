"""Every use of JAX internals (``jax._src``) in hostcb, and nothing else.

hostcb needs a few things that JAX does not expose publicly: defining a
primitive with an effect and its transformation rules, lowering it to XLA
custom calls, the context the lowering runs in (which devices, which
sharding), lowering per replica for ``xla_computation``, and the buffer
custom call of ``buffer_callback``.  They live in this package, one module
per concern, so that a JAX upgrade is fixed here:

* :mod:`.core`: effects, primitives, rule registries, ``jax.config`` knobs;
* :mod:`.frames`: JAX's stack-frame filter, and which tracers a breakpoint
  may capture;
* :mod:`.dispatch`: fast dispatch (executables without runtime tokens);
* :mod:`.token_removal`: a one-device executable's lone tap or call
  without the token that orders nothing;
* :mod:`.tap_threads`: the ``jax.config`` state of the threads where tap
  functions run (created on first need);
* :mod:`.token_arrays`: runtime tokens of multi-device executables as
  ``bool[0]`` arrays (the persistent compilation cache can write them);
* :mod:`.array_reads`: a hook after each host read of a ``jax.Array``;
* :mod:`.printing_computations`: computations that print, marked at
  lowering and noted at each dispatch, for their thread's next print
  (with :mod:`.array_reads`, the JAX-private half of
  :mod:`hostcb._engine.output_order`);
* :mod:`.host_arrays`: ``jax.Array`` s on the CPU made from host arrays;
* :mod:`.mesh_context`: hostcb's own computations outside a context mesh;
* :mod:`.custom_calls`: placement of callbacks and the custom calls they emit;
* :mod:`.keepalive`: objects that live as long as a compiled executable;
* :mod:`.partitioned`: per-shard taps in sharded ``jit`` (no gather);
* :mod:`.replicas`: per-replica lowering and shardings of ``xla_computation``;
* :mod:`.buffers`: the buffer custom call of ``buffer_callback``;
* :mod:`.effects_barrier`: ``jax.effects_barrier()`` that also waits for
  hostcb's callbacks;
* :mod:`.loop_hoisting`: taps and calls that stay in their loops when JAX
  moves loop-invariant work out of a differentiated loop;
* :mod:`.own_callbacks`: JAX's own callback functions and their effects,
  which hostcb's drop-ins take the place of;
* :mod:`.branch_masks`: the batching rules of ``cond`` and ``while``
  wrapped, so that ``hostcb.debug`` taps in a batched branch fire only for
  the elements that take it;
* :mod:`.patches`: the one list of what hostcb changed in this process
  (each change made on first need, never at import) and its undo;
* :mod:`.versions`: the error when a JAX lacks a symbol hostcb patches, or
  a private structure hostcb reads changed its shape.

Checked against jax 0.8.0 to 0.12.0.1 (:mod:`.versions` names the range;
``make test`` runs the test suite on 0.10.2, ``scripts/check_oldest_jax.sh``
on 0.8.0, ``scripts/check_newest_jax.sh`` on the newest JAX that pip
resolves, on Python 3.12 or newer).
"""

from hostcb._jax_internals.array_reads import after_host_reads
from hostcb._jax_internals.buffers import (
  ExecutionStage,
  buffer_callback_effect,
  emit_buffer_callback,
  emit_buffer_callback_everywhere,
  ffi_batching,
  lowers_without_devices,
  same_shape_and_dtype,
)
from hostcb._jax_internals.core import (
  Primitive,
  ShapedArray,
  apply_compiled,
  effect_orders_only,
  host_callback_effect,
  instantiate_zeros,
  is_symbolic_zero,
  is_tracer,
  is_undefined_primal,
  new_primitive,
  no_effects,
  not_mapped,
  register_batching,
  register_config_options,
  register_jvp,
  register_lowering,
  register_transpose,
  rematerialize_on_backward_pass,
  set_dispatch_hook,
  wait_at_process_barrier,
  wait_for_dispatched_computations,
  forget_dispatched_computations,
)
from hostcb._jax_internals.frames import include_frame, is_staging, tracer_kinds
from hostcb._jax_internals.dispatch import (
  declares_no_effect,
  drain_this_thread,
  fast_dispatch,
  note_ordered_lowered,
  fast_dispatch_used,
  local_devices,
  set_fast_dispatch,
)
from hostcb._jax_internals.printing_computations import (
  forget_print_outputs,
  forget_this_threads_print_outputs,
  note_awaited_lowered,
  this_threads_notes,
  wait_after_next_dispatch,
  wait_for_this_threads_computation,
)
from hostcb._jax_internals.tap_threads import running_tap_functions
from hostcb._jax_internals.custom_calls import (
  Placement,
  emit_custom_call,
  emit_host_callback,
  lowering_platform,
  lowering_platforms,
  runs_on_one_of_several_devices,
)
from hostcb._jax_internals.keepalive import (
  hold_weakly_in_jax_caches,
  keep_alive_with_executable,
)
from hostcb._jax_internals.partitioned import (
  emit_per_shard_custom_call,
  slice_bounds,
)
from hostcb._jax_internals.replicas import (
  HloPrintOptions,
  annotate_shardings,
  lower_for_replicas,
  staging_pmaps,
  tiled_sharding_text,
  to_xla_computation,
  xla_computation_from_proto,
)
from hostcb._jax_internals.host_arrays import (
  bound_cpu_array,
  cpu_array,
  cpu_arrays,
  host_array,
  host_array_of,
  prepare_cpu_arrays,
)
from hostcb._jax_internals.effects_barrier import (
  jax_effects_barrier,
  patch_effects_barrier,
)
from hostcb._jax_internals.loop_hoisting import (
  in_hoisting_pass,
  stay_in_loops,
)
from hostcb._jax_internals.own_callbacks import (
  is_jax_value,
  jax_callback_functions,
  jax_io_effect,
  jax_ordered_debug_effect,
)
from hostcb._jax_internals.patches import (
  ensure,
  install as install_patch,
  installed,
  is_installed,
  lock as patches_lock,
  record as record_patch,
  uninstall_all,
  when_first_needed,
)
from hostcb._jax_internals.versions import (
  JaxInternalChanged,
  MissingJaxInternal,
)
