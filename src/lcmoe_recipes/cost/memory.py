"""Per-GPU memory of a Plan on its most loaded pipeline rank: a breakdown in bytes (GiB in the report).

Every component but one is derived from the model, the layout and megatron-core 0.19.2's implementation (file and
function named per component); what is left is one fitted constant, :data:`CALIBRATED` (docs/accuracy.md).

* **parameters** -- bf16 (2 bytes). Dense parts (attention, norms, router, shared / dense MLP, embedding on the
  first stage, output layer, MTP layers and a second embedding on the last) are split by TP, except what every TP
  rank holds whole (norms, router, MLA down projections: :mod:`lcmoe_recipes.cost.shapes`); routed experts by EP·ETP.
  Equal, byte for byte, to what megatron-core builds for every stage of the named recipes and the CI's planner
  outputs (:mod:`lcmoe_recipes.emit.probe.build`, ``tests/test_build.py``).
  Layers per rank come from the pipeline split (:func:`lcmoe_recipes.core.pipeline.stage_decoder_layers`: the layout
  string's, else an even split).
* **weight_cache** -- FP8 copies of the GEMM weights that Transformer Engine caches across the microbatches of a
  step (megatron-core ``extensions/transformer_engine.py``: ``TELinear.forward`` passes ``is_first_microbatch``, so
  TE quantises each weight once per step and keeps it), row-wise and column-wise: 2 bytes per weight, for FP8
  recipes whose parameters stay bf16 (``fp8_blockwise``: megatron-bridge 0.6.2 ``mixed_precision.py``,
  ``bf16_with_fp8_subchannel_scaling_mixed`` sets ``fp8_param_gather=False``). With ``fp8_param_gather`` (fp8_cs,
  mxfp8) the parameters themselves are FP8 and there is no second copy: counted as bf16-sized parameters.
* **gradients** -- one main-gradient buffer per parameter, fp32 (``grad_reduce_in_fp32``) or bf16. The
  distributed optimizer does not shard it.
* **optimizer state** -- fp32 master weights plus two Adam moments (fp32, or bf16 with the precision-aware
  optimizer), sharded by the distributed optimizer over DP·CP (dense) and EDP (experts); the CPU-offloaded fraction
  ``optimizer_offload_fraction`` leaves the GPU.
* **activations** -- the tensors each layer keeps for its backward pass, listed by name and by attention kind in
  :func:`layer_activations` (bytes per layer per microbatch) with the recompute module that drops each one; times
  the microbatch-chunks in flight on that rank (1F1B: PP - rank; interleaved: megatron-core's warm-up count,
  ``pipeline_parallel/schedules.py``, one more with the EP all-to-all overlap: :func:`ep_overlap_warmup`); plus
  the loss logits on the last stage. Tokens per rank: MBS·seq_length/CP; tensors in the sequence-sharded regions
  are also divided by TP (sequence parallel), the rest by TP through the heads / hidden split. Scaled by the fitted
  ``activation_scale`` (the list over-counts slightly: some tensors are views or freed early).
* **transient** -- the largest extra live at the peak: the fp32 logit gradient on the last stage, or one layer's
  activations being recomputed / its gradients in flight.
* **cuda_graphs** -- Transformer Engine graphs (``cuda_graph_impl="transformer_engine"``) give every captured layer a
  static input per microbatch in flight, reused once that microbatch's backward is done (megatron-core
  ``transformer/cuda_graphs.py``, ``TECudaGraphHelper._get_sample_arguments``), and with TE >= 2.7 megatron-core
  asks ``make_graphed_callables`` to reuse input/output buffers between graphs
  (``_reuse_graph_input_output_buffers``). The captured modules save their input in that static buffer, so for
  microbatches in flight it *is* the layer input already counted as an activation, and the tensors they save live
  in the graph pool instead of the caching allocator (counted as activations too). The extra is one static input
  and one static output per captured segment kind (attn, the MoE router/preprocess, the dense MLP, or the whole
  layer). Full-iteration graphs put the whole step in one pool: priced as the eager step.
* **workspace** -- cuBLAS workspaces: Transformer Engine's 32 MiB per GEMM stream on SM >= 9 (one, plus four for
  grouped GEMMs: ``pytorch/cpp_extensions/gemm.py``, ``get_cublas_workspace_size_bytes`` / ``get_cublas_workspace``,
  and ``common/util/multi_stream.cpp``'s four compute streams) and PyTorch's own 32 MiB. With ``tp_comm_overlap``,
  Transformer Engine 2.x's ``initialize_ub`` repeats its plain-GEMM workspace once per overlap stream
  (``_NUM_MAX_UB_STREAMS`` = 3).
* **userbuffers** -- with ``tp_comm_overlap`` (:func:`lcmoe_recipes.cost.overlap.tp_overlap`), Transformer Engine
  2.x's ``initialize_ub`` (``pytorch/module/base.py``) makes one communicator per named overlap (ring exchange:
  qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad; pipeline: proj_fprop, fc2_fprop; bulk: qkv_dgrad, qkv_wgrad,
  fc1_dgrad, fc1_wgrad; external: proj_wgrad, fc2_wgrad), each with a buffer of the shape megatron-bridge passes,
  [seq_length x MBS / CP, hidden] (``training/initialize.py`` ``_initialize_tp_communicators``), in BF16, or one byte
  per element for the eight all-gather buffers under an FP8 recipe (``layers_all_gather_overlap``). The buffers are
  registered with userbuffers' own allocation, outside PyTorch's caching allocator (an OUTSIDE line). Counted as
  read: at least one such buffer per communicator.
* **overhead** -- the fitted remainder: what the caching allocator holds that none of the above names (the loss
  and its fp32 reductions, rotary tables, MoE auxiliary-loss tensors, per-step temporaries of the distributed
  optimizer, allocator rounding).
* **dispatcher** -- the static all-to-all buffers of the flex dispatcher's backends, allocated outside PyTorch's
  caching allocator (so not in ``torch.cuda.max_memory_allocated``, but in HBM): DeepEP's NVLink and RDMA buffers,
  sized by ``Config.get_nvl_buffer_size_hint`` / ``get_rdma_buffer_size_hint`` with the dispatch/combine configs of
  ``Buffer.get_dispatch_config`` / ``get_combine_config`` for the EP size (DeepEP ``csrc/legacy/config.hpp``,
  ``deep_ep/buffers/legacy.py``; hidden bytes h·2 as megatron-core ``fused_a2a.get_hidden_bytes``); HybridEP's
  shared dispatch/combine buffer for the worst case of every token of the EP group landing on one rank
  (``max_num_of_tokens_per_rank`` = this rank's tokens x EP; tokens x h bf16 + tokens x experts fp32 probabilities +
  tokens x h/128 fp32 scales: DeepEP hybrid-ep ``csrc/hybrid_ep/buffer/intranode.cu``,
  ``NVLCoordinator::allocate_dispatch_buffers``; megatron-core ``fused_a2a.init_hybrid_ep_buffer`` sizes it from
  the first dispatch). The alltoall dispatcher uses NCCL and keeps nothing static.

``total`` (the components above but the dispatcher buffers) is the caching allocator's peak -- what the published
peaks measure (torch peak allocated). The rest of the HBM budget lies outside the allocator, each priced as its own
line (``hbm_total`` adds them; :meth:`MemoryBreakdown.budget` lists the whole budget):

* **dispatcher** -- above;
* **cuda_context** -- the CUDA context of the process: about 400 MB with CUDA >= 11.7's lazy module loading, which
  PyTorch enables ("The first CUDA operation will create the CUDA context which uses around 400MB if CUDA >= 11.7 is
  used and lazy module loading enabled (default in PyTorch)": pytorch/pytorch issue 109888); kernels loaded later
  add to it and are not priced;
* **nccl** -- NCCL's communicator buffers, by the groups this rank runs collectives and point-to-point transfers
  in (:func:`nccl_buffer_bytes`): a collective communicator keeps, per channel, one connection's buffers for each
  protocol -- Simple (``NCCL_BUFFSIZE``, default 4 MiB), LL128 (4,800 KiB) and LL (512 KiB): NCCL ``src/init.cc``
  ``DEFAULT_BUFFSIZE`` / ``DEFAULT_LL128_BUFFSIZE`` / ``DEFAULT_LL_BUFFSIZE`` -- for at most ``MAXCHANNELS`` = 32
  channels (``src/include/device.h``; priced at that bound); point-to-point (pipeline send/recv, the CP ring,
  all-to-all) keeps Simple buffers per peer for its channels per peer (2: ``NCCL_NCHANNELS_PER_NET_PEER`` /
  p2p channels per peer, NCCL environment docs). NVLink SHARP (NVLS) buffers are not priced: Megatron-LM's MoE
  guide sets ``NCCL_NVLS_ENABLE=0`` "to prevent memory overhead" (``megatron/core/transformer/moe/README.md``).

What remains of HBM beside ``hbm_total`` is the fragmentation margin: the caching allocator reserves more than it
hands out (rounded blocks, split segments, cached free blocks). :meth:`MemoryBreakdown.budget` shows it as its own
line: ``margin`` x HBM (the request's ``memory_margin``, default 5%), measured in the model-verification cards as
peak reserved - peak allocated of 2.4-11% of the allocated peak (docs/accuracy.md, "The HBM budget").

Units: bytes; "GB" in the published measurements is 1e9 bytes (torch peak allocated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import NamedTuple

from ..core.pipeline import stage_decoder_layers
from ..core.plan import Plan
from .overlap import tp_overlap
from .shapes import LayerShapes, shapes

BF16, FP32 = 2, 4
LOGIT_COPIES = 2  # fp32 logit-sized tensors alive at the loss peak: the softmax and its gradient
FP8_CACHED = ("fp8_blockwise",)  # precisions whose bf16 weights get TE FP8 copies (fp8_param_gather=False)
TE_WORKSPACE = 32 * 2**20 + 1024  # bytes per TE cuBLAS workspace on SM >= 9
TE_WORKSPACES = 1 + 4             # one for plain GEMMs, four for grouped GEMMs (TE's compute streams)
TORCH_WORKSPACE = 32 * 2**20      # PyTorch's cuBLAS workspace (SM >= 9)
UB_STREAMS = 3                    # TE initialize_ub: _NUM_MAX_UB_STREAMS, the plain workspace repeated per stream
UB_BUFFERS = 12                   # TE initialize_ub: communicators (ring exchange 4, pipeline 2, bulk 4, external 2)
UB_ALL_GATHER_BUFFERS = 8         # ... of which all-gather buffers, uint8 under an FP8 recipe
GDN_CHUNK = 64                    # FLA chunk size of the gated-delta-rule kernels (chunk_gated_delta_rule)
DEEPEP_SMS = 20                   # megatron-core's default moe_deepep_num_sms (Buffer.num_sms)
DEEPEP_NVL_PEERS = 8              # DeepEP's NUM_MAX_NVL_PEERS
# DeepEP Buffer.get_dispatch_config / get_combine_config: EP size -> (NVL recv tokens, RDMA recv tokens) per channel
DEEPEP_RECV = {2: (256, 128), 4: (256, 128), 8: (256, 128), 16: (288, 128), 24: (288, 128), 32: (288, 128),
               48: (288, 128), 64: (288, 128), 96: (480, 128), 128: (560, 128), 144: (720, 128), 160: (720, 128)}
CUDA_CONTEXT = 400e6              # bytes: the CUDA context with lazy module loading (pytorch/pytorch issue 109888)
NCCL_BUFFSIZE = 4 * 2**20         # NCCL Simple protocol buffer per connection (NCCL_BUFFSIZE default, src/init.cc)
NCCL_LL128 = 120 * 640 * 8 * 8    # LL128 buffer: elems/thread x threads x NCCL_STEPS x 8 bytes (src/init.cc)
NCCL_LL = 8 * 512 * 8 * 16        # LL buffer: lines/thread x threads x NCCL_STEPS x 16-byte lines (src/init.cc)
NCCL_CHANNELS = 32                # MAXCHANNELS (src/include/device.h): the most channels a communicator opens
NCCL_P2P_CHANNELS_PER_PEER = 2    # point-to-point channels per peer (NCCL_NCHANNELS_PER_NET_PEER default)


@dataclass(frozen=True)
class MemoryConstants:
    """The fitted constants of the memory model.

    Attributes:
        overhead_bytes: fixed per-GPU bytes nothing else names (see the module doc, **overhead**).
        activation_scale: multiplier on the listed activation tensors.
    """

    overhead_bytes: float
    activation_scale: float


# Fitted by `python scripts/calibrate_memory.py` (least mean |predicted/published - 1| over the fit subset of the
# memory rows in tests/published.py: M1, M3, M5, Q1, Q3, Q5; the others are held out, docs/accuracy.md).
CALIBRATED = MemoryConstants(overhead_bytes=3.8e9, activation_scale=0.84)

# Predicted / published peak of the three Qwen3-Next rows (docs/accuracy.md, N1-N3: layout unpublished, measurement
# method unknown) with gated DeltaNet priced from megatron-core's implementation: the range the memory/uncalibrated
# warning quotes and the planner's safety factor (lcmoe_recipes.planner.search.UNCALIBRATED_FACTOR). A test recomputes it.
# The rows price the bf16 gradient reduction of the upstream recipe that ran (with our recipes' fp32 gradients they read
# 0.50-0.83) and upstream's lighter MTP/loss stage.
GDN_MEASURED_RATIOS = (0.45, 0.78)

# What the caching allocator holds at the peak (sums to ``total``); OUTSIDE lives in HBM outside it.
COMPONENTS = ("parameters", "weight_cache", "gradients", "optimizer", "activations", "transient", "cuda_graphs",
              "workspace", "overhead")
OUTSIDE = ("dispatcher", "cuda_context", "nccl", "userbuffers")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per component on one pipeline rank: :data:`COMPONENTS` sum to ``total`` (the caching allocator's peak);
    ``dispatcher`` (outside the allocator) adds to it in ``hbm_total``."""

    pp_rank: int
    parameters: float
    gradients: float
    optimizer: float
    activations: float
    transient: float
    overhead: float
    weight_cache: float = 0.0
    cuda_graphs: float = 0.0
    workspace: float = 0.0
    dispatcher: float = 0.0
    cuda_context: float = 0.0
    nccl: float = 0.0
    userbuffers: float = 0.0
    detail: dict[str, float] = field(default_factory=dict, compare=False)

    @cached_property
    def total(self) -> float:
        """The caching allocator's peak (what ``torch.cuda.max_memory_allocated`` measures), bytes."""
        return (self.parameters + self.weight_cache + self.gradients + self.optimizer + self.activations
                + self.transient + self.cuda_graphs + self.workspace + self.overhead)  # COMPONENTS, in order

    @cached_property
    def outside(self) -> float:
        """Bytes of HBM outside PyTorch's caching allocator: :data:`OUTSIDE` (dispatcher, CUDA context, NCCL,
        userbuffers)."""
        return self.dispatcher + self.cuda_context + self.nccl + self.userbuffers  # OUTSIDE, in order

    @cached_property
    def hbm_total(self) -> float:
        """``total`` plus what lives outside the allocator (:attr:`outside`), bytes."""
        return self.total + self.outside

    def budget(self, hbm_bytes: float, margin: float) -> list[tuple[str, float]]:
        """The whole HBM budget of this rank, in GiB, as (line, GiB): the allocator's components and their total,
        the lines outside the allocator (:data:`OUTSIDE`), the fragmentation margin (``margin`` x HBM: module doc),
        and what is left free of HBM (negative: over budget)."""
        gib = self.gib()
        lines = [(n, gib[n]) for n in COMPONENTS] + [("allocator peak", gib["total"])]
        lines += [(n, getattr(self, n) / 2**30) for n in OUTSIDE]
        lines += [("fragmentation margin", margin * hbm_bytes / 2**30),
                  ("free", (hbm_bytes * (1 - margin) - self.hbm_total) / 2**30)]
        return lines

    def gib(self) -> dict[str, float]:
        """:data:`COMPONENTS` and their total in GiB (2**30 bytes); the dispatcher buffers are not among them."""
        return {n: getattr(self, n) / 2**30 for n in (*COMPONENTS, "total")}


def _softmax_attention(s: LayerShapes, n: float, tp: int, out: dict) -> None:
    """Softmax attention (MLA, GQA full or sliding window): what it keeps for backward.

    GQA (megatron-core ``transformer/attention.py``, ``SelfAttention``; TE ``DotProductAttention``): the fused
    linear_qkv output (nq + 2·nkv heads; its v is a view the attention saves), one more q and k after the q/k norm
    and RoPE, the attention output (saved by linear_proj) and the fp32 log-sum-exp -- never the s x s scores (flash /
    fused attention). With q/k norms: the q the norm saves is a copy when a TP rank holds more than one query group
    (``get_query_key_value_tensors`` reshapes a non-contiguous split of the fused output), and each norm keeps an
    fp32 statistic per token and head. The same with a sliding window (TE keeps the same tensors; only the FLOPs
    shrink), and with context parallelism: the p2p ring saves the last received K/V buffer in place of this rank's
    own, a2a swaps sequence and heads at the same size (TE ``context_parallel.py``, ``AttnFuncWithCPAndKVP2P`` /
    ``AttnFuncWithCPAndQKVOA2A``). ``core_attn`` recompute frees only the log-sum-exp.

    MLA (``transformer/multi_latent_attention.py``, ``MLASelfAttention``, with megatron-core's fused YaRN RoPE
    ``fusions/fused_mla_yarn_rope_apply.py``): the down projections' outputs and their norms' outputs (the kv norm
    covers the kv_lora part) with an fp32 statistic per token each, and the roped q (in place over the q up
    projection's output), the new key and value the attention saves -- the kv up projection's output is not kept.
    ``mla_up_proj`` recompute drops q, k and v. Measured against megatron-core's own layer by
    :mod:`lcmoe_recipes.emit.probe.activations` (tests/test_activations.py).
    """
    if s.mla:  # megatron-core transformer/multi_latent_attention.py, MLASelfAttention
        if s.q_lora:
            out["q_down_out"] = (n * s.q_lora * BF16 * 2, ())
        out["kv_down_out"] = (n * (s.kv_lora + s.d_rope + s.kv_lora) * BF16, ())
        out["latent_norm_stats"] = (n * (2 if s.q_lora else 1) * FP32, ())
        out["qkv_rope"] = (n * s.nq * (2 * s.d_qk + s.d_v) * BF16 / tp, ("mla_up_proj",))
    else:
        out["qkv"] = (n * (2 * s.nq + 3 * s.nkv) * s.d_qk * BF16 / tp, ())
        if s.qk_norm:
            if s.nkv > tp:  # more than one query group per TP rank: the q the norm saves is a reshaped copy
                out["q_norm_input"] = (n * s.nq * s.d_qk * BF16 / tp, ())
            out["qk_norm_stats"] = (n * (s.nq + s.nkv) * FP32 / tp, ())
        if s.out_gate:  # Qwen3-Next full attention: sigmoid output gate
            out["attn_gate"] = (n * s.nq * s.d_v * BF16 / tp, ())
    out["attn_out"] = (n * s.nq * s.d_v * BF16 / tp, ())
    out["softmax_lse"] = (n * s.nq * FP32 / tp, ("core_attn",))


def _gated_delta_net(s: LayerShapes, n: float, tp: int, out: dict) -> None:
    """Gated DeltaNet: what megatron-core 0.19.2 ``ssm/gated_delta_net/gdn.py`` (``GatedDeltaNet.forward``) and the
    FLA kernels it calls keep for backward, per token (the CP all-to-all hands each rank the whole sequence for 1/CP
    of the heads: the same element count as n tokens of all heads).

    * the in_proj output (q, k, v, gate z, beta, alpha: 2·nk·dk + 2·nv·dv + 2·nv), kept alive by the causal
      convolution, which saves its input (FLA ``causal_conv1d``);
    * the L2-normalised q and k (FLA ``l2norm`` saves its output), and the gated-delta-rule kernel's own q and k
      -- copies repeated to nv heads when nv > nk (``repeat_interleave``), v (a contiguous copy), the fp32 chunk
      cumulative decay g and beta, and the chunk-local WY matrix A (nv x 64 per token): FLA
      ``ChunkGatedDeltaRuleFunction.forward`` saves q, k, v, g, beta, A (the chunk states h are recomputed in
      backward);
    * the gate z (a contiguous copy) and the kernel's output, saved by the gated RMSNorm;
    * the normalised, gated output after the all-to-all back (saved by out_proj): what ``gdn_norm_out`` recompute
      drops (``CheckpointWithoutOutput`` around ``_gated_norm_and_a2a``).
    """
    nk, nv, dk, dv = s.lin_nk, s.lin_nv, s.lin_dk, s.lin_dv
    t = n / tp
    out["gdn_in_proj_out"] = (t * (2 * nk * dk + 2 * nv * dv + 2 * nv) * BF16, ())
    out["gdn_qk_l2norm"] = (t * 2 * nk * dk * BF16, ())
    out["gdn_kernel_qkv"] = (t * ((2 * nv * dk if nv > nk else 0) + nv * dv) * BF16, ())
    out["gdn_kernel_g_beta_a"] = (t * nv * (FP32 + BF16 + GDN_CHUNK * BF16), ())
    out["gdn_gate"] = (t * nv * dv * BF16, ())
    out["gdn_core_out"] = (t * nv * dv * BF16, ())
    out["gdn_norm_out"] = (t * nv * dv * BF16, ("gdn_norm_out",))


def layer_activations(s: LayerShapes, layer: int, plan: Plan) -> dict[str, tuple[float, tuple[str, ...]]]:
    """Tensors layer ``layer`` keeps for backward, per microbatch: name -> (bytes, recompute modules that drop it).

    By layer part: the layer input and the input norm's output (a separate norm -- MLA -- is dropped by
    ``layernorm`` recompute; GQA and gated DeltaNet fuse it into their first linear layer, megatron-core
    ``models/gpt/gpt_layer_specs.py`` / ``experimental_attention_variant_module_specs.py``, so it stays); the
    attention by kind (:func:`_softmax_attention`, :func:`_gated_delta_net`); the MLP input and the pre-MLP norm
    output (a separate norm in MoE layers: dropped by ``layernorm`` where megatron-core recomputes it,
    :func:`pre_mlp_norm_recomputed`; in a dense layer TE's layer spec fuses it into the MLP's first linear layer,
    ``TELayerNormColumnParallelLinear`` in megatron-core 0.19.2 ``models/gpt/gpt_layer_specs.py``
    ``get_mlp_module_spec_for_backend``, so ``layernorm`` drops nothing there: real jobs run that spec); the MoE block -- router scores, the routed
    token copies the experts' grouped GEMMs save (fc1 input: the dispatcher's permuted output; fc1 output; the
    activation output already multiplied by the routing probabilities, fc2's input -- megatron-core 0.19.2
    ``transformer/moe/experts.py`` applies the probabilities after the activation, so the unpermute keeps no fc2
    output), the permuted probabilities, shared experts -- or the dense MLP.
    """
    lay = plan.layout
    return layer_tensors(s, layer, plan.micro_batch_size * plan.seq_length / lay.cp, lay.tp, lay.etp,
                         plan.sequence_parallel, pre_mlp_norm_recomputed(plan))


def applied_recompute_modules(plan: Plan) -> tuple[str, ...]:
    """The selective recompute modules megatron-core 0.19.2 applies for ``plan`` (:func:`applied_modules`)."""
    return applied_modules(tuple(plan.recompute_modules), plan.use_transformer_engine_op_fuser)


def applied_modules(modules: tuple[str, ...], op_fuser: bool) -> tuple[str, ...]:
    """``modules`` less ``moe_act`` under Transformer Engine's op fuser (``op_fuser``): ``TEGroupedMLP.forward`` then
    runs ``_fused_forward``, and only the unfused path checkpoints the activation (``activation_recompute``,
    megatron-core 0.19.2 ``transformer/moe/experts.py``), so the activation output stays saved."""
    if op_fuser and "moe_act" in modules:
        return tuple(m for m in modules if m != "moe_act")
    return modules


def pre_mlp_norm_recomputed(plan: Plan) -> bool:
    """Whether megatron-core recomputes a MoE layer's pre-MLP norm under the ``layernorm`` recompute module: not when
    the router is TE-graphed (``moe_router`` in ``cuda_graph_modules``, impl not "local") unless ``moe_preprocess`` is
    graphed too with the alltoall dispatcher -- the norm's output is then a graph output in a static buffer
    (megatron-core 0.19.2 ``transformer/transformer_layer.py`` ``TransformerLayer.__init__``,
    ``can_recompute_pre_mlp_layernorm_for_cudagraph``, which logs the warning). Shared-expert overlap, which also
    disables it there, is not a Plan field (our configs leave it off with graphed routers)."""
    graphs = set(plan.cuda_graph_modules)
    if plan.cuda_graph_impl == "local" or "moe_router" not in graphs:
        return True
    return "moe_preprocess" in graphs and plan.moe_token_dispatcher_type == "alltoall"


def layer_activations_kept(s: LayerShapes, layer: int, tokens: float, tp: int, etp: int, sequence_parallel: bool,
                           granularity: str | None, modules: tuple[str, ...], pre_mlp_norm_recompute: bool = True,
                           te_spec: bool = True) -> float:
    """Bytes layer ``layer`` keeps for backward for ``tokens`` per CP rank (MBS·seq_length/CP) under the recompute
    setting: the table of :func:`layer_activations`, unscaled. ``pre_mlp_norm_recompute``:
    :func:`pre_mlp_norm_recomputed` of the plan. ``te_spec``: the layer spec priced -- True (what jobs run):
    megatron-core's Transformer Engine spec, whose dense MLP's first linear layer holds the pre-MLP norm; False:
    megatron-core's local spec (``get_gpt_layer_local_submodules``), where that norm is a module of its own, as
    ``lcmoe_recipes.emit.probe.activations`` builds and measures it. The input norm is priced as TE's in both (the
    probe's tests account for the local spec's separate one)."""
    return _kept_bytes(layer_tensors(s, layer, tokens, tp, etp, sequence_parallel, pre_mlp_norm_recompute, te_spec),
                       granularity, modules)


def layer_tensors(s: LayerShapes, layer: int, n: float, tp: int, etp: int, sequence_parallel: bool,
                  pre_mlp_norm_recompute: bool = True, te_spec: bool = True
                  ) -> dict[str, tuple[float, tuple[str, ...]]]:
    """:func:`layer_activations` for ``n`` tokens on this rank (MBS·seq_length/CP); a MoE layer's pre-MLP norm is
    dropped by ``layernorm`` only where ``pre_mlp_norm_recompute`` (:func:`pre_mlp_norm_recomputed`), a dense
    layer's only in the local spec (``te_spec`` False: :func:`layer_activations_kept`)."""
    nsp = n / tp if sequence_parallel else n                      # tokens in sequence-sharded regions
    h = s.h
    input_norm = ("layernorm",) if s.mla else ()
    out: dict[str, tuple[float, tuple[str, ...]]] = {
        "layer_input": (nsp * h * BF16, ()),
        "input_norm_out": (nsp * h * BF16, input_norm),
        "input_norm_stats": (nsp * FP32, input_norm),  # RMSNorm's fp32 1/rms per token (TE keeps it)
    }
    if s.is_softmax(layer):
        _softmax_attention(s, n, tp, out)
    else:
        _gated_delta_net(s, n, tp, out)
    out["pre_mlp_input"] = (nsp * h * BF16, ())
    separate = s.is_moe(layer) or not te_spec  # TE's dense MLP: the norm inside linear_fc1 (nothing to recompute)
    pre_mlp_norm = ("layernorm",) if separate and (pre_mlp_norm_recompute or not s.is_moe(layer)) else ()
    out["pre_mlp_norm_out"] = (nsp * h * BF16, pre_mlp_norm)
    out["pre_mlp_norm_stats"] = (nsp * FP32, pre_mlp_norm)
    if s.is_moe(layer):
        routed = nsp * s.topk                                   # token copies this rank's experts process
        moe = ("moe",)
        out["router_probs"] = (nsp * s.num_experts * FP32 * 2, moe)
        out["expert_fc1_in"] = (routed * h * BF16, moe)
        out["expert_probs"] = (routed * FP32, moe)
        out["expert_fc1_out"] = (routed * 2 * s.f_expert * BF16 / etp, moe)
        out["expert_act_out"] = (routed * s.f_expert * BF16 / etp, moe + ("moe_act",))
        if s.f_shared:
            shared = ("moe", "shared_experts")
            out["shared_fc1_out"] = (n * 2 * s.f_shared * BF16 / tp, shared)
            out["shared_act_out"] = (n * s.f_shared * BF16 / tp, shared)
    else:
        out["mlp_fc1_out"] = (n * 2 * s.f_dense * BF16 / tp, ("mlp",))
        out["mlp_act_out"] = (n * s.f_dense * BF16 / tp, ("mlp",))
    return out


def dispatcher_buffer_bytes(plan: Plan) -> float:
    """Bytes of the flex dispatcher's static buffers on one rank (outside PyTorch's allocator; module doc)."""
    lay = plan.layout
    if plan.moe_token_dispatcher_type != "flex" or lay.ep * lay.etp <= 1:
        return 0.0
    n = plan.micro_batch_size * plan.seq_length / lay.cp
    local = n / lay.tp if (plan.sequence_parallel or lay.tp == 1) else n
    return _dispatcher_bytes(plan.model, plan.moe_flex_dispatcher_backend, lay.ep * lay.etp, local)


@lru_cache(maxsize=4096)
def _dispatcher_bytes(model_key: str, backend: str | None, ranks: int, local_tokens: float) -> float:
    from ..catalog import get_model

    s = shapes(get_model(model_key))
    if not s.num_experts:
        return 0.0
    if backend == "deepep":
        hidden = s.h * BF16
        nvl_ranks, rdma_ranks = min(ranks, DEEPEP_NVL_PEERS), max(ranks // DEEPEP_NVL_PEERS, 1)
        nearest = ranks if ranks in DEEPEP_RECV else min(DEEPEP_RECV, key=lambda r: abs(r - ranks))
        nvl_recv, rdma_recv = DEEPEP_RECV[nearest]
        channels = DEEPEP_SMS // 2
        per_token = hidden + 8 + 128 * 8 + 128 * 4 + 128 * 4   # data, source meta, top-k idx/weights, scales
        nvl = channels * nvl_ranks * (nvl_recv * per_token + (2 * rdma_ranks + 3) * 4)
        rdma = 0 if ranks <= DEEPEP_NVL_PEERS else channels * rdma_ranks * (
            rdma_recv * 2 * (per_token + 16) + (DEEPEP_NVL_PEERS * 2 + 2) * 2 * 4)
        return float(nvl + rdma)
    if backend == "hybridep":
        tokens = local_tokens * ranks
        return tokens * (s.h * BF16 + s.num_experts * FP32 + s.h / 128 * FP32)
    return 0.0


def nccl_buffer_bytes(plan: Plan, buffsize: int = NCCL_BUFFSIZE) -> float:
    """Bytes of NCCL communicator buffers on one rank (module doc, **nccl**), by the groups it uses in training:

    * collectives -- TP (sequence-parallel all-gather / reduce-scatter), DP·CP (the distributed optimizer's gradient
      reduce-scatter and parameter all-gather of dense parameters), EDP (the same for experts), and the
      model-parallel group's gradient-norm and loss all-reduces: each group larger than one rank keeps
      ``NCCL_CHANNELS`` x (``buffsize`` + LL128 + LL) bytes;
    * point-to-point -- PP (previous and next stage), the CP ring (its two neighbours) or CP all-to-all (CP - 1
      peers), and EP all-to-all for the alltoall / allgather dispatchers (EP·ETP - 1 peers; the flex dispatcher's
      DeepEP / HybridEP use their own buffers, **dispatcher**): ``NCCL_P2P_CHANNELS_PER_PEER`` x ``buffsize`` per
      peer.

    ``buffsize``: the ``NCCL_BUFFSIZE`` the job runs with (default NCCL's 4 MiB).
    """
    lay = plan.layout
    collective = [g for g in (lay.tp, lay.dp * lay.cp, lay.edp, lay.tp * lay.pp * lay.cp) if g > 1]
    peers = (2 if lay.pp > 1 else 0)
    if lay.cp > 1:
        peers += lay.cp - 1 if plan.cp_comm_type in ("a2a", "all_gather") else 2
    if plan.moe_token_dispatcher_type != "flex" and lay.ep * lay.etp > 1:
        peers += lay.ep * lay.etp - 1
    return float(len(collective) * NCCL_CHANNELS * (buffsize + NCCL_LL128 + NCCL_LL)
                 + peers * NCCL_P2P_CHANNELS_PER_PEER * buffsize)


def cuda_graph_bytes(plan: Plan, graphed_layers: float) -> float:
    """Static buffers of Transformer Engine CUDA graphs beyond the saved activations (module doc, **cuda_graphs**):
    ``graphed_layers`` layer-input-sized buffers (an input and an output per captured segment kind)."""
    if plan.cuda_graph_impl != "transformer_engine":
        return 0.0
    lay = plan.layout
    n = plan.micro_batch_size * plan.seq_length / lay.cp
    nsp = n / lay.tp if plan.sequence_parallel else n
    return graphed_layers * nsp * shapes(plan.model_spec).h * BF16


def workspace_bytes(plan: Plan) -> float:
    """cuBLAS workspaces (module doc, **workspace**): TE's per GEMM stream (the plain one repeated per userbuffers
    stream under ``tp_comm_overlap``) and PyTorch's."""
    repeats = UB_STREAMS - 1 if tp_overlap(plan)[0] else 0
    return float((TE_WORKSPACES + repeats) * TE_WORKSPACE + TORCH_WORKSPACE)


def userbuffer_bytes(plan: Plan) -> float:
    """Bytes of Transformer Engine's userbuffers on one GPU under ``tp_comm_overlap`` (module doc,
    **userbuffers**): :data:`UB_BUFFERS` buffers of [seq_length x MBS / CP, hidden], BF16, the
    :data:`UB_ALL_GATHER_BUFFERS` all-gather ones one byte per element under an FP8 recipe; 0 without the overlap."""
    if not tp_overlap(plan)[0]:
        return 0.0
    rows = plan.micro_batch_size * plan.seq_length / plan.layout.cp
    per_row_element = UB_BUFFERS * BF16 - (UB_ALL_GATHER_BUFFERS * (BF16 - 1) if plan.precision != "bf16" else 0)
    return float(rows * shapes(plan.model_spec).h * per_row_element)


def master_weight_bytes(plan: Plan) -> int:
    """Bytes per fp32 master weight the optimizer keeps on the GPU.

    With the precision-aware optimizer on GPU (TE FusedAdam) and bf16 params, megatron-core's default
    ``store_param_remainders=True`` keeps only the low 16 bits of each fp32 master weight (the bf16 param holds the
    high 16): 2 bytes. CPU offload (HybridDeviceOptimizer) keeps full fp32 masters: 4 bytes.
    Source: megatron-core 0.19.2 ``OptimizerConfig.store_param_remainders``.
    """
    if plan.use_precision_aware_optimizer and not plan.optimizer_cpu_offload:
        return BF16
    return FP32


def _kept_bytes(tensors: dict[str, tuple[float, tuple[str, ...]]], granularity: str | None,
                modules: tuple[str, ...]) -> float:
    if granularity == "full":
        return tensors["layer_input"][0]
    dropped = set(modules) if granularity == "selective" else set()
    return sum(b for b, by in tensors.values() if not dropped.intersection(by))


@lru_cache(maxsize=16384)
def _layer_bytes(model_key: str, layer: int, n: float, tp: int, etp: int, sequence_parallel: bool,
                 granularity: str | None, modules: tuple[str, ...], pre_mlp_norm_recompute: bool = True
                 ) -> tuple[float, float]:
    """(bytes kept for backward under the recompute setting, bytes of every listed tensor) of one layer: layers of
    one kind repeat across the search's candidates, so this is priced once per kind and shape."""
    from ..catalog import get_model

    tensors = layer_tensors(shapes(get_model(model_key)), layer, n, tp, etp, sequence_parallel, pre_mlp_norm_recompute)
    return _kept_bytes(tensors, granularity, modules), sum(b for b, _ in tensors.values())


@lru_cache(maxsize=4096)
def _in_flight(pp: int, vpp: int, micro: int, pp_rank: int, extra: int = 0) -> tuple[int, ...]:
    """How many of ``micro`` microbatches of each of pipeline rank ``pp_rank``'s model chunks are alive at the peak
    (megatron-core's 1F1B and interleaved schedules); ``extra``: warm-up forwards the schedule runs beyond the
    interleaved default (:func:`ep_overlap_warmup`)."""
    if vpp == 1:
        return (min(pp - pp_rank, micro),)
    warmup = min((pp - pp_rank - 1) * 2 + (vpp - 1) * pp + extra, micro * vpp)
    alive = warmup + 1
    counts = [0] * vpp
    chunk = 0
    while alive > 0:  # microbatches go through chunk 0 in groups of PP, then chunk 1, ...
        take = min(pp, alive)
        counts[chunk % vpp] += take
        alive -= take
        chunk += 1
    return tuple(min(c, micro) for c in counts)


def ep_overlap_warmup(plan: Plan) -> int:
    """Model-chunk forwards the interleaved schedule runs before its first backward beyond the default: 1 when the
    EP all-to-all overlap runs (``overlap_moe_expert_parallel_comm``, EP > 1) with VPP, else 0. megatron-core 0.19.2
    ``pipeline_parallel/schedules.py`` ``get_pp_rank_microbatches`` adds one warm-up microbatch then ("needed to ensure
    the forward and backward computations are independent in all 1f1b steps"), and each steady step of
    ``combined_1f1b.py`` runs a forward beside a backward, layer by layer (what the forward keeps grows as the
    backward frees): every rank keeps one more model chunk's activations in flight. Without VPP the overlap's
    schedule (PP = 1, ``combined_1f1b_schedule_for_no_pipelining``) pairs each forward with a backward the same way
    and keeps what 1F1B keeps."""
    return int(plan.moe_ep_overlap and plan.layout.ep > 1 and (plan.layout.vpp or 1) > 1)


@dataclass(frozen=True)
class _RankStatic:
    """What a pipeline rank holds, independent of TP/EP and the knobs: parameter counts (before the TP and EP
    splits), its layers by kind per model chunk, and whether it has the first / last stage."""

    dense: float          # split by TP
    replicated: float     # whole on every TP rank (norms, router, MLA down projections, ...: shapes.py)
    experts: float
    embed: float          # embedding / output-layer params among ``dense`` (lookups and a bf16 GEMM: not FP8-cached)
    chunk_kinds: tuple[tuple[tuple[tuple[bool, str], int], ...], ...]
    representative: tuple[int, ...]
    first: bool
    last: bool


@lru_cache(maxsize=4096)
def _rank_static(model_key: str, stages: tuple[int, ...], pp: int, vpp: int, mtp: int, pp_rank: int) -> _RankStatic:
    """Parameters of pipeline rank ``pp_rank``, as megatron-core 0.19.2 places them (``models/gpt/gpt_model.py``,
    ``transformer/transformer_block.py``, ``transformer/multi_token_prediction.py``):

    * the word embedding on the first stage, and again on the MTP stage (``GPTModel`` builds it when
      ``pre_process or mtp_process``: the MTP layers embed the shifted tokens themselves);
    * the output layer on the last stage (tied to the embedding, the last stage still holds its own copy when it is
      not also the first: ``LanguageModule.setup_embeddings_and_output_layer``);
    * the decoder's final norm on the stage that runs the last decoder layer when the model has MTP layers
      (``TransformerBlock.has_final_layernorm_in_this_stage``), else on the last stage;
    * per MTP layer (last stage): a transformer layer of the last decoder layer's kind, the 2h x h projection
      ``eh_proj`` (TP-split) and three norms (``enorm``, ``hnorm``, ``final_layernorm``).
    """
    from ..catalog import get_model

    s = shapes(get_model(model_key))
    starts = [sum(stages[:i]) for i in range(len(stages))]
    chunks = [pp_rank + v * pp for v in range(vpp)]
    layers = [list(range(starts[c], starts[c] + stages[c])) for c in chunks]
    first, last = 0 in chunks, (pp * vpp - 1) in chunks
    every = [i for ch in layers for i in ch]
    replicated = float(sum(s.layer_replicated_params(i) for i in every))
    dense = float(sum(s.layer_dense_params(i) for i in every)) - replicated
    experts = float(sum(s.layer_expert_params(i) for i in every))
    embed = 0.0
    if first:
        dense += s.embedding
        embed += s.embedding
    final_norm_stage = max(i for i, n in enumerate(stages) if n) if mtp else len(stages) - 1
    if final_norm_stage in chunks:
        replicated += s.h
    if last:
        out = s.embedding if (not s.tied or not first) else 0
        mtp_embedding = s.embedding if mtp and not first else 0
        mtp_layer = s.num_layers - 1
        mtp_replicated = s.layer_replicated_params(mtp_layer) + 3 * s.h
        dense += out + mtp_embedding + mtp * (s.layer_dense_params(mtp_layer) + 2 * s.h * s.h + 3 * s.h
                                              - mtp_replicated)
        replicated += mtp * mtp_replicated
        embed += out + mtp_embedding
        experts += mtp * s.layer_expert_params(mtp_layer)
    kinds, reps = [], {}
    for ch in layers:
        counts: dict[tuple[bool, str], int] = {}
        for i in ch:
            kind = (s.is_moe(i), s.kind(i))
            counts[kind] = counts.get(kind, 0) + 1
            reps.setdefault(kind, i)
        kinds.append(tuple(counts.items()))
    if last and mtp:
        reps.setdefault((s.is_moe(s.num_layers - 1), s.kind(s.num_layers - 1)), s.num_layers - 1)
    return _RankStatic(dense, replicated, experts, embed, tuple(kinds), tuple(reps.values()), first, last)


@lru_cache(maxsize=65536)
def _activation_terms(model_key: str, static: _RankStatic, n: float, tp: int, etp: int, sequence_parallel: bool,
                      granularity: str | None, modules: tuple[str, ...], mtp: int, logits: float,
                      in_flight: tuple[int, ...], graph_modules: tuple[str, ...], pre_mlp_norm_recompute: bool = True
                      ) -> tuple[float, float, int]:
    """(listed activation bytes alive at the peak, the largest layer's listed bytes, CUDA-graph buffers) of one
    rank: what :func:`rank_memory` derives from the layers' tensors. It depends on neither EP nor the batch beyond
    the microbatches in flight, so the search's layouts that differ only there share it."""
    from ..catalog import get_model

    s = shapes(get_model(model_key))
    by_kind = {(s.is_moe(layer), s.kind(layer)): _layer_bytes(model_key, layer, n, tp, etp, sequence_parallel,
                                                              granularity, modules, pre_mlp_norm_recompute)
               for layer in static.representative}  # layers of one kind keep the same tensors
    per_chunk = [sum(count * by_kind[kind][0] for kind, count in chunk) for chunk in static.chunk_kinds]
    largest_layer = max((by_kind[kind][1] for chunk in static.chunk_kinds for kind, _ in chunk), default=0.0)
    if mtp:
        mtp_kept, _ = _layer_bytes(model_key, s.num_layers - 1, n, tp, etp, sequence_parallel, granularity, modules,
                                   pre_mlp_norm_recompute)
        per_chunk[-1] += mtp * (mtp_kept + logits)
    listed = sum(k * c for k, c in zip(per_chunk, in_flight))
    graphed = 2 * len({seg for chunk in static.chunk_kinds for kind, _ in chunk
                       for seg in _segment_kinds(graph_modules, kind)})
    return listed, largest_layer, graphed


def _segment_kinds(graph_modules: tuple[str, ...], kind: tuple[bool, str]) -> set[str]:
    """Captured segment kinds of a layer of ``kind`` = (is MoE, attention kind) under TE CUDA-graph modules
    ``graph_modules`` (megatron-core 0.19.2 ``CudaGraphModule``; [] = the whole layer)."""
    modules = set(graph_modules)
    if not modules:
        return {"layer"}
    out = {"attn"} if "attn" in modules else set()
    if kind[0] and modules & {"moe_router", "moe_preprocess", "moe"}:
        out.add("moe")
    if not kind[0] and "mlp" in modules:
        out.add("mlp")
    return out


def estimate_memory(plan: Plan, constants: MemoryConstants = CALIBRATED) -> MemoryBreakdown:
    """Memory breakdown of the most loaded pipeline rank of ``plan`` (see the module doc; the lowest rank on a tie)."""
    return max((rank_memory(plan, r, constants) for r in peak_ranks(plan)), key=lambda m: m.total)


def memory_key(plan: Plan) -> Plan:
    """``plan`` with the fields :func:`rank_memory` does not read set to fixed values: the CP exchange reduced to
    what the NCCL buffers see (an all-to-all or all-gather reaches CP - 1 peers, the ring and hierarchical exchanges
    two: :func:`nccl_buffer_bytes`), no hierarchical sizes, the EP overlap only where it adds a warm-up microbatch
    (:func:`ep_overlap_warmup`). Plans with equal keys have equal memory on
    every rank; a new dependency of the memory model on one of these fields must be taken out of here."""
    return plan.with_changes(cp_comm_type="a2a" if plan.cp_comm_type in ("a2a", "all_gather") else "p2p",
                             hierarchical_cp_sizes=None, moe_ep_overlap=bool(ep_overlap_warmup(plan)))


def peak_ranks(plan: Plan) -> tuple[int, ...]:
    """The pipeline ranks of ``plan`` whose memory can be the most loaded rank's, ascending. A rank is left out when
    a lower rank holds the same parameters and the same layers per model chunk and keeps at least as many
    microbatches of each chunk in flight: every term of :func:`rank_memory` but the activations depends only on what
    a rank holds, and the activations grow with the microbatches in flight, so the left-out rank never uses more
    (on a tie the lower rank is the one reported). In 1F1B the first ranks keep the most in flight, so a long
    pipeline of identical middle stages is priced at one or two of them."""
    lay = plan.layout
    return _peak_ranks(plan.model_spec.key, stage_decoder_layers(plan), lay.pp, lay.vpp or 1, plan.mtp_num_layers,
                       max(1, plan.num_microbatches), ep_overlap_warmup(plan))


@lru_cache(maxsize=4096)
def _peak_ranks(model_key: str, stages: tuple[int, ...], pp: int, vpp: int, mtp: int, micro: int,
                extra: int = 0) -> tuple[int, ...]:
    kept: list[tuple[int, tuple, tuple[int, ...]]] = []
    for r in range(pp):
        static = _rank_static(model_key, stages, pp, vpp, mtp, r)
        holds = (static.dense, static.replicated, static.experts, static.embed, static.chunk_kinds, static.first,
                 static.last)  # not the representative layer indices: layers of one kind keep the same tensors
        flight = _in_flight(pp, vpp, micro, r, extra)
        if not any(h == holds and all(a >= b for a, b in zip(f, flight)) for _, h, f in kept):
            kept.append((r, holds, flight))
    return tuple(r for r, _, _ in kept)


def _rank_params(plan: Plan, pp_rank: int):
    """(static counts of pipeline rank ``pp_rank``, its dense parameters per GPU, its expert parameters per GPU)."""
    lay = plan.layout
    static = _rank_static(plan.model_spec.key, stage_decoder_layers(plan), lay.pp, lay.vpp or 1, plan.mtp_num_layers,
                          pp_rank)
    return (static, *_per_gpu(static, lay))


def _per_gpu(static: _RankStatic, lay) -> tuple[float, float]:
    """(dense parameters per GPU, expert parameters per GPU) of a rank holding ``static``: dense split by TP (the
    replicated ones whole), experts by EP x ETP."""
    return static.dense / lay.tp + static.replicated, static.experts / (lay.ep * lay.etp)


def optimizer_shard_params(plan: Plan, pp_rank: int) -> float:
    """Parameters (elements) of one GPU's distributed-optimizer shard on pipeline rank ``pp_rank``: its dense
    parameters over DP x CP plus its expert parameters over EDP (megatron-core 0.19.2 ``DistributedOptimizer`` shards
    each gradient buffer over its data-parallel group). What :func:`rank_memory` reports as
    ``optimizer_shard_params``, without pricing the rest of the rank."""
    _, dense, experts = _rank_params(plan, pp_rank)
    return _shard(plan.layout, dense, experts)


def _shard(lay, dense: float, experts: float) -> float:
    return dense / (lay.dp * lay.cp) + experts / lay.edp


_FIXED: dict[tuple, dict[str, float]] = {}


def _fixed_buffers(plan: Plan) -> dict[str, float]:
    """The buffers of ``plan`` that no recompute or offload choice changes -- cuBLAS workspaces, the dispatcher's,
    NCCL's and the userbuffers (:func:`workspace_bytes`, :func:`dispatcher_buffer_bytes`, :func:`nccl_buffer_bytes`,
    :func:`userbuffer_bytes`) -- priced once per layout and the settings they read (the search prices every rung
    of a layout's ladder on every pipeline rank)."""
    key = (plan.model, plan.layout, plan.micro_batch_size, plan.seq_length, plan.sequence_parallel,
           plan.moe_token_dispatcher_type, plan.moe_flex_dispatcher_backend, plan.cp_comm_type, plan.tp_comm_overlap,
           plan.precision)
    found = _FIXED.get(key)
    if found is None:
        if len(_FIXED) > 65536:  # a long-lived process planning many targets: start again
            _FIXED.clear()
        found = _FIXED[key] = {"workspace": workspace_bytes(plan), "dispatcher": dispatcher_buffer_bytes(plan),
                               "nccl": nccl_buffer_bytes(plan), "userbuffers": userbuffer_bytes(plan)}
    return found


class _PlanMemory(NamedTuple):
    """What :func:`rank_memory` reads of a plan that is the same on every pipeline rank."""

    key: str                          # the model
    vocab: int
    stages: tuple[int, ...]           # decoder layers per PP x VPP chunk
    grad_bytes: int
    state_bytes: int                  # optimizer state per shard parameter: master weight and two moments
    on_gpu: float                     # the share of the optimizer state left on the GPU
    n: float                          # tokens of one microbatch on a rank (MBS x seq_length / CP)
    micro: int                        # microbatches per step, at least 1
    warmup: int                       # extra warm-up microbatches (ep_overlap_warmup)
    modules: tuple[str, ...]          # the recompute modules that apply
    graph_modules: tuple[str, ...]
    pre_mlp_norm: bool
    fp8_cached: bool
    fixed: dict[str, float]           # _fixed_buffers


def _plan_memory(plan: Plan) -> _PlanMemory:
    """:class:`_PlanMemory` of ``plan``, worked out once per plan (the search prices several PP ranks of each)."""
    found = plan.__dict__.get("_memory")
    if found is None:
        lay = plan.layout
        state = master_weight_bytes(plan) + 2 * (FP32 if plan.effective_moment_dtype == "fp32" else BF16)
        found = _PlanMemory(
            plan.model, shapes(plan.model_spec).vocab, stage_decoder_layers(plan),
            FP32 if plan.grad_dtype == "fp32" else BF16, state,
            1.0 - (plan.optimizer_offload_fraction if plan.optimizer_cpu_offload else 0.0),
            plan.micro_batch_size * plan.seq_length / lay.cp, max(1, plan.num_microbatches), ep_overlap_warmup(plan),
            applied_recompute_modules(plan), tuple(plan.cuda_graph_modules), pre_mlp_norm_recomputed(plan),
            plan.precision in FP8_CACHED, _fixed_buffers(plan))
        object.__setattr__(plan, "_memory", found)  # a cache beside Plan._hash: with_changes drops both
    return found


def rank_memory(plan: Plan, pp_rank: int, constants: MemoryConstants = CALIBRATED) -> MemoryBreakdown:
    """Memory breakdown of pipeline rank ``pp_rank``."""
    p = _plan_memory(plan)
    lay = plan.layout
    static = _rank_static(p.key, p.stages, lay.pp, lay.vpp or 1, plan.mtp_num_layers, pp_rank)
    dense, experts = _per_gpu(static, lay)
    last = static.last
    params = dense + experts
    shard = _shard(lay, dense, experts)
    n = p.n
    logits = n * p.vocab * FP32 / lay.tp if last else 0.0
    in_flight = _in_flight(lay.pp, lay.vpp or 1, p.micro, pp_rank, p.warmup)
    listed, largest_layer, graphed = _activation_terms(
        p.key, static, n, lay.tp, lay.etp, plan.sequence_parallel, plan.recompute_granularity, p.modules,
        plan.mtp_num_layers if last else 0, logits, in_flight, p.graph_modules, p.pre_mlp_norm)
    scale = constants.activation_scale
    gemm_weights = dense - static.embed / lay.tp + experts
    return MemoryBreakdown(
        pp_rank=pp_rank, parameters=params * BF16, gradients=params * p.grad_bytes,
        optimizer=shard * p.state_bytes * p.on_gpu, activations=scale * listed + logits,
        transient=max(LOGIT_COPIES * logits, scale * largest_layer), overhead=constants.overhead_bytes,
        weight_cache=2 * gemm_weights if p.fp8_cached else 0.0,
        cuda_graphs=cuda_graph_bytes(plan, graphed) if graphed else 0.0, **p.fixed, cuda_context=CUDA_CONTEXT,
        detail={"listed_activations": listed, "largest_layer": largest_layer, "dense_params": dense,
                "expert_params": experts, "optimizer_shard_params": shard, "chunks_in_flight": float(sum(in_flight)),
                "logits_bytes": logits},
    )
