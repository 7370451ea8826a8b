"""Published measurements the cost models are tested against, each with its source, the quality of that source, and
whether the fit uses it.

Every row was re-read against its source on 2026-12-02 (repository, file, commit, table or entry). Sources by quality
(:data:`QUALITY`): NVIDIA's benchmark tables (Megatron-Bridge ``docs/performance-summary.md`` and
``docs/performance-summary-archive.md``), Megatron-Bridge model-verification cards (one named recipe at a bridge
commit, exact metrics), and the Megatron-Bridge skills cards (``skills/*/card.yaml``: tracker exports, exact at the
commit named where later commits rounded them, with some knobs unpublished). What a source does not say is taken from
megatron-bridge 0.6.2's perf recipe of that model, GPU and precision (``megatron/bridge/perf_recipes/...``, named per
row) and stated in the row's ``assumed``.

Fit subsets (:attr:`Row.fit`): the step model's constants are fitted on the rows marked ``fit`` (at least one per
constant fitted, two or more where the record has them, preferring primary sources); every other row is held out and
reported as such in docs/accuracy.md. Memory likewise.

Re-check findings (2026-12-02), fixed here:
* the DeepSeek-V3 long-context rows (LC1-LC6) had inherited our own 128K recipe's hierarchical CP (``a2a+p2p`` with
  sizes (8, 4)) at every CP size -- an inconsistent plan at CP != 32 and not what the runs used: no Megatron-Bridge
  recipe sets ``a2a+p2p`` (skills/nemo-mbridge-perf-hierarchical-context-parallel/card.yaml: "No checked-in Bridge
  recipe sets cp_comm_type=a2a+p2p"); they now use the default ring (p2p);
* the long-context card rounded its values at commit 476d063b8 ("Reconcile conflicting MFU claims"); the exact
  values of the tracker export (commit ad4138a1d) are used: DSV3 295/315/321/306/303/297 TFLOP/s, Qwen3-Next
  267/232/100 and 148/134/157 GB, Qwen3-235B 698 and 1117;
* the skills card's Qwen3-235B 256xH100 row (BF16, GBS 2048, 320 TFLOP/s at commit ad4138a1d) disagrees with the
  primary table: NVIDIA's performance summary publishes that model on that layout only in FP8 (25.11: FP8-CS,
  GBS 2048, 233; 26.04.01: FP8, GBS 8192, 253), and the card itself later withdrew the number ("Do not attach
  historical DeepEP throughput to this current alltoall configuration"): kept as a held-out row labelled
  ``disputed`` (HC7), the primary rows (PS17, PS22) carry the fit;
* the hardware card's DSV3 1024xH100 'FP8-Block ~370' (HC1): the 25.09 summary table gives 338 TFLOP/s per-tensor
  FP8 and 330 with 128x128 block scaling at the same layout and GBS 8192 (PS26, primary);
* Qwen3-235B 128xGB200 4K (LC10/HC9): the card lists CUDA graphs (attn, moe_router, moe_preprocess), which the row
  had as none.

Re-check of the primary table's unpublished knobs (2026-12-04), fixed here: the rows took them from megatron-bridge
0.6.2's perf recipes but had left out the EP all-to-all overlap those recipes set (the rows predate the step model's
overlap pricing). Each row's knobs are now read from the perf configuration of the release that ran it (the tag of
each table: tests/published_flops.py): ``perf_recipes`` at v0.6.0 for the 26.08 table, ``scripts/performance``
presets at v0.5.0 / v0.4.2 / v0.2.0, ``scripts/performance/run_script.py`` at v0.1.0rc3. The overlap
(``overlap_moe_expert_parallel_comm`` with ``delay_wgrad_compute``) is on in PS1-PS8 (26.08), PS14, PS17 (26.04.01),
PS22 (25.11) and PS26 (25.09, with DeepEP), as before in PS11, and off elsewhere; PS14 also runs DeepEP and
recompute mla_up_proj + mlp, PS12 and PS25 no recompute and partial CUDA graphs; PS11-PS13 and PS16 run the alltoall
dispatcher (the v0.4.2 scripts force it where a preset names no flex backend). PS26 then has HC1's configuration:
the skills card's 368 TFLOP/s and the table's 330 are one layout, not an overlap on/off pair.
The 25.11 rows PS18, PS20, PS21 and PS23-PS25 publish layouts or batches other than v0.2.0's presets (the table's
runs overrode them); the overlap, off in every one of those presets, is what the re-read confirms for them.

"GB" = 1e9 bytes; memory rows are torch peak allocated (``mem-max-allocated-bytes``) unless noted.
"""

from dataclasses import dataclass, replace

from published_flops import FLOPS_CONVENTION

from lcmoe_recipes.core.layout import ParallelLayout
from lcmoe_recipes.core.plan import Plan

GB, GIB = 1e9, 2**30

BRIDGE = "NVIDIA-NeMo/Megatron-Bridge"
HEAD = "067f987df03b8355b03192d88d70f1709fedf51a"   # 2026-08-22, the repository head read
TRACKER = "ad4138a1d55fb19bd0378d1494a607437ffe3f16"  # 2026-04-01, the skills cards' exact tracker values

QUALITY = {
    "primary-table": "NVIDIA's benchmark table: exact value, layout, batch and precision published",
    "primary-card": "model-verification card: exact value of one named recipe at a bridge commit",
    "secondary-exact": "skills card, exact tracker value; some knobs unpublished (assumed, stated)",
    "disputed": "skills card row contradicted by the primary table (see the module doc)",
    "functional": "verification card's functional run: untuned, packed variable-length data; the card calls its "
                  "throughput a sanity check, not a performance result",
}


@dataclass(frozen=True)
class Source:
    """Where a published number comes from."""

    file: str       # repository path (repository: Megatron-Bridge)
    where: str      # table / entry
    commit: str
    quality: str    # a key of QUALITY


@dataclass(frozen=True)
class Row:
    """One published measurement: the configuration as a Plan, the value, its source, what had to be assumed."""

    plan: Plan
    value: float    # TFLOP/s per GPU, or bytes per GPU for memory rows
    source: Source
    fit: bool = False
    assumed: str = ""
    flops_ratio: float = 1.0  # throughput rows: the FLOPs megatron-bridge counted for the row over ours

    @property
    def comparable(self) -> float:
        """The value at our FLOP count: a published TFLOP/s is megatron-bridge's FLOPs over the measured step, so the
        same step at our count is ``value / flops_ratio`` (tests/published_flops.py); memory rows: the value."""
        return self.value / self.flops_ratio


def _plan(name, model, hardware, gpus, seq, precision, gbs, *, tp=1, pp=1, vpp=None, cp=1, ep=1, mbs=1,
          dispatcher="flex", backend="hybridep", recompute=(), full=False, graphs=(), mtp=None, ep_overlap=False,
          grad="bf16", offload=0.0, precision_aware=False, moments="fp32", variable_length=False, op_fuser=False,
          sms=None):
    from lcmoe_recipes.catalog import get_model

    spec = get_model(model)
    return Plan(name=name, model=model, hardware=hardware, seq_length=seq,
                layout=ParallelLayout(world=gpus, tp=tp, pp=pp, cp=cp, ep=ep, etp=1, vpp=vpp),
                pipeline_model_parallel_layout=None, micro_batch_size=mbs, global_batch_size=gbs,
                precision=precision, moe_token_dispatcher_type=dispatcher,
                moe_flex_dispatcher_backend=backend if dispatcher == "flex" else None,
                recompute_granularity="full" if full else ("selective" if recompute else None),
                recompute_modules=() if full else tuple(recompute), recompute_method="uniform" if full else None,
                recompute_num_layers=1 if full else None, cuda_graph_impl="transformer_engine" if graphs else "none",
                cuda_graph_modules=tuple(graphs), sequence_parallel=tp > 1,
                mtp_num_layers=spec.mtp_num_layers if mtp is None else mtp, moe_ep_overlap=ep_overlap,
                grad_dtype=grad, optimizer_cpu_offload=offload > 0, optimizer_offload_fraction=offload,
                use_precision_aware_optimizer=precision_aware or offload > 0, moment_dtype=moments,
                variable_length=variable_length, use_transformer_engine_op_fuser=op_fuser,
                moe_flex_dispatcher_num_sms=sms if sms is not None else _hybridep_sms(dispatcher, backend))


def _hybridep_sms(dispatcher: str, backend: str) -> int | None:
    # every megatron-bridge release's performance settings give HybridEP 32 SMs (v0.2.0 scripts/performance/utils/
    # helpers.py, v0.4.2 and v0.5.0 utils/overrides.py, v0.6.0 perf_recipes/_common.py _benchmark_common; re-read
    # 2026-12-04); DeepEP keeps megatron-core's default (None: 20)
    return 32 if dispatcher == "flex" and backend == "hybridep" else None


# --- memory -----------------------------------------------------------------------------------------------------
def _moonlight(recompute: tuple[str, ...]) -> Plan:
    # Moonlight-16B-A3B, 8 x H100, TP2 PP1 CP1 EP8 ETP1 (DP4), MBS1 GBS4, seq 4096, BF16, precision-aware optimizer
    # with bf16 grads and moments, alltoall, no CUDA graphs (activation-recompute card.yaml, measured_results)
    return _plan("M", "moonlight", "h100", 8, 4096, "bf16", 4, tp=2, ep=8, dispatcher="alltoall", recompute=recompute,
                 precision_aware=True, moments="bf16")


class _OffloadKeepsMomentDtype(Plan):
    """A Plan whose optimizer CPU offload keeps the moments in ``moment_dtype``, as the stack that measured the
    cpu-offloading card's rows did: each 25% offloaded frees 3.6-4.0 GB there, the fp32 master plus two bf16 moments
    (8 bytes) of the ~1.9 B parameters each GPU's optimizer holds. megatron-core 0.19.2's HybridDeviceOptimizer keeps
    fp32 moments (12 bytes, ~5.7 GB a step; :attr:`Plan.effective_moment_dtype`), which these rows cannot test."""

    @property
    def effective_moment_dtype(self) -> str:
        return self.moment_dtype


def _qwen3_30b(offload: float) -> Plan:
    # Qwen3-30B-A3B, 16 x H100 (2 nodes), TP2 PP2 EP4 (DP4), seq 4096; the card publishes neither batch nor
    # precision: assumed MBS1 GBS8, BF16 with fp32 grads, alltoall, full recompute (the recipe of that time);
    # optimizer CPU offload fraction 0..1 (offload runs through the precision-aware optimizer: moments bf16)
    plan = _plan("Q", "qwen3_30b", "h100", 16, 4096, "bf16", 8, tp=2, pp=2, ep=4, dispatcher="alltoall", full=True,
                 grad="fp32", offload=offload, precision_aware=True, moments="bf16")
    measured = object.__new__(_OffloadKeepsMomentDtype)
    measured.__dict__.update(plan.__dict__)
    return measured


_RECOMPUTE_CARD = Source("skills/nemo-mbridge-perf-activation-recompute/card.yaml",
                         "measured_results, Moonlight 16B (peak allocated after iteration 2)", HEAD, "secondary-exact")
_OFFLOAD_CARD = Source("skills/nemo-mbridge-perf-cpu-offloading/card.yaml", "measured_results, Qwen3-30B-A3B", HEAD,
                       "secondary-exact")
_OFFLOAD_ASSUMED = ("batch and precision unpublished: MBS1 GBS8, BF16 with fp32 grads, full recompute; the offloaded "
                    "optimizer keeps bf16 moments, as its 3.8 GB steps show (megatron-core 0.19.2 keeps fp32)")
_LONG_CONTEXT = Source("skills/perf-techniques/moe-long-context/card.yaml", "cp_scaling_data", TRACKER,
                       "secondary-exact")
_HARDWARE = Source("skills/perf-techniques/moe-hardware-configs/card.yaml", "best_configs", TRACKER, "secondary-exact")

MEMORY_ROWS = {
    "M1": Row(_moonlight(()), 36.618 * GB, _RECOMPUTE_CARD, fit=True),
    "M2": Row(_moonlight(("core_attn",)), 36.614 * GB, _RECOMPUTE_CARD),
    "M3": Row(_moonlight(("mla_up_proj",)), 35.902 * GB, _RECOMPUTE_CARD, fit=True),
    "M4": Row(_moonlight(("mla_up_proj", "mlp")), 35.917 * GB, _RECOMPUTE_CARD),
    "M5": Row(_moonlight(("moe_act",)), 35.941 * GB, _RECOMPUTE_CARD, fit=True),
    "M6": Row(_moonlight(("layernorm", "moe_act")), 35.949 * GB, _RECOMPUTE_CARD),
    "Q1": Row(_qwen3_30b(0.0), 47.2 * GB, _OFFLOAD_CARD, fit=True, assumed=_OFFLOAD_ASSUMED),
    "Q2": Row(_qwen3_30b(0.25), 43.4 * GB, _OFFLOAD_CARD, assumed=_OFFLOAD_ASSUMED),
    "Q3": Row(_qwen3_30b(0.5), 39.6 * GB, _OFFLOAD_CARD, fit=True, assumed=_OFFLOAD_ASSUMED),
    "Q4": Row(_qwen3_30b(0.75), 35.6 * GB, _OFFLOAD_CARD, assumed=_OFFLOAD_ASSUMED),
    "Q5": Row(_qwen3_30b(1.0), 32.0 * GB, _OFFLOAD_CARD, fit=True, assumed=_OFFLOAD_ASSUMED),
    # Qwen3-30B-A3B 16 x H100 BF16 perf recipe: TP1 EP16, MBS1 GBS1024, HybridEP (32 SMs), EP overlap, TE graphs on
    # moe_router + moe_preprocess, no recompute; rank-0 peak allocated 62.166 GiB
    "Q6": Row(_plan("Q6", "qwen3_30b", "h100", 16, 4096, "bf16", 1024, ep=16, graphs=("moe_router", "moe_preprocess"),
                    ep_overlap=True), 62.166 * GIB,
              Source("skills/nemo-mbridge-perf-moe-hardware-configs/card.yaml",
                     "best_configs.qwen3_30b_h100_16.rank0_peak_allocated_gib", HEAD, "secondary-exact")),
}


def _named(name: str, **changes) -> Plan:
    from lcmoe_recipes import recipe_plan

    return recipe_plan(name).with_changes(**changes)


def _report_rows():
    from lcmoe_recipes.core.pipeline import build_pipeline_layout

    d1 = _plan("D1", "dsv3", "gb200", 256, 4096, "bf16", 4096, pp=4, vpp=4, ep=64, mtp=1)
    d1 = d1.with_changes(pipeline_model_parallel_layout=build_pipeline_layout(61, 16, 1))
    gdn = ("layout, recompute and measurement method unpublished: our qwen3_next recipe's layout assumed, with the "
           "bf16 gradient reduction of the upstream recipe that ran")
    return {
        "N1": Row(_named("qwen3_next_8k_gb200", grad_dtype="bf16"), 148 * GB, _LONG_CONTEXT, assumed=gdn),
        "N2": Row(_named("qwen3_next_32k_gb200", grad_dtype="bf16"), 134 * GB, _LONG_CONTEXT, assumed=gdn),
        "N3": Row(_named("qwen3_next_64k_gb200", grad_dtype="bf16"), 157 * GB, _LONG_CONTEXT, assumed=gdn),
        "D1": Row(d1, 199.5 * GB, Source("skills/nemo-mbridge-perf-moe-optimization-workflow/card.yaml",
                                         "core_concepts.three_walls.memory (arXiv 2603.07685)", HEAD, "secondary-exact"),
                  assumed="'without optimization', method not stated (possibly analytic); BF16 and GBS 4096 assumed "
                          "(the report's case study of this layout runs MXFP8)"),
    }


REPORT_ROWS = _report_rows()


# --- throughput -------------------------------------------------------------------------------------------------
def _dsv3_h100_long(seq: int, cp: int, gpus: int) -> Plan:
    # DSV3 + MTP on H100: TP1 EP32 PP8 VPP4 with the card's CP (DP = GPUs/(8·CP) = the card's DP column), FP8
    # blockwise, DeepEP; the SKILL's 128K/256K family: recompute up_proj/norm/moe/mlp and optimizer CPU offload.
    # Assumed: MBS1, 2^23 tokens per step (GBS a multiple of DP·PP), the default p2p ring.
    dp = gpus // (8 * cp)
    gbs = -(-max(1, 2**23 // seq) // (dp * 8)) * dp * 8
    return _plan(f"dsv3_{seq // 1024}k", "dsv3", "h100", gpus, seq, "fp8_blockwise", gbs, pp=8, vpp=4, cp=cp, ep=32,
                 backend="deepep", recompute=("mla_up_proj", "layernorm", "moe", "mlp"), offload=1.0, mtp=1)


_DSV3_LONG = "MBS1, 2^23 tokens per step, p2p ring, the SKILL's recompute and optimizer offload assumed"
_QNEXT = ("only CP published: our recipe's TP1 PP2 VPP4 EP16, the library recipe's recompute (layernorm, moe, "
          "moe_act), 2^22 tokens per step assumed")


def _qwen3_235b_cp4() -> Plan:
    # the published TP4 CP4 (DP2) with the recompute the library recipe of that time listed (moe_act, layernorm) and
    # its bf16 gradient reduction; our named recipe runs CP8 (DP1) with FP32 gradients
    plan = _named("qwen3_235b_128k_gb200", global_batch_size=64, recompute_modules=("moe_act", "layernorm"),
                  grad_dtype="bf16")
    return plan.with_changes(layout=replace(plan.layout, cp=4))


def _qwen3_next(name: str) -> Plan:
    from lcmoe_recipes.core.pipeline import build_pipeline_layout

    plan = _named(name, grad_dtype="bf16")  # the bf16 gradient reduction of the upstream recipe that ran
    return plan.with_changes(recompute_modules=("layernorm", "moe", "moe_act"), recompute_granularity="selective",
                             pipeline_model_parallel_layout=build_pipeline_layout(48, 8, 1),
                             global_batch_size=max(2**22 // plan.seq_length, 2 * plan.layout.dp))


def _summary(table: str) -> Source:
    archive = table != "26.08"
    return Source("docs/performance-summary-archive.md" if archive else "docs/performance-summary.md",
                  f"{table} NeMo container, pre-training table", HEAD, "primary-table")


def _card(model: str, item: str, commit: str) -> Source:
    return Source(f"examples/model_verification_cards/{model}/card.yaml", item + f" (bridge_commit {commit[:9]})", HEAD,
                  "primary-card")


_PERF = "megatron-bridge 0.6.2 perf recipe's recompute / dispatcher / graphs; even pipeline split"
# The EP all-to-all overlap (overlap_moe_expert_parallel_comm, with delay_wgrad_compute) as the perf config of the
# release that ran the row sets it (re-read 2026-12-04; the tag each table ran is in tests/published_flops.py):
_V060 = ("; EP overlap on: megatron-bridge v0.6.0 perf_recipes (the 26.08 release) set "
         "overlap_moe_expert_parallel_comm and delay_wgrad_compute for this model, GPU and precision (with full-iteration CUDA graphs, which the step "
         "model does not price)")
# The routed experts through Transformer Engine's op fuser (biases and the clamped GLU inside the fused grouped MLP):
_OP_FUSER = ("; op fuser on: megatron-bridge v0.6.0's MXFP8 perf recipes on GB200 / GB300 set "
             "use_transformer_engine_op_fuser (perf_recipes/qwen/common.py _enable_hybridep_full_iteration_mxfp8, "
             "deepseek/common.py _enable_deepseek_full_iteration_mxfp8, gpt_oss/common.py "
             "_apply_gpt_oss_120b_full_iter_fp8mx_configs)")
_CARD_RECIPE = ("the card's command runs perf_recipes/qwen/{}/qwen3_moe.py {} at its bridge commit: EP overlap, "
                "op fuser and full-iteration CUDA graphs (qwen/common.py _enable_hybridep_full_iteration_mxfp8; the "
                "graphs are not priced)")
_V042 = "; EP overlap on: megatron-bridge v0.4.2 scripts/performance/configs/{} (moe_a2a_overlap=True)"
_V020 = "; EP overlap on: megatron-bridge v0.2.0 scripts/performance/configs/qwen3/workload_base_configs.py {} " \
        "(moe_a2a_overlap=True)"


def _throughput_rows():
    lc, hc = _LONG_CONTEXT, _HARDWARE
    q235 = dict(dispatcher="flex")
    rows = {
        # long context: DeepSeek-V3 on H100 (FP8 blockwise, DeepEP), Qwen3-Next and Qwen3-235B on GB200 (BF16)
        "LC1": Row(_dsv3_h100_long(4096, 1, 256), 295, lc, fit=True, assumed=_DSV3_LONG),
        "LC2": Row(_dsv3_h100_long(16384, 4, 256), 315, lc, assumed=_DSV3_LONG),
        "LC3": Row(_dsv3_h100_long(32768, 8, 256), 321, lc, fit=True, assumed=_DSV3_LONG),
        "LC4": Row(_dsv3_h100_long(65536, 16, 256), 306, lc, assumed=_DSV3_LONG),
        "LC5": Row(_dsv3_h100_long(131072, 32, 256), 303, lc, fit=True, assumed=_DSV3_LONG),
        "LC6": Row(_dsv3_h100_long(262144, 64, 512), 297, lc, assumed=_DSV3_LONG),
        "LC7": Row(_qwen3_next("qwen3_next_8k_gb200"), 267, lc, fit=True, assumed=_QNEXT),
        "LC8": Row(_qwen3_next("qwen3_next_32k_gb200"), 232, lc, assumed=_QNEXT),
        "LC9": Row(_qwen3_next("qwen3_next_64k_gb200"), 100, lc, fit=True, assumed=_QNEXT),
        "LC10": Row(_plan("qwen3_235b_4k", "qwen3_235b", "gb200", 128, 4096, "bf16", 1024, pp=4, vpp=12, ep=32,
                          graphs=("attn", "moe_router", "moe_preprocess")), 698, lc,
                    assumed="layout and batch from the hardware card (HC9); no recompute"),
        "LC11": Row(_qwen3_235b_cp4(), 1117, lc, fit=True,
                    assumed="TP4 CP4 published; our recipe's EP32 PP4 VPP12, recompute moe_act+layernorm and "
                            "2^23 tokens per step assumed"),
        # skills hardware card (exact tracker values)
        "HC1": Row(_plan("dsv3_1024_h100", "dsv3", "h100", 1024, 4096, "fp8_blockwise", 8192, tp=2, pp=8, vpp=4,
                         ep=64, backend="deepep", recompute=("mla_up_proj", "mlp"), ep_overlap=True, mtp=1), 368, hc,
                   assumed="the report's case study: EP overlap on, no CUDA graphs"),
        "HC2": Row(_plan("dsv3_b200_bf16", "dsv3", "b200", 256, 4096, "bf16", 4096, pp=8, vpp=4, ep=32,
                         backend="deepep", recompute=("mla_up_proj", "mlp", "moe_act", "layernorm"), mtp=1), 516, hc, fit=True),
        "HC3": Row(_plan("dsv3_b200_mx", "dsv3", "b200", 256, 4096, "mxfp8", 8192, pp=8, vpp=2, ep=32,
                         backend="deepep", mtp=1), 818, hc, assumed="recompute unpublished: none"),
        "HC4": Row(_plan("dsv3_gb200_nomtp", "dsv3", "gb200", 256, 4096, "mxfp8", 2048, pp=8, vpp=4, ep=32, mtp=0,
                         graphs=("attn", "moe_router", "moe_preprocess")), 970, hc,
                   assumed="recompute unpublished: none"),
        "HC5": Row(_plan("dsv3_gb200_mx", "dsv3", "gb200", 256, 4096, "mxfp8", 8192, pp=4, vpp=4, ep=64, mtp=1,
                         graphs=("attn", "moe_router", "moe_preprocess")), 1117, hc,
                   assumed="recompute unpublished: none"),
        "HC6": Row(_plan("dsv3_gb300_mx", "dsv3", "gb300", 256, 4096, "mxfp8", 8192, pp=4, vpp=4, ep=64, mtp=1,
                         graphs=("attn", "moe_router", "moe_preprocess")), 1234, hc,
                   assumed="recompute unpublished: none"),
        "HC7": Row(_plan("qwen3_235b_h100_bf16", "qwen3_235b", "h100", 256, 4096, "bf16", 2048, tp=2, pp=8, vpp=4,
                         ep=32, dispatcher="alltoall"), 320, Source(hc.file, hc.where, TRACKER, "disputed"),
                   assumed="see the module doc: the primary table has no BF16 row for this layout"),
        "HC8": Row(_plan("qwen3_235b_b200", "qwen3_235b", "b200", 128, 4096, "bf16", 2048, tp=2, pp=4, vpp=12, ep=16,
                         mbs=2, backend="deepep"), 586, hc, fit=True, assumed="no recompute"),
        "HC10": Row(_plan("qwen3_30b_h100_32", "qwen3_30b", "h100", 32, 4096, "bf16", 256, ep=8, mbs=4,
                          backend="deepep", full=True), 208, hc, fit=True),
        "HC11": Row(_plan("qwen3_next_64", "qwen3_next", "gb200", 64, 4096, "bf16", 1024, pp=2, vpp=4, ep=32, mbs=2,
                          graphs=("attn", "moe_router", "moe_preprocess")), 327, hc, assumed="no recompute"),
        # NVIDIA's performance summary (primary)
        "PS1": Row(_plan("dsv3_gb300", "dsv3", "gb300", 256, 4096, "mxfp8", 4096, pp=2, vpp=8, ep=32, mtp=1,
                         recompute=("mla_up_proj",), ep_overlap=True, op_fuser=True), 1635, _summary("26.08"), fit=True,
                   assumed=_PERF + _V060 + _OP_FUSER),
        "PS2": Row(_plan("dsv3_gb200", "dsv3", "gb200", 256, 4096, "mxfp8", 4096, pp=4, vpp=4, ep=64, mtp=1,
                         recompute=("mla_up_proj",), ep_overlap=True, op_fuser=True), 1276, _summary("26.08"), fit=True,
                   assumed=_PERF + _V060 + _OP_FUSER),
        "PS3": Row(_plan("gptoss_gb300_mx", "gpt_oss_120b", "gb300", 64, 4096, "mxfp8", 1280, ep=16, mbs=4,
                         ep_overlap=True, op_fuser=True), 1077, _summary("26.08"), assumed=_PERF + _V060 + _OP_FUSER),
        "PS4": Row(_plan("gptoss_gb200_mx", "gpt_oss_120b", "gb200", 64, 4096, "mxfp8", 1280, ep=64, mbs=4,
                         ep_overlap=True, op_fuser=True), 934, _summary("26.08"), assumed=_PERF + _V060 + _OP_FUSER),
        "PS5": Row(_plan("q30_gb300_mx", "qwen3_30b", "gb300", 8, 4096, "mxfp8", 512, ep=8, mbs=8, ep_overlap=True,
                         op_fuser=True), 1029, _summary("26.08"), assumed=_PERF + _V060 + _OP_FUSER),
        "PS6": Row(_plan("q30_gb200_mx", "qwen3_30b", "gb200", 8, 4096, "mxfp8", 512, ep=8, mbs=4, ep_overlap=True,
                         op_fuser=True), 923, _summary("26.08"), fit=True, assumed=_PERF + _V060 + _OP_FUSER),
        "PS7": Row(_plan("q235_gb300_mx", "qwen3_235b", "gb300", 256, 4096, "mxfp8", 8192, pp=4, vpp=12, ep=32, mbs=2,
                         ep_overlap=True, op_fuser=True, **q235), 1306, _summary("26.08"), fit=True,
                   assumed=_PERF + _V060 + _OP_FUSER),
        "PS8": Row(_plan("q235_gb200_mx", "qwen3_235b", "gb200", 256, 4096, "mxfp8", 8192, pp=8, vpp=3, ep=32,
                         ep_overlap=True, op_fuser=True, **q235), 1077, _summary("26.08"), assumed=_PERF + _V060 + _OP_FUSER),
        "PS9": Row(_plan("q30_h100_fp8", "qwen3_30b", "h100", 16, 4096, "fp8_cs", 1024, ep=16), 203,
                   _summary("26.06"), fit=True, assumed=_PERF),
        "PS10": Row(_plan("gptoss_h100", "gpt_oss_120b", "h100", 64, 4096, "bf16", 1280, pp=4, ep=8,
                          dispatcher="alltoall", recompute=("layernorm", "moe_act")), 158, _summary("26.04.01"),
                    assumed=_PERF),
        "PS11": Row(_plan("gptoss_gb200", "gpt_oss_120b", "gb200", 64, 4096, "bf16", 1280, ep=64, mbs=4,
                          dispatcher="alltoall", recompute=("layernorm", "moe_act"), ep_overlap=True), 452,
                    _summary("26.04.01"), assumed=_PERF),
        "PS12": Row(_plan("gptoss_gb300", "gpt_oss_120b", "gb300", 64, 4096, "bf16", 1280, ep=64, mbs=4,
                          dispatcher="alltoall", graphs=("attn", "moe_router", "moe_preprocess")), 523,
                    _summary("26.04.01"),
                    assumed=_PERF + "; no recompute and CUDA graphs on attention, router and preprocess, as the "
                    "release that ran it set them (megatron-bridge v0.4.2 scripts/performance/configs/gpt_oss/"
                    "gpt_oss_workload_base_configs.py GPT_OSS_120B_PRETRAIN_CONFIG_GB300_BF16_V2)"),
        "PS13": Row(_plan("gptoss_b200", "gpt_oss_120b", "b200", 64, 4096, "bf16", 1280, ep=8, mbs=4,
                          dispatcher="alltoall", recompute=("layernorm", "moe_act")), 369, _summary("26.04.01"),
                    assumed=_PERF),
        "PS14": Row(_plan("dsv3_b200", "dsv3", "b200", 256, 4096, "mxfp8", 4096, pp=8, vpp=2, ep=32, mtp=1,
                          backend="deepep", recompute=("mla_up_proj", "mlp"),
                          graphs=("attn", "moe_router", "moe_preprocess"), ep_overlap=True), 864, _summary("26.04.01"),
                    assumed=_PERF + "; DeepEP, recompute mla_up_proj + mlp, CUDA graphs on attention, router and "
                    "preprocess" + _V042.format("deepseek/deepseek_workload_base_configs.py "
                                                "DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2")),
        "PS15": Row(_plan("q30_b200", "qwen3_30b", "b200", 8, 4096, "mxfp8", 512, ep=8, mbs=4), 619,
                    _summary("26.04.01"), fit=True, assumed=_PERF),
        "PS16": Row(_plan("q235_b200", "qwen3_235b", "b200", 256, 4096, "mxfp8", 8192, pp=8, ep=8,
                          dispatcher="alltoall"), 560, _summary("26.04.01"), fit=True, assumed=_PERF),
        "PS17": Row(_plan("q235_h100", "qwen3_235b", "h100", 256, 4096, "fp8_cs", 8192, tp=2, pp=8, vpp=4, ep=32,
                          dispatcher="alltoall", ep_overlap=True), 253, _summary("26.04.01"), fit=True,
                    assumed=_PERF + _V042.format("qwen/qwen3_workload_base_configs.py "
                                                 "QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V1 (V2 keeps it)")),
        "PS18": Row(_plan("dsv3_gb300_bf16", "dsv3", "gb300", 256, 4096, "bf16", 4096, pp=2, vpp=4, ep=32, mtp=0,
                          recompute=("mla_up_proj",)), 961, _summary("25.11"), fit=True, assumed=_PERF),
        "PS19": Row(_plan("dsv3_gb200_bf16", "dsv3", "gb200", 256, 4096, "bf16", 4096, pp=4, vpp=4, ep=64, mtp=0,
                          recompute=("mla_up_proj",)), 782, _summary("25.11"), fit=True, assumed=_PERF),
        "PS20": Row(_plan("q235_gb300_bf16", "qwen3_235b", "gb300", 256, 4096, "bf16", 8192, pp=4, vpp=12, ep=16,
                          mbs=2), 907, _summary("25.11"), fit=True, assumed=_PERF),
        "PS21": Row(_plan("q235_gb200_bf16", "qwen3_235b", "gb200", 256, 4096, "bf16", 8192, pp=8, vpp=3, ep=32), 728,
                    _summary("25.11"), fit=True, assumed=_PERF),
        "PS22": Row(_plan("q235_h100_cs", "qwen3_235b", "h100", 256, 4096, "fp8_cs", 2048, tp=2, pp=8, vpp=4, ep=32,
                          dispatcher="alltoall", ep_overlap=True), 233, _summary("25.11"),
                    assumed=_PERF + _V020.format("QWEN3_235B_A22B_H100_FP8_CS_BASE_CONFIG")),
        "PS23": Row(_plan("gptoss_h100_2511", "gpt_oss_120b", "h100", 64, 4096, "bf16", 512, pp=4, ep=8, mbs=4,
                          dispatcher="alltoall", recompute=("layernorm", "moe_act")), 153, _summary("25.11"),
                    assumed=_PERF),
        "PS24": Row(_plan("gptoss_gb200_8k", "gpt_oss_120b", "gb200", 64, 8192, "bf16", 1280, ep=64,
                          recompute=("layernorm", "moe_act")), 488, _summary("25.11"), assumed=_PERF),
        "PS25": Row(_plan("gptoss_gb300_8k", "gpt_oss_120b", "gb300", 64, 8192, "bf16", 1280, ep=64, mbs=2,
                          graphs=("attn", "moe_router", "moe_preprocess")), 565, _summary("25.11"),
                    assumed=_PERF + "; no recompute and CUDA graphs on attention, router and preprocess, as the "
                    "release that ran it set them (megatron-bridge v0.2.0 scripts/performance/configs/gpt_oss/"
                    "workload_base_configs.py GPT_OSS_120B_GB300_BF16_BASE_CONFIG; the table's 8K length, MBS and "
                    "GBS override the preset's)"),
        "PS26": Row(_plan("dsv3_h100_1024", "dsv3", "h100", 1024, 4096, "fp8_blockwise", 8192, tp=2, pp=8, vpp=4,
                          ep=64, recompute=("mla_up_proj", "mlp"), mtp=1, backend="deepep", ep_overlap=True), 330,
                    _summary("25.09"), fit=True,
                    assumed=_PERF + " (the 128x128 / 1x128 block-scaled figure in parentheses); DeepEP and the EP "
                    "overlap with delayed weight gradients, as the release that ran it set them on H100 "
                    "(megatron-bridge v0.1.0rc3 scripts/performance/run_script.py, DeepSeek-V3: enable_deepep and "
                    "A2A_1F1B on h100)"),
        "PS27": Row(_plan("kimi_gb300", "kimi_k2", "gb300", 256, 4096, "mxfp8", 4096, pp=4, vpp=4, ep=64, mbs=2,
                          recompute=("mla_up_proj",)), 1099, _summary("26.06"),
                    assumed=_PERF + "; trained with Muon (the step model prices no optimizer step)"),
        # model-verification cards (exact, one recipe at a bridge commit)
        "VC1": Row(_plan("q30_h100_bf16", "qwen3_30b", "h100", 16, 4096, "bf16", 1024, ep=16, ep_overlap=True,
                         graphs=("moe_router", "moe_preprocess")), 299.352,
                   _card("qwen3-30b-a3b", "pretrain_performance.H100", "3a9559f01283190bf16a7a592c1e2c35d908c496"),
                   fit=True),
        # the cards' runs are their bridge commit's perf recipe (re-read 2026-12-04): perf_recipes/qwen/common.py
        # _enable_hybridep_full_iteration_mxfp8 sets the EP overlap (with delay_wgrad_compute), the op fuser and
        # full-iteration CUDA graphs; the GB300 235B recipe sets VPP 12, which the card's prose leaves out
        "VC2": Row(_plan("q30_gb200_card", "qwen3_30b", "gb200", 8, 4096, "mxfp8", 512, ep=8, mbs=4, ep_overlap=True,
                         op_fuser=True), 927.68,
                   _card("qwen3-30b-a3b", "pretrain_performance.GB200", "6e1b47893e3c174e74a97fb1730c9f58387ab882"),
                   assumed=_CARD_RECIPE.format("gb200", "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config")),
        "VC3": Row(_plan("q235_gb300_card", "qwen3_235b", "gb300", 256, 4096, "mxfp8", 8192, pp=4, vpp=12, ep=32,
                         mbs=2, ep_overlap=True, op_fuser=True, **q235), 1300.44,
                   _card("qwen3-235b-a22b", "pretrain_performance.GB300", "fbb7570cf7eec94fd2e6064454d84f7fad07fbfa"),
                   assumed=_CARD_RECIPE.format("gb300", "qwen3_235b_a22b_pretrain_256gpu_gb300_fp8mx_config")
                   + "; VPP 12 from the recipe (the card's prose gives TP1/PP4/CP1/EP32)"),
        "VC4": Row(_plan("q30_h100_natural", "qwen3_30b", "h100", 16, 4096, "bf16", 1024, ep=16,
                         graphs=("moe_router", "moe_preprocess")), 199.12,
                   _card("qwen3-30b-a3b", "pretrain.H100 (natural routing)", "5b9d9cf501193277e1ca47a99b97c640b8f39f90"),
                   assumed="natural (not force-balanced) routing: expert imbalance the model does not price"),
        "VC5": Row(_plan("moonlight_h100", "moonlight", "h100", 16, 4096, "bf16", 1024, ep=8, mbs=2), 386.59,
                   _card("moonlight-16b-a3b", "pretrain.H100 (natural routing)", "411c6b1dc26eef50124843fbf9b6253b7b6c43cb"),
                   assumed="natural (not force-balanced) routing; no recompute"),
        # Moonlight recompute study (exact; TFLOP/s of the control, the others from their step times x the control's)
        **{f"RC{i + 1}": Row(_moonlight(mods), round(77.50 * 457.18 / ms, 2), _RECOMPUTE_CARD,
                             assumed="" if i == 0 else "TFLOP/s from the published step time (same model FLOPs)")
           for i, (mods, ms) in enumerate(((((), 457.18)), (("core_attn",), 474.80), (("mla_up_proj",), 480.89),
                                           (("mla_up_proj", "mlp"), 496.73), (("moe_act",), 466.26),
                                           (("layernorm", "moe_act"), 506.53)))},
        # functional long-context SFT runs (packed, untuned): reported, outside what the step model prices
        "FL1": Row(_plan("q30_sft_32k", "qwen3_30b", "h100", 16, 32768, "bf16", 32, tp=8, cp=2, ep=8,
                         backend="deepep", full=True, variable_length=True), 26.12,
                   Source("examples/model_verification_cards/qwen3-30b-a3b/card.yaml", "sft_long_context.H100",
                          HEAD, "functional"), assumed="GBS unpublished (32 assumed); packed Tulu3"),
        "FL2": Row(_plan("gptoss120_sft_32k", "gpt_oss_120b", "h100", 48, 32768, "bf16", 4, tp=2, pp=6, cp=4, ep=4,
                         dispatcher="alltoall", recompute=("moe_act",), variable_length=True)
                   .with_changes(cp_comm_type="a2a"), 5.07,
                   Source("examples/model_verification_cards/gpt-oss-120b/card.yaml", "sft_long_context.H100", HEAD,
                          "functional"), assumed="GBS 4 (its data path's name); packed Tulu3"),
        "FL3": Row(_plan("gptoss20_sft_32k", "gpt_oss_20b", "h100", 8, 32768, "bf16", 8, tp=4, cp=2,
                         dispatcher="alltoall", full=True, variable_length=True).with_changes(cp_comm_type="a2a"),
                   13.43, Source("examples/model_verification_cards/gpt-oss-20b/card.yaml", "sft_long_context.H100",
                                 HEAD, "functional"), assumed="GBS unpublished (8 assumed); packed Tulu3"),
    }
    return rows


THROUGHPUT_ROWS = {k: replace(r, flops_ratio=FLOPS_CONVENTION[k][1] or 1.0) for k, r in _throughput_rows().items()}


# --- the allocator's fragmentation: peak reserved vs peak allocated (GiB), model-verification cards at HEAD -----------
def _gap(card: str, item: str) -> Source:
    return Source(f"examples/model_verification_cards/{card}/card.yaml", item, HEAD, "primary-card")


ALLOCATOR_GAPS = {
    "G1": (65.223, 72.356, _gap("gemma-4-26b-a4b-it", "peak_allocated / peak_reserved_memory_gib (first)")),
    "G2": (44.252, 45.637, _gap("gemma-4-26b-a4b-it", "peak_allocated / peak_reserved_memory_gib (second)")),
    "G3": (68.547, 73.893, _gap("nemotron-3.5-lightning", "8 x H100 CP2 run")),
    "G4": (158.220, 162.290, _gap("nemotron-3.5-lightning", "GB200 run (158.220 / 162.290)")),
    "G5": (160.760, 166.230, _gap("nemotron-3.5-lightning", "GB200 run (160.760 / 166.230)")),
    "G6": (169.54, 173.86, _gap("nemotron-3.5-lightning", "169.54 / 173.86")),
    "G7": (101.510, 103.960, _gap("nemotron-3.5-lightning", "101.510 / 103.960")),
    "G8": (72.066, 75.340, _gap("nemotron-3.5-lightning", "rank-0 72.066 / 75.340")),
    "G9": (156.850, 161.260, _gap("nemotron-3.5-lightning", "rank-0 156.850 / 161.260")),
    "G10": (58.079, 70.336, _gap("nemotron-3-super-120b-a12b", "58.079 GiB allocated / 70.336 reserved")),
    "G11": (59.000, 69.344, _gap("nemotron-3-super-120b-a12b", "59.000 GiB allocated / 69.344 reserved")),
    "G12": (65.230, 69.684, _gap("glm5-2", "65.230 GiB allocated / 69.684 reserved")),
}
