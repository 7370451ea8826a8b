"""Memory-bound passes megatron-core runs outside its fused kernels for some model features.

The step model prices GEMMs against a fitted fraction of the dense peak, and that fraction absorbs the fused
elementwise work every MoE model runs (SwiGLU with the routing weights, permutation, norms). A few model features
take megatron-core 0.19.2 off those fused kernels onto plain PyTorch ops, each a full read and write of its tensor in
HBM; a model without the feature never runs them, so no fitted constant can stand for them. Each is priced here as
bytes moved per token per layer at the GPU's datasheet HBM bandwidth (``Hardware.hbm_gbps``: a lower bound on the
time; no fitted constant). Counted from the code, pass by pass, BF16 (2 bytes) unless said:

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
