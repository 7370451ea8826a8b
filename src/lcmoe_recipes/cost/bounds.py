"""Lower bounds of a plan's predicted step time (:func:`lcmoe_recipes.cost.estimate_step`) over the knobs the search
chooses per layout -- recompute, optimizer offload, CUDA graphs -- so that the search can skip a layout whose bound
is already slower than every plan it must keep (:mod:`lcmoe_recipes.planner.search`).

Why they are bounds, term by term of ``estimate_step`` (cost/step.py)::

    step = (microbatches + bubble) · t_mb + exposed DP + offload
    t_mb = max over PP ranks of  GEMM + attention + TP + max(0, CP - attention) + EP + PP   (one microbatch)

* recompute only adds FLOPs to GEMM and attention, and attention + max(0, CP - attention) = max(attention, CP)
  never falls when attention grows: every rank's t_mb is smallest without recompute; exposed DP and offload are
  never negative. The EP all-to-all overlap only hides EP time (each quarter exposed at most in full:
  :func:`~lcmoe_recipes.cost.overlap.contended`), so a plan with it on where megatron-core allows it (the search's
  base) has the smaller t_mb of the two. With ``tp_comm_overlap`` a layer's exposed TP falls as its GEMMs grow, but
  by at most the GEMM time recompute adds to that layer (:meth:`~lcmoe_recipes.cost.step.StepTerms.tp_exposed`), so
  the microbatch still never gets shorter with recompute. The search turns ``tp_comm_overlap`` off where the step
  model prices it no faster, and with it on a layer whose TP traffic is small beside its GEMMs can be slower than
  with it off (the SMs the transfers hold cost the GEMMs more than the traffic takes:
  :func:`~lcmoe_recipes.cost.overlap.tp_overlap_exposed`), so the bound takes the faster of the two. So
  (microbatches + bubble) · t_mb of the plan *without recompute*, with the overlap on or off, whichever is faster, is a
  bound (:func:`step_lower_bound`; it prices the communication exactly).
* cheaper, for ordering and skipping layouts before their knobs and checks are worked out: the same without any
  communication (never negative either), from per-rank FLOPs cached per (model, seq_length, PP, VPP), with the
  attention FLOPs at the kernel's best published throughput (no call runs faster, whatever CP exchange the
  search picks later) (:func:`compute_lower_bound`).

And one bound of its predicted peak memory (:func:`lcmoe_recipes.cost.estimate_memory`), whatever its knobs, CP
and batch: the parameters and gradients of the most loaded rank (:func:`memory_lower_bound`).

``tests/test_search.py`` checks every bound against ``estimate_step`` / ``estimate_memory`` of the plans the search
builds.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..catalog import get_hardware, get_model
from ..catalog.kernels import best_attention_tflops
from ..catalog.models import GDN
from ..core.layout import ParallelLayout
from ..core.pipeline import pipeline_stage_layers
from ..core.plan import Plan
from .attention import BACKWARD_FLOPS
from .efficiency import constant
from .memory import rank_memory
from .shapes import shapes
from .step import (_gdn_seconds, _layer_flops, _rank_kinds, microbatch_seconds, step_constants, step_terms,
                   with_cp_exchange)


@lru_cache(maxsize=1024)
def _rank_flops(model_key: str, seq_length: int, pp: int, vpp: int, mtp: int) -> tuple[tuple[float, float, int], ...]:
    """Per PP rank, without recompute: (FLOPs per token timed at the GEMM rate, FLOPs per token timed at the
    attention rate, gated-DeltaNet layers), split as ``estimate_step`` times them -- decoder layers' linear FLOPs,
    and on the last rank the output layer and the MTP layers (whole), at the GEMM rate; softmax attention at the
    attention rate (model FLOPs: 3 x forward); gated DeltaNet by its sequential scan."""
    s = shapes(get_model(model_key))
    stages = tuple(pipeline_stage_layers(s.num_layers, pp * vpp, mtp))  # the search's even split
    out = []
    for r in range(pp):
        gemm, attention, gdn = 0.0, 0.0, 0
        for (_, kind), layer, count in _rank_kinds(model_key, stages, pp, vpp, r):
            linear, attn = _layer_flops(s, layer, seq_length)
            gemm += count * linear
            if kind != GDN:
                attention += count * attn
            else:
                gdn += count
        if r == pp - 1:
            gemm += 6 * s.embedding + mtp * (sum(_layer_flops(s, s.num_layers - 1, seq_length))
                                             + 6 * (2 * s.h * s.h + s.embedding))
        out.append((gemm, attention, gdn))
    return tuple(out)


def compute_lower_bound(model_key: str, hw_key: str, precision: str, seq_length: int, mtp_num_layers: int,
                        micro_batch_size: int, layout: ParallelLayout, num_microbatches: int,
                        table: tuple[tuple[tuple[str, str], float], ...] | None = None) -> float:
    """Seconds per step, at most ``estimate_step`` of any plan of ``layout`` with these values (whatever its
    recompute, offload and CUDA graphs): the slowest PP rank's compute for one microbatch without recompute and
    without communication, times microbatches plus the pipeline bubble. Needs no Plan, no communication model
    and no checks. ``table``: constants in place of the fitted ones, as sorted (key, value) pairs (hashable)."""
    slowest = _slowest_compute(model_key, hw_key, precision, seq_length, mtp_num_layers, micro_batch_size,
                               layout.tp * layout.cp, layout.pp, layout.vpp or 1, table)
    return (num_microbatches + (layout.pp - 1) / (layout.vpp or 1)) * slowest


@lru_cache(maxsize=16384)
def _slowest_compute(model_key: str, hw_key: str, precision: str, seq_length: int, mtp_num_layers: int,
                     micro_batch_size: int, tp_cp: int, pp: int, vpp: int, table=None) -> float:
    """The slowest PP rank's compute for one microbatch (the bound's per-microbatch term): the same for every
    layout that differs only in EP, so priced once."""
    hw = get_hardware(hw_key)
    model = get_model(model_key)
    s = shapes(model)
    constants = dict(table) if table else None
    gemm_rate = hw.peak(precision) * 1e12 * constant(hw.key, precision, constants).value
    # attention model FLOPs are 3 x forward; the kernels run forward + 2.5 x forward at no more than their best
    best = best_attention_tflops(hw.key, (s.d_qk + s.d_v) / 2)
    attn_rate = 3 * best * 1e12 * constant(hw.key, "attention", constants).value / (1 + BACKWARD_FLOPS)
    share = micro_batch_size * seq_length / tp_cp
    gdn_step = _gdn_seconds(micro_batch_size, seq_length, constant(hw.key, "gdn_step", constants).value)
    return max(share * (gemm / gemm_rate + attention / attn_rate) + gdn * gdn_step
               for gemm, attention, gdn in _rank_flops(model.key, seq_length, pp, vpp, mtp_num_layers))


def step_lower_bound(plan: Plan, table: dict[tuple[str, str], float] | None = None,
                     exchange: tuple[str, tuple[int, ...]] | None = None, keep_recompute: bool = False) -> float:
    """Seconds per step, at most ``estimate_step`` of ``plan`` with any recompute, offload and CUDA graphs: the
    microbatch time of ``plan`` without recompute (compute and exposed TP / CP / EP / PP communication of its
    slowest rank), times microbatches plus the pipeline bubble. ``exchange``: another CP exchange
    (``cp_comm_type``, ``hierarchical_cp_sizes``) the plan may run instead; the bound is then the smaller of the two
    (the second priced from the first's once-per-step terms: :func:`~lcmoe_recipes.cost.step.with_cp_exchange`).
    With ``tp_comm_overlap`` on, each exchange is priced with it on and off and the faster kept (module doc).
    ``keep_recompute``: at ``plan``'s own recompute instead of none -- a bound over offload, CUDA graphs, the CP
    exchange and the TP overlap of plans with that recompute (the search prices a rung of the memory ladder with it
    before working the rung's other knobs out)."""
    bare = plan if keep_recompute or plan.recompute_granularity is None else plan.with_changes(
        recompute_granularity=None, recompute_modules=(), recompute_method=None, recompute_num_layers=None)
    lay = plan.layout
    terms = step_terms(bare)
    options = [(bare, terms)]
    if exchange is not None:
        other = bare.with_changes(cp_comm_type=exchange[0], hierarchical_cp_sizes=exchange[1])
        options.append((other, with_cp_exchange(terms, other)))
    if terms.tp_on and _tp_overlap_can_lose(terms, step_constants(bare, table)[0].value):
        # the search keeps tp_comm_overlap only where it pays: the bound takes the faster of on and off
        options += [(p, replace(t, tp_on=False)) for p, t in options]
    micro = min(microbatch_seconds(p, table, t) for p, t in options)
    return (plan.num_microbatches + (lay.pp - 1) / (lay.vpp or 1)) * micro


def _tp_overlap_can_lose(terms, gemm_eff: float) -> bool:
    """Whether some layer's TP traffic is exposed longer with ``tp_comm_overlap`` on than off (its GEMMs lose more
    to the SMs the transfers hold than the traffic takes: :func:`~lcmoe_recipes.cost.overlap.tp_overlap_exposed`);
    where none is, the overlap never makes a microbatch slower and pricing it off cannot lower the bound."""
    rate, share = terms.peak * gemm_eff, terms.tp_sm_share
    return any(dense / rate * share > c for w in terms.ranks for c, dense, _ in w.tp_layers)


def memory_lower_bound(plan: Plan) -> float:
    """Bytes, at most ``estimate_memory(plan).total`` for ``plan`` with any recompute, offload, CUDA graphs, CP and
    batch: the parameters and gradients of its middle PP rank (the most loaded rank holds at least as much
    memory). They depend only on the model, its TP / EP / ETP / PP / VPP split, MTP and the gradient dtype, so a
    caller may reuse the value across plans that share those."""
    m = rank_memory(plan, plan.layout.pp // 2)
    return m.parameters + m.gradients
