"""Batch: a token budget per step; GBS = tokens / seq_length, rounded so every DP rank runs whole microbatches and
the pipeline is never starved (at least PP microbatches per rank; a multiple of PP with interleaving)."""

from __future__ import annotations

from ..catalog import ModelSpec
from ..catalog.history import history_of
from ..errors import LcmoeError
from ..layout import ParallelLayout
from ..plan import Reason

SOURCE = ("megatron-core 0.19.2 num_microbatches_calculator (GBS % (MBS·DP)); Megatron-Bridge skill "
          "nemo-mbridge-perf-moe-long-context rule 6 (GBS shrinks as seq_length grows)")
INTERLEAVED_SOURCE = "megatron-core 0.19.2 pipeline_parallel/schedules.py (interleaving: microbatches a multiple of PP)"
DEFAULT_SOURCE = ("lcmoe_recipes default where the base model's batch is not published: ~8.4M tokens (2^23) per "
                  "step above 100B parameters, ~4.2M (2^22) below (docs/guide.md)")


def tokens_per_step(spec: ModelSpec, total_params: float, wish: int | None = None) -> tuple[int, Reason]:
    """Tokens per optimizer step for an extension phase: the request's, else the base model's pre-training batch
    where published (DeepSeek-V3: 15,360 x 4K = 63M, kept in both its extension phases), else our default.

    Raises:
        LcmoeError: a wish that is not a positive number of tokens.
    """
    if wish is not None:
        if wish <= 0:
            raise LcmoeError(f"--tokens-per-step {wish} is not a positive number of tokens", "e.g. --tokens-per-step 8388608")
        return wish, Reason(f"{wish / 1e6:.1f}M tokens per step, as requested", "your request")
    history = history_of(spec.published_id)
    if history.tokens_per_step:
        return history.tokens_per_step, Reason(
            f"{history.tokens_per_step / 1e6:.1f}M tokens per step: the base model's pre-training batch, which its "
            "extension phases kept", history.source)
    tokens = 2**23 if total_params > 100e9 else 2**22
    return tokens, Reason(f"{tokens / 1e6:.1f}M tokens per step ({total_params / 1e9:.0f}B parameters)", DEFAULT_SOURCE)


def choose_batch(seq_length: int, layout: ParallelLayout, mbs: int, tokens: int,
                 wish: int | None = None) -> tuple[int, Reason]:
    """(GBS, reason): ``tokens`` / seq_length samples, rounded up to a multiple of MBS·DP (and of MBS·DP·PP with
    interleaving), and at least MBS·DP·PP so every pipeline rank has work in flight. ``wish`` is a fixed GBS.

    Raises:
        LcmoeError: ``tokens`` is less than one sequence of ``seq_length``.
    """
    if wish:
        return wish, Reason(f"GBS {wish}, as requested", "your request")
    if tokens < seq_length:
        raise LcmoeError(f"--tokens-per-step {tokens:,} is less than one sequence of seq_length {seq_length:,}",
                         f"use at least {seq_length} (one sequence per step); extension phases use millions, e.g. "
                         "--tokens-per-step 8388608")
    step = mbs * layout.dp * (layout.pp if layout.vpp else 1)
    floor = mbs * layout.dp * layout.pp
    wanted = max(1, round(tokens / seq_length))
    gbs = max(floor, -(-wanted // step) * step)
    micro = gbs // (mbs * layout.dp)
    note = ""
    if gbs > wanted:
        note = (f"; raised from {wanted} so that " + (f"each of the PP={layout.pp} stages has a microbatch in flight"
                                                      if gbs == floor else f"it is a multiple of {step}"))
    return gbs, Reason(f"GBS {gbs} x {seq_length:,} tokens = {gbs * seq_length / 1e6:.1f}M tokens per step (budget "
                       f"{tokens / 1e6:.1f}M): {micro} microbatch{'es' if micro != 1 else ''} of MBS {mbs} per DP rank "
                       f"(DP={layout.dp}, PP={layout.pp}{f', VPP={layout.vpp}' if layout.vpp else ''}){note}",
                  SOURCE + (f"; {INTERLEAVED_SOURCE}" if layout.vpp else ""))
