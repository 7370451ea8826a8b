"""Batch: a token budget per step; GBS = tokens / seq_length, rounded so every DP rank runs whole microbatches and
the pipeline is never starved (at least PP microbatches per rank; a multiple of PP with interleaving)."""

from __future__ import annotations

from ..catalog import ModelSpec
from ..catalog.history import history_of
from ..core.layout import ParallelLayout
from ..core.plan import Reason
from ..errors import LcmoeError

SOURCE = ("megatron-core 0.19.2 num_microbatches_calculator (GBS % (MBS·DP)); Megatron-Bridge skill "
          "nemo-mbridge-perf-moe-long-context rule 6 (GBS shrinks as seq_length grows)")
INTERLEAVED_SOURCE = "megatron-core 0.19.2 pipeline_parallel/schedules.py (interleaving: microbatches a multiple of PP)"
DEFAULT_SOURCE = ("lcmoe_recipes default where the base model's batch is not published: ~8.4M tokens (2^23) per "
                  "step above 100B parameters, ~4.2M (2^22) below (docs/guide.md)")


EVAL_ITERS = 32
"""Evaluation batches per evaluation (``validation.eval_iters``), megatron-bridge 0.6.2's pre-training template's."""
UPSTREAM_EVAL_TOKENS = EVAL_ITERS * 32 * 4096
"""Tokens per evaluation in megatron-bridge 0.6.2's pre-training template: eval_iters 32 x GBS 32 x seq_length 4,096
(``recipes/common.py`` ``_pretrain_common``)."""
EVAL_SOURCE = ("megatron-bridge 0.6.2 recipes/common.py _pretrain_common (eval_iters 32, GBS 32, seq_length 4096) and "
               "training/eval.py (eval_global_batch_size independent of the training GBS)")


def tokens_per_step(spec: ModelSpec, total_params: float, wish: int | None = None) -> tuple[int, Reason]:
    """Tokens per optimizer step for an extension phase: the request's, else the base model's pre-training batch
    where published (DeepSeek-V3: 15,360 x 4K = 63M, kept in both its extension phases), else our default.

    Raises:
        LcmoeError: a wish that is not a positive number of tokens.
    """
    if wish is not None:
        if wish <= 0:
            raise LcmoeError(f"`tokens_per_step` {wish} is not a positive number of tokens", "e.g. tokens_per_step=8388608",
                             fields=("tokens_per_step",))
        return wish, Reason(f"{wish / 1e6:.1f}M tokens per step, as requested", "your request")
    history = history_of(spec.published_id)
    if history.tokens_per_step:
        return history.tokens_per_step, Reason(
            f"{history.tokens_per_step / 1e6:.1f}M tokens per step: the base model's pre-training batch, which its "
            "extension phases kept", history.source)
    tokens = 2**23 if total_params > 100e9 else 2**22
    return tokens, Reason(f"{tokens / 1e6:.1f}M tokens per step ({total_params / 1e9:.0f}B parameters)", DEFAULT_SOURCE)


def batch_size(seq_length: int, layout: ParallelLayout, mbs: int, tokens: int, wish: int | None = None) -> int:
    """The GBS of :func:`choose_batch`, without its reason (the search prices thousands of layouts, and the reason's
    text costs more than the number).

    Raises:
        LcmoeError: ``tokens`` is less than one sequence of ``seq_length``.
    """
    if wish:
        return wish
    if tokens < seq_length:
        raise LcmoeError(f"`tokens_per_step` {tokens:,} is less than one sequence of seq_length {seq_length:,}",
                         f"use at least {seq_length} (one sequence per step); extension phases use millions, e.g. "
                         "tokens_per_step=8388608", fields=("tokens_per_step",))
    wanted, step, floor = _rounding(seq_length, layout, mbs, tokens)
    return max(floor, -(-wanted // step) * step)


def _rounding(seq_length: int, layout: ParallelLayout, mbs: int, tokens: int) -> tuple[int, int, int]:
    """(sequences the token budget asks for, the multiple the GBS rounds up to -- MBS·DP, times PP with
    interleaving --, the least GBS that keeps every pipeline stage busy, MBS·DP·PP)."""
    return max(1, round(tokens / seq_length)), mbs * layout.dp * (layout.pp if layout.vpp else 1), \
        mbs * layout.dp * layout.pp


def choose_batch(seq_length: int, layout: ParallelLayout, mbs: int, tokens: int,
                 wish: int | None = None) -> tuple[int, Reason]:
    """(GBS, reason): ``tokens`` / seq_length samples, rounded up to a multiple of MBS·DP (and of MBS·DP·PP with
    interleaving), and at least MBS·DP·PP so every pipeline rank has work in flight. ``wish`` is a fixed GBS.

    Raises:
        LcmoeError: ``tokens`` is less than one sequence of ``seq_length``.
    """
    if wish:
        return wish, Reason(f"GBS {wish}, as requested", "your request")
    gbs = batch_size(seq_length, layout, mbs, tokens)
    wanted, step, floor = _rounding(seq_length, layout, mbs, tokens)
    micro = gbs // (mbs * layout.dp)
    note = ""
    if gbs > wanted:
        note = (f"; raised from {wanted} so that " + (f"each of the PP={layout.pp} stages has a microbatch in flight"
                                                      if gbs == floor else f"it is a multiple of {step}"))
    return gbs, Reason(f"GBS {gbs} x {seq_length:,} tokens = {gbs * seq_length / 1e6:.1f}M tokens per step (budget "
                       f"{tokens / 1e6:.1f}M): {micro} microbatch{'es' if micro != 1 else ''} of MBS {mbs} per DP rank "
                       f"(DP={layout.dp}, PP={layout.pp}{f', VPP={layout.vpp}' if layout.vpp else ''}){note}",
                  SOURCE + (f"; {INTERLEAVED_SOURCE}" if layout.vpp else ""))


def choose_eval_batch(seq_length: int, layout: ParallelLayout, mbs: int, eval_iters: int,
                      train_gbs: int) -> tuple[int, Reason]:
    """(``validation.eval_global_batch_size``, reason): :data:`UPSTREAM_EVAL_TOKENS` per evaluation over
    ``eval_iters`` batches, in the fewest sequences that are whole microbatches on every DP rank with every pipeline
    stage busy (:func:`choose_batch`'s rounding)."""
    iters = max(1, eval_iters)
    gbs = batch_size(seq_length, layout, mbs, max(seq_length, UPSTREAM_EVAL_TOKENS // iters))
    tokens = gbs * seq_length * iters
    return gbs, Reason(
        f"evaluation batch of {gbs} sequences x {iters} batches = {tokens / 1e6:.1f}M tokens per evaluation "
        f"(megatron-bridge's pre-training template evaluates {UPSTREAM_EVAL_TOKENS / 1e6:.1f}M: 32 x 32 x 4,096; the "
        f"training batch of {train_gbs} x {seq_length:,} would evaluate {train_gbs * seq_length * iters / 1e9:.1f}B); "
        "at least MBS x DP x PP sequences so every pipeline stage works", EVAL_SOURCE)

