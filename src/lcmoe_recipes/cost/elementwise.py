"""Memory-bound passes: the kernels between the GEMMs and the attention kernel that every layer runs, the FP8
quantization kernels, and the passes megatron-core runs outside its fused kernels for some model features.

Each is priced as bytes moved per token per layer at the GPU's datasheet HBM bandwidth (``Hardware.hbm_gbps``: a
lower bound on the time; no fitted constant). A pass of an ``n``-wide tensor reads or writes ``n`` elements per
token; BF16 (2 bytes) unless said.

**Every layer** (:func:`common_bytes`; megatron-core 0.19.2 ``transformer/transformer_layer.py``,
``transformer/moe/``): they scale with the hidden and expert widths, not with the GEMMs' FLOPs, so their share of a
step is largest for narrow models (Qwen3-30B-A3B's ``h`` = 2,048 against DeepSeek-V3's 7,168), which one GEMM
efficiency per GPU x precision cannot say. Forward / backward, per token:

* each norm (the input norm, inside TE's LayerNormLinear or on its own; a MoE layer's pre-MLP norm; a dense layer's
  inside LayerNormMLP): 1R + 1W of ``h`` / 2R + 1W (input and output gradient in, input gradient out);
* each residual add (bias-dropout-add after attention and after the MLP): 2R + 1W of ``h`` / the gradients of the
  two branches summed where they meet, 2R + 1W;
* the q / k norms (``qk_layernorm``): 1R + 1W / 2R + 1W of ``(nq + nkv)·d``; MLA's latent norms likewise of
  ``q_lora`` and ``kv_lora``; the fused RoPE kernel: 1R + 1W of q and k (``(nq + nkv)·d``; MLA: the rope part,
  ``(nq + 1)·d_rope``) both ways;
* routed experts (``transformer/moe/token_dispatcher.py``, ``moe_utils.py``): the router's scores, FP32 ``E`` wide
  (softmax / sigmoid 1R + 1W, top-k 1R, the auxiliary loss 1R / the score gradient 2R + 1W); the permutation of
  each token into its ``k`` expert slots (1R of ``h``, 1W of ``k·h``) and its inverse, weighted by the routing
  probabilities (1R of ``k·h``, 1W of ``h``), the same both ways; the SwiGLU with the routing weights per routed
  token: forward 1R of the ``2f``-wide FC1 output and 1W of ``f`` (3 passes of ``f``), backward 1R of ``2f`` and
  of the ``f``-wide gradient, 1W of the ``2f``-wide one (5 passes of ``f``);
* shared experts and dense MLPs: their SwiGLU the same per token (``f_shared`` / ``f_dense``), and the shared
  output added to the routed one (2R + 1W of ``h``) forward.

**The CP ring's merges** (:func:`cp_ring_bytes`; Transformer Engine 2.x
``attention/dot_product_attention/context_parallel.py``, ``AttnFuncWithCPAndKVP2P``, causal, BF16, cuDNN fused
attention, sbhd): with a ring of ``cp`` ranks each rank's attention runs ``cp`` kernel calls, and what joins them
moves memory per ring step. Forward: the K/V pair packed once into the send buffer (``torch.cat``), the FP32
log-sum-exp corrected step by step (``flash_attn_fwd_softmax_lse_correction``, its half-chunk variant on the
steps where only the later half of the queries attends), then after the ring every step's BF16 partial output
rescaled and added into the BF16 output (``flash_attn_fwd_out_correction``: reads both, writes one; half a chunk
on the half steps). Backward: the K/V copied into the ring buffer, then every step's dq and dk/dv added in BF16
into the running gradients (``add_``, the dk/dv ones in the buffer that travels the ring; half-width on the half
steps). Per local token, with Q = ``nq·d_qk``, A = ``nq·d_v``, KV = ``nkv·(d_qk + d_v)`` (MLA: ``nkv`` = ``nq``)
and L = ``nq`` elements, in bytes: forward 4·KV + A·(3·cp + 1 + 3r) + L·(10·cp + 6 + 10r), backward
Q·(3·cp + 3r + 1) + KV·(6·cp - 3r + 2) + 4·L on ring rank ``r``; the ring waits for its slowest rank, so the larger
of ranks 0 and cp - 1 is priced. The attention kernels' own reads and writes are in their published throughput;
the hierarchical exchange (``a2a+p2p``) merges over its ring only, all-to-all and all-gather exchanges not at all.

**FP8 quantization** (:func:`quantize_bytes`; Transformer Engine 2.x quantizers, the recipe's "scale overhead"):
under an FP8 recipe every GEMM takes FP8 operands, and each activation that no fused kernel hands over already
quantized goes through a cast kernel that reads it in BF16 and writes the FP8 data in the orientations the forward
and backward GEMMs read (row- and column-wise) with their scales: MXFP8 (``MXFP8Quantizer``) and DeepSeek-style
blockwise FP8 (``Float8BlockQuantizer``) 2 bytes read, 2 written, plus one E8M0 scale byte per 32 elements (MXFP8)
or one FP32 scale per 128 (blockwise) per orientation; per-tensor current scaling (``Float8CurrentScalingQuantizer``)
first reads the tensor for its amax, then casts and transposes it: 4 read, 2 written. Quantized forward: the inputs
of the attention output projection, of the routed experts' FC1 and FC2, and of the shared experts' FC1 and FC2 (the
input norm's LayerNormLinear, and a dense layer's LayerNormMLP, write FP8 themselves); backward: the output gradient
of every GEMM. Weights are cast once per step (TE keeps the FP8 copy across microbatches): not counted.

**Model features** (:func:`layer_bytes`). A few features take megatron-core 0.19.2 off its fused kernels onto plain
PyTorch ops, each a full read and write of its tensor in HBM; a model without the feature never runs them. Counted
from the code, pass by pass:

* **Clamped GLU** (gpt-oss: ``swiglu_limit`` -> ``activation_func_clamp_value``; routed experts, op fuser off):
  ``fusions/fused_bias_geglu.py`` ``weighted_bias_quick_geglu_impl`` clamps the two halves of the FC1 output and
  joins them with ``torch.cat`` before the fused GEGLU kernel: forward 2 reads + 2 writes of the ``2·f`` wide
  tensor, backward (clamp masks, the cat's gradient) 3 reads + 2 writes, per routed token. ``moe_act`` recompute runs
  the forward again in the backward.
* **Expert FC2 bias** (gpt-oss: ``add_bias_linear``; op fuser off): ``transformer/moe/experts.py``
  ``TEGroupedMLP._apply_bias`` adds ``bias · routing weight`` expert by expert in PyTorch and concatenates the
  results: forward ``b·p`` (write), ``t + b·p`` (two reads, a write), the cat (a read, a write) and the cast back
  to BF16, per routed token of width ``h``. The routing weights are FP32 where the router runs in FP32
  (``moe_router_dtype="fp32"``, which every config here sets for 32+ experts), so the products are FP32: forward 28
  bytes per element, backward (the cast's, the products' and the two bias / weight reductions' gradients) about 30.
  Through the op fuser the bias is inside the fused kernel, and one Triton kernel re-reads the FC2 output gradient
  for the bias gradient (``transformer_engine/pytorch/ops/fused/grouped_mlp.py``): 2 bytes per element, backward.
* **Output-projection bias** (``add_bias_linear``; bias-dropout-add fusion off, megatron-bridge's gpt-oss
  provider): ``fusions/fused_bias_dropout.py`` adds the bias in PyTorch: forward a read and a write of the ``h``
  wide hidden state, backward the bias gradient's reduction (a read), per token.
* **Unfused RoPE** (YaRN positions outside MLA: megatron-bridge 0.6.2 ``GPTModelProvider.provide`` turns
  ``apply_rope_fusion`` off for any position type other than plain ``rope``): ``models/common/embeddings/
  rope_utils.py`` ``_apply_rotary_pos_emb_bshd`` -- ``t·cos``, ``_rotate_half`` (a negation and a cat), ``·sin``, the
  sum and the cat with the unrotated part: 6.5 reads + 5.5 writes of q and k (``(nq + nkv)·d_qk`` per token) forward
  where the fused kernel makes 1 + 1, about 4.5 + 3.5 backward where it makes 1 + 1. MLA models keep their fused
  MLA RoPE kernels and are not priced here.

Per GPU, a layer's token tensors are split over TP·CP (sequence parallel) and its routed tensors hold ``topk`` rows
per token. Not priced: the host-to-device copy of the GLU's linear offset on every call, and the per-expert kernel
launches of ``_apply_bias`` (both launch-bound, not bandwidth-bound).

**Recomputed memory-bound modules** (:func:`recompute_bytes`). Selective recompute of a module with GEMMs adds its
FLOPs to the step (:mod:`lcmoe_recipes.cost.step`); two recompute modules have no FLOPs to add, and without this term
they would cost nothing. Each re-runs its forward in the backward, reading its input and writing its output once
more (``CheckpointWithoutOutput`` in megatron-core 0.19.2, the tensors :func:`lcmoe_recipes.cost.memory.
layer_tensors` lists):

* ``layernorm`` -- a separate norm (MLA's input norm; a MoE layer's pre-MLP norm where megatron-core recomputes it,
  :func:`lcmoe_recipes.cost.memory.pre_mlp_norm_recomputed`; ``transformer/transformer_layer.py``): its input, its
  output and its fp32 1/rms per token;
* ``moe_act`` -- the routed experts' activation (``transformer/moe/experts.py``, ``activation_recompute``; the op
  fuser's fused grouped MLP does not take this path, :func:`lcmoe_recipes.cost.memory.applied_recompute_modules`):
  the FC1 output (``2·f`` wide), the routing weights (fp32) and the activation output (``f`` wide), per routed
  token.
"""

from __future__ import annotations

from functools import lru_cache

from .memory import layer_tensors
from .shapes import LayerShapes

BF16, FP32 = 2, 4
# bytes per element of the routed tensors, (forward, backward), counted as the module doc says
CLAMP_BYTES = (2 * 2 * BF16 * 2, 2 * (3 + 2) * BF16)  # per element of the f-wide GLU output: 2R+2W / 3R+2W of 2f
FC2_BIAS_BYTES = {"bf16": (6 * BF16, 6 * BF16), "fp32": (28, 30)}
FUSED_BIAS_BYTES = (0, BF16)
OUT_BIAS_BYTES = (2 * BF16, BF16)
ROPE_EXTRA_ELEMENT_PASSES = ((6.5 + 5.5) - 2, (4.5 + 3.5) - 2)  # unfused minus the fused kernel's 1R + 1W
SOURCE = ("megatron-core 0.19.2 transformer/moe/experts.py (TEGroupedMLP forward, _apply_bias), "
          "fusions/fused_bias_geglu.py, fusions/fused_bias_dropout.py, models/common/embeddings/rope_utils.py")
FP32 = 4
# (forward, backward) passes over an n-wide tensor, in elements read + written per element
NORM_PASSES = (1 + 1, 2 + 1)
ADD_PASSES = (2 + 1, 2 + 1)
GLU_PASSES = (3, 5)          # per element of the f-wide output: 2f read + f written / 2f + f read, 2f written
ROPE_PASSES = (1 + 1, 1 + 1)
SCORE_PASSES = (3, 3)        # router scores (FP32, E wide): softmax / sigmoid R + W, top-k R / gradient 2R + W
AUX_LOSS_PASSES = (1, 0)
# bytes per element an FP8 cast kernel moves (read BF16, write both orientations, scales), by precision
QUANTIZE_BYTES = {"mxfp8": 2 + 2 + 2 / 32, "fp8_blockwise": 2 + 2 + 2 * FP32 / 128, "fp8_cs": 4 + 2}


@lru_cache(maxsize=4096)
def common_bytes(s: LayerShapes, layer: int) -> tuple[float, float]:
    """(forward, backward) bytes per token (whole layer, before the TP·CP split) of the memory-bound kernels every
    layer ``layer`` runs between its GEMMs and its attention kernel (module doc, **Every layer**)."""
    h, fw, bw = s.h, 0.0, 0.0

    def passes(counts: tuple[float, float], width: float, size: int = BF16) -> None:
        nonlocal fw, bw
        fw, bw = fw + counts[0] * width * size, bw + counts[1] * width * size

    passes(NORM_PASSES, h)  # the input norm
    passes(ADD_PASSES, h)  # the residual add after attention ...
    passes(ADD_PASSES, h)  # ... and after the MLP
    if s.is_softmax(layer):
        if s.mla:
            passes(NORM_PASSES, (s.q_lora or 0) + s.kv_lora)
            passes(ROPE_PASSES, (s.nq + 1) * s.d_rope)
        else:
            if s.qk_norm:
                passes(NORM_PASSES, (s.nq + s.nkv) * s.d_qk)
            passes(ROPE_PASSES, (s.nq + s.nkv) * s.d_qk)
    if s.is_moe(layer):
        k = s.topk
        passes(NORM_PASSES, h)  # the pre-MLP norm, on its own in a MoE layer
        passes(SCORE_PASSES, s.num_experts, FP32)
        passes(AUX_LOSS_PASSES, s.num_experts, FP32)
        passes((2, 2), h + k * h)  # permute (R h, W kh) and unpermute (R kh, W h), both ways
        passes(GLU_PASSES, k * s.f_expert)
        if s.f_shared:
            passes(GLU_PASSES, s.f_shared)
            passes((ADD_PASSES[0], 0), h)
    elif s.f_dense:
        passes(NORM_PASSES, h)  # inside LayerNormMLP
        passes(GLU_PASSES, s.f_dense)
    return fw, bw


@lru_cache(maxsize=4096)
def cp_ring_bytes(s: LayerShapes, layer: int, ring: int) -> float:
    """Bytes per local token (all heads; forward + backward) that joining the ``ring`` steps of softmax layer
    ``layer``'s CP ring attention moves (module doc, **The CP ring's merges**); 0 without a ring or for gated
    DeltaNet."""
    if ring < 2 or not s.is_softmax(layer):
        return 0.0
    q, a, kv, lse = s.nq * s.d_qk, s.nq * s.d_v, s.nkv * (s.d_qk + s.d_v), s.nq

    def rank(r: int) -> float:
        forward = 4 * kv + a * (3 * ring + 1 + 3 * r) + lse * (10 * ring + 6 + 10 * r)
        return forward + q * (3 * ring + 3 * r + 1) + kv * (6 * ring - 3 * r + 2) + 4 * lse

    return float(max(rank(0), rank(ring - 1)))


@lru_cache(maxsize=4096)
def quantize_bytes(s: LayerShapes, layer: int, precision: str) -> tuple[float, float]:
    """(forward, backward) bytes per token (whole layer, before the TP·CP split) of the FP8 cast kernels of layer
    ``layer`` under ``precision`` (module doc, **FP8 quantization**); (0, 0) for BF16."""
    per = QUANTIZE_BYTES.get(precision)
    if per is None:
        return 0.0, 0.0
    inputs, gradients = 0.0, 0.0
    if s.is_softmax(layer):
        inputs += s.nq * s.d_v  # the output projection's input
        if s.mla:
            gradients += (s.q_lora or 0) + s.kv_lora + s.d_rope + s.nq * s.d_qk + s.nq * (s.d_qk - s.d_rope + s.d_v)
        else:
            gradients += (s.nq * (2 if s.out_gate else 1) + 2 * s.nkv) * s.d_qk
        gradients += s.h
    else:  # gated DeltaNet: in_proj from the fused norm, out_proj's input quantized
        inputs += s.lin_nv * s.lin_dv
        gradients += 2 * s.lin_nk * s.lin_dk + 2 * s.lin_nv * s.lin_dv + 2 * s.lin_nv + s.h
    if s.is_moe(layer):
        k, f = s.topk, s.f_expert
        inputs += k * (s.h + f)
        gradients += k * (2 * f + s.h)
        if s.f_shared:
            inputs += s.h + s.f_shared
            gradients += 2 * s.f_shared + s.h
    elif s.f_dense:
        inputs += s.f_dense
        gradients += 2 * s.f_dense + s.h
    return inputs * per, gradients * per


def layer_bytes(s: LayerShapes, layer: int, clamp: bool, linear_bias: bool, unfused_rope: bool, op_fuser: bool,
                fp32_probs: bool, moe_act_recompute: bool) -> tuple[float, float]:
    """(forward, backward) bytes per token (whole layer, before the TP·CP split) that layer ``layer`` moves in the
    passes above; backward includes a recompute's forward. 0 for a layer with none of the features."""
    forward = backward = 0.0
    if s.is_moe(layer) and s.f_expert:
        k, f, h = s.topk, s.f_expert, s.h
        if clamp and not op_fuser:
            forward += k * f * CLAMP_BYTES[0]
            backward += k * f * (CLAMP_BYTES[1] + (CLAMP_BYTES[0] if moe_act_recompute else 0))
        if linear_bias:
            fw, bw = FUSED_BIAS_BYTES if op_fuser else FC2_BIAS_BYTES["fp32" if fp32_probs else "bf16"]
            forward, backward = forward + k * h * fw, backward + k * h * bw
    if linear_bias and s.is_softmax(layer):
        forward, backward = forward + s.h * OUT_BIAS_BYTES[0], backward + s.h * OUT_BIAS_BYTES[1]
    if unfused_rope and s.is_softmax(layer) and not s.mla:
        elements = (s.nq + s.nkv) * s.d_qk
        forward += elements * ROPE_EXTRA_ELEMENT_PASSES[0] * BF16
        backward += elements * ROPE_EXTRA_ELEMENT_PASSES[1] * BF16
    return forward, backward


def features(plan) -> tuple[bool, bool, bool, bool, bool, bool]:
    """(clamped GLU, linear biases, unfused RoPE, op fuser, FP32 routing weights, moe_act recompute) of ``plan``, the
    flags :func:`layer_bytes` reads."""
    spec = plan.model_spec
    positions = plan.positions
    if positions is not None:
        yarn = positions.scaling == "yarn"
    else:
        scaling = spec.config.get("rope_scaling") or {}
        yarn = (scaling.get("type") or scaling.get("rope_type")) == "yarn"
    recompute = plan.recompute_granularity == "selective" and "moe_act" in plan.recompute_modules
    return (bool(spec.config.get("swiglu_limit")), spec.linear_bias, yarn, plan.use_transformer_engine_op_fuser,
            (spec.num_moe_experts or 0) >= 32, recompute)


@lru_cache(maxsize=4096)
def per_token_bytes(s: LayerShapes, layer: int, flags: tuple[bool, ...]) -> tuple[float, float]:
    """:func:`layer_bytes` for ``flags`` = :func:`features` (cached: layers of one kind cost the same)."""
    return layer_bytes(s, layer, *flags)


# recompute module -> (output tensor, the tensors its forward reads and writes besides the output), as
# cost.memory.layer_tensors names them; a pass counts where the module drops the output
RECOMPUTED_PASSES = {
    "layernorm": (("input_norm_out", ("layer_input", "input_norm_stats")),
                  ("pre_mlp_norm_out", ("pre_mlp_input", "pre_mlp_norm_stats"))),
    "moe_act": (("expert_act_out", ("expert_fc1_out", "expert_probs")),),
}


@lru_cache(maxsize=4096)
def recompute_bytes(s: LayerShapes, layer: int, tokens: float, tp: int, etp: int, sequence_parallel: bool,
                    modules: tuple[str, ...], pre_mlp_norm_recompute: bool) -> float:
    """Bytes one GPU moves in the backward of one microbatch of layer ``layer`` re-running its recomputed
    memory-bound modules (module doc: ``layernorm``, ``moe_act``) under selective recompute of ``modules`` (the
    ones megatron-core applies: :func:`lcmoe_recipes.cost.memory.applied_recompute_modules`); ``tokens``:
    MBS·seq_length/CP, the rest as :func:`lcmoe_recipes.cost.memory.layer_tensors` takes them. 0 where none of them
    runs."""
    tensors = layer_tensors(s, layer, tokens, tp, etp, sequence_parallel, pre_mlp_norm_recompute)
    moved = 0.0
    for module in RECOMPUTED_PASSES:
        if module not in modules:
            continue
        for output, others in RECOMPUTED_PASSES[module]:
            if output in tensors and module in tensors[output][1]:
                moved += tensors[output][0] + sum(tensors[t][0] for t in others)
    return moved
