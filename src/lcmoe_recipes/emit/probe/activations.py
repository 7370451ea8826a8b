"""What one real megatron-core layer keeps for its backward pass, measured on the CPU, beside our activation table.

:func:`measure_layer` builds decoder layer ``layer`` of a plan's model with megatron-core 0.19.2's own modules (the
config megatron-bridge 0.6.2 builds for the plan, switched to the local modules where Transformer Engine is absent),
runs its forward and backward on ``tokens`` random tokens in BF16 under a tensor-parallel group of ``tp`` ranks
(:func:`lcmoe_recipes.emit.probe.fake_world.fake_world`, ``mirror`` backend: this rank among copies of itself), and counts
the bytes of every tensor autograd saves for the backward (``torch.autograd.graph.saved_tensors_hooks``), each storage
once, parameters and the RoPE tables (one per model, shared by every layer) left out, sizes read after the forward (an
output-discarding checkpoint frees its outputs once their consumers saved them). Our table for the same layer, tokens,
TP and recompute setting is :func:`lcmoe_recipes.cost.memory.layer_activations`' (kept bytes), priced for the local
spec's separate pre-MLP norm in a dense layer (``layer_activations_kept(..., te_spec=False)``).

Where Transformer Engine's kernels keep other tensors than megatron-core's local code, the layer runs with a stand-in
that keeps exactly what TE keeps (each named in :data:`STAND_INS` and in the result; none is a TE measurement):

* core attention: TE's fused attention (``transformer_engine/pytorch/attention/dot_product_attention/backends.py``,
  ``FusedAttnFunc.forward``) saves q, k, v, the output and the fp32 softmax statistics -- never the s x s scores the
  local ``DotProductAttention`` keeps;
* RMSNorm: TE's (``transformer_engine/pytorch/ops/basic/rmsnorm.py``, ``op_forward``) saves the input and the fp32
  reciprocal standard deviations;
* RoPE with ``apply_rope_fusion``: TE's ``FusedRoPEFunc`` (``transformer_engine/pytorch/attention/rope.py``) saves
  only the frequencies; MLA's fused YaRN RoPE is megatron-core's own Triton kernel
  (``megatron/core/fusions/fused_mla_yarn_rope_apply.py``, ``ApplyMLARotaryEmbQ/KV``: q roped in place, new key and
  value, cos/sin saved), run here with the same arithmetic and the same saved set on the CPU.

The CPU run also answers CUDA calls on the CPU (device, streams, RNG state) and works around megatron-core 0.19.2's
``CheckpointWithoutOutput()`` taking its default ``fp8=False`` for FP8 (``tensor_parallel/random.py:740``). Gated
DeltaNet layers and the ``moe_act`` recompute (TE's grouped MLP only) need Transformer Engine: not measured here.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

from ...core.plan import Plan
from ...errors import LcmoeError
from .substitutions import patch_until

STAND_INS = {
    "te-fused-attention": "core attention keeps q, k, v, out and fp32 softmax statistics (TE dot_product_attention/"
                          "backends.py FusedAttnFunc)",
    "te-rmsnorm": "RMSNorm keeps its input and fp32 1/rms per token (transformer_engine/pytorch/ops/basic/rmsnorm.py)",
    "te-fused-rope": "fused RoPE keeps the frequencies only (transformer_engine/pytorch/attention/rope.py "
                     "FusedRoPEFunc)",
    "mla-fused-rope-cpu": "megatron-core's Triton MLA YaRN RoPE (fusions/fused_mla_yarn_rope_apply.py), same "
                          "arithmetic and saved set (cos, sin) on the CPU",
    "cuda-on-cpu": "CUDA device, streams and RNG state answered on the CPU",
    "checkpoint-fp8-default": "CheckpointWithoutOutput(fp8=False) runs without FP8 (megatron-core 0.19.2 "
                              "tensor_parallel/random.py:740 takes False for FP8)",
    "local-norm-sp": "the torch norm is built under sequence parallelism (megatron-core torch_norm.py:50 refuses it)",
}


class NotMeasurable(LcmoeError):
    """The layer or recompute setting runs only with Transformer Engine."""


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one layer keeps for its backward pass: measured, and our table's (kept bytes for the same setting).

    Attributes:
        model, layer: catalogue key and 0-based decoder layer.
        moe, attention: the layer's kind (MoE or dense MLP; "mla", "full", "sliding").
        tokens: tokens per CP rank (n; with sequence parallelism each TP rank holds n/TP of the layer input).
        tp, sequence_parallel: the tensor-parallel setting.
        granularity, modules: the recompute setting measured.
        measured_bytes, predicted_bytes: bytes kept for backward (measured; :mod:`lcmoe_recipes.cost.memory`).
        by_module: measured bytes by the module whose forward saved them.
        stand_ins: :data:`STAND_INS` keys used.
    """

    model: str
    layer: int
    moe: bool
    attention: str
    tokens: int
    tp: int
    sequence_parallel: bool
    granularity: str | None
    modules: tuple[str, ...]
    measured_bytes: int
    predicted_bytes: float
    by_module: dict[str, int] = field(default_factory=dict, compare=False)
    stand_ins: tuple[str, ...] = ()

    @property
    def ratio(self) -> float:
        """measured / predicted."""
        return self.measured_bytes / self.predicted_bytes


# --- CPU stand-ins for TE kernels --------------------------------------------------------------------------------

def _rms_norm_function():
    import torch

    class RMSNormFunction(torch.autograd.Function):
        """y = x / rms(x) * w, saving (x, fp32 1/rms) as TE's RMSNorm op does."""

        @staticmethod
        def forward(ctx, x, weight, eps):
            rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
            ctx.save_for_backward(x, rstd)
            ctx.weight, ctx.eps = weight, eps
            return (x.float() * rstd * weight.float()).to(x.dtype)

        @staticmethod
        def backward(ctx, grad):
            x, rstd = ctx.saved_tensors
            with torch.enable_grad():
                xg, wg = x.detach().requires_grad_(), ctx.weight.detach().requires_grad_()
                y = (xg.float() * rstd * wg.float()).to(x.dtype)
                dx, dw = torch.autograd.grad(y, (xg, wg), grad)
            return dx, dw, None

    return RMSNormFunction


def _te_rmsnorm(dtype, sequence_parallel: bool):
    import torch

    function = _rms_norm_function()

    class TELikeRMSNorm(torch.nn.Module):
        def __init__(self, hidden_size: int, eps: float) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype))
            self.weight.sequence_parallel = sequence_parallel
            self.eps = eps

        def forward(self, x):
            return function.apply(x, self.weight, self.eps)

    return TELikeRMSNorm


def _fused_attention_class():
    import torch

    from megatron.core.transformer.module import MegatronModule

    def attention(q, k, v, scale):
        """Causal softmax attention; q [s, b, nq, d], k [s, b, nkv, d], v [s, b, nkv, dv]."""
        qq, kk, vv = (t.permute(1, 2, 0, 3).float() for t in (q, k, v))
        repeat = qq.shape[1] // kk.shape[1]
        kk, vv = kk.repeat_interleave(repeat, 1), vv.repeat_interleave(repeat, 1)
        scores = (qq @ kk.transpose(-1, -2)) * scale
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        return scores, vv

    class FusedAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, scale):
            with torch.no_grad():
                scores, vv = attention(q, k, v, scale)
                stats = torch.logsumexp(scores, -1)  # fp32 [b, nq, s]: the softmax statistics TE keeps
                out = (torch.softmax(scores, -1) @ vv).to(q.dtype).permute(2, 0, 1, 3).contiguous()
            ctx.save_for_backward(q, k, v, out, stats)
            ctx.scale = scale
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, _, _ = ctx.saved_tensors
            with torch.enable_grad():
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                scores, vv = attention(qg, kg, vg, ctx.scale)
                out = (torch.softmax(scores, -1) @ vv).to(q.dtype).permute(2, 0, 1, 3)
                dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), grad)
            return dq, dk, dv, None

    class FusedAttentionCore(MegatronModule):
        """Core attention that keeps what TE's fused attention keeps (module doc); no weights."""

        def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                     softmax_scale=None, cp_comm_type=None, pg_collection=None, k_channels=None, v_channels=None):
            super().__init__(config=config)
            channels = k_channels or config.kv_channels
            self.scale = softmax_scale if softmax_scale is not None else channels ** -0.5

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None, **kwargs):
            out = FusedAttention.apply(query, key, value, self.scale)
            return out.reshape(out.shape[0], out.shape[1], -1)

    return FusedAttentionCore


def _rotate(x, cos, sin, inverse: bool = False):
    import torch

    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * (-sin if inverse else sin)


def _rope_functions():
    import torch

    class FusedRoPE(torch.autograd.Function):
        """TE FusedRoPEFunc: rotates the first d of the last dimension by ``freqs``, saves ``freqs`` only."""

        @staticmethod
        def forward(ctx, t, freqs):
            ctx.freqs = freqs  # saved by TE; the model's one table (RoPE tables are left out of the count)
            return FusedRoPE.apply_freqs(t, freqs, False)

        @staticmethod
        def backward(ctx, grad):
            return FusedRoPE.apply_freqs(grad, ctx.freqs, True), None

        @staticmethod
        def apply_freqs(t, freqs, inverse):
            d = freqs.shape[-1]
            cos, sin = freqs[: t.shape[0]].cos().to(t.dtype), freqs[: t.shape[0]].sin().to(t.dtype)
            return torch.cat((_rotate(t[..., :d], cos, sin, inverse), t[..., d:]), -1)

    class MLARoPEQ(torch.autograd.Function):
        """megatron-core ApplyMLARotaryEmbQ: q's rope part rotated in place; saves (cos, sin)."""

        @staticmethod
        def forward(ctx, q, cos, sin, qk_head_dim, emb_dim, *args):
            n = q.shape[0]
            q[..., qk_head_dim:] = _rotate(q[..., qk_head_dim:], cos[:n].to(q.dtype), sin[:n].to(q.dtype))
            ctx.mark_dirty(q)
            ctx.tables = (cos, sin)  # saved by megatron-core; the model's cached tables (left out of the count)
            ctx.qk_head_dim = qk_head_dim
            return q

        @staticmethod
        def backward(ctx, grad):
            cos, sin = ctx.tables
            n, d = grad.shape[0], ctx.qk_head_dim
            grad = grad.clone()
            grad[..., d:] = _rotate(grad[..., d:], cos[:n].to(grad.dtype), sin[:n].to(grad.dtype), True)
            return (grad,) + (None,) * 8

    class MLARoPEKV(torch.autograd.Function):
        """megatron-core ApplyMLARotaryEmbKV: new key [kv nope | roped k_pos_emb] and value; saves (cos, sin)."""

        @staticmethod
        def forward(ctx, kv, k_pos_emb, cos, sin, emb_dim, k_dim, v_dim, *args):
            n, b, heads = kv.shape[:3]
            rope = _rotate(k_pos_emb, cos[:n].to(kv.dtype), sin[:n].to(kv.dtype)).expand(n, b, heads, emb_dim)
            key = torch.cat((kv[..., :k_dim], rope), -1)
            value = kv[..., k_dim:].contiguous()
            ctx.tables = (cos, sin)  # as in MLARoPEQ
            ctx.dims = (emb_dim, k_dim)
            return key, value

        @staticmethod
        def backward(ctx, grad_key, grad_value):
            cos, sin = ctx.tables
            emb_dim, k_dim = ctx.dims
            n = grad_key.shape[0]
            grad_kv = torch.cat((grad_key[..., :k_dim], grad_value), -1)
            grad_rope = _rotate(grad_key[..., k_dim:].sum(2, keepdim=True), cos[:n].to(grad_key.dtype),
                                sin[:n].to(grad_key.dtype), True)
            return (grad_kv, grad_rope) + (None,) * 9

    return FusedRoPE, MLARoPEQ, MLARoPEKV


class _Stream:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, *args) -> None:
        pass

    def wait_event(self, *args) -> None:
        pass

    def record_event(self, *args):
        return self

    def synchronize(self) -> None:
        pass

    wait = synchronize


@contextlib.contextmanager
def _on_cpu(model, used: list[str], te_kernels: bool = True):
    """The stand-ins of the module doc, for the duration of one measurement (without ``te_kernels``, only what a CPU
    run needs: the CUDA answers, the checkpoint default and the local norm's sequence-parallel refusal)."""
    import torch

    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.core.tensor_parallel.random as random
    import megatron.core.transformer.multi_latent_attention as mla
    import megatron.core.transformer.torch_norm as torch_norm

    with contextlib.ExitStack() as stack:
        patch = lambda owner, attr, value: patch_until(stack, owner, attr, value)  # noqa: E731
        patch(torch.cuda, "current_device", lambda: torch.device("cpu"))
        patch(torch.cuda, "Stream", _Stream)
        patch(torch.cuda, "current_stream", lambda *a, **k: _Stream())
        patch(torch.cuda, "stream", lambda *a, **k: contextlib.nullcontext())
        from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

        # the all-to-all dispatcher keeps its first stream on the class: restored with the rest when the layer is done
        patch(MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", MoEAlltoAllTokenDispatcher.cuda_dtoh_stream)
        import megatron.core.fusions.fused_softmax as fused_softmax

        # the local attention's causal mask (megatron-core 0.19.2 transformer/utils.py get_default_causal_mask)
        patch(fused_softmax, "get_default_causal_mask",
              lambda sq: torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1))
        patch(torch.cuda, "get_rng_state", lambda *a, **k: torch.get_rng_state())
        patch(torch.cuda, "set_rng_state", lambda *a, **k: None)
        patch(random, "_set_cuda_rng_state", lambda *a, **k: None)
        patch(random, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state())
        used.append("cuda-on-cpu")

        real_checkpoint_init = random.CheckpointWithoutOutput.__init__

        def checkpoint_init(self, fp8=False):
            real_checkpoint_init(self, fp8)
            self.fp8 = fp8 not in (None, False)

        patch(random.CheckpointWithoutOutput, "__init__", checkpoint_init)
        used.append("checkpoint-fp8-default")

        norm = _te_rmsnorm(model.params_dtype, bool(model.sequence_parallel))
        real_new = torch_norm.WrappedTorchNorm.__new__

        def new_norm(cls, config, hidden_size, eps=1e-5, **kwargs):
            if te_kernels and config.normalization == "RMSNorm":
                return norm(hidden_size, eps)
            built = real_new(cls, _without_sp(config) if config.sequence_parallel else config, hidden_size, eps,
                             **kwargs)
            for param in built.parameters():
                param.sequence_parallel = bool(config.sequence_parallel)
            return built.to(model.params_dtype)

        patch(torch_norm.WrappedTorchNorm, "__new__", staticmethod(new_norm))
        used += (["te-rmsnorm"] if te_kernels else []) + (["local-norm-sp"] if model.sequence_parallel else [])

        fused_rope, mla_q, mla_kv = _rope_functions()
        if model.apply_rope_fusion and te_kernels:
            patch(rope_utils, "fused_apply_rotary_pos_emb", lambda t, freqs, *a, **k: fused_rope.apply(t, freqs))
            patch(mla, "fused_apply_mla_rope_for_q", lambda q, cos, sin, d, e, *a, **k: mla_q.apply(q, cos, sin, d, e))
            patch(mla, "fused_apply_mla_rope_for_kv", lambda kv, pe, cos, sin, e, k_dim, v_dim, *a, **k:
                  mla_kv.apply(kv, pe, cos, sin, e, k_dim, v_dim))
            used.append("mla-fused-rope-cpu" if model.multi_latent_attention else "te-fused-rope")
        yield


def _without_sp(config):
    out = copy.copy(config)
    object.__setattr__(out, "sequence_parallel", False)
    return out


def _layer_config(plan: Plan, tp: int, granularity: str | None, modules: tuple[str, ...], te_kernels: bool = True):
    """The plan's model provider for one layer on ``tp`` ranks: CP, EP, PP 1; local modules without TE (and, without
    ``te_kernels``, RoPE unfused, as the local modules run it)."""
    from ..config import config_from_plan
    from ..local_impl import run_without_te, switch_to_local
    from ..stack import quiet_upstream, te_installed

    if not te_installed() and "moe_act" in modules:
        raise NotMeasurable("the moe_act recompute runs only in TE's grouped MLP (megatron-core 0.19.2 "
                            "transformer/moe/experts.py:268)", "measure it where Transformer Engine is installed")
    model = config_from_plan(plan, validate=False, quiet=True).model
    if getattr(model, "experimental_attention_variant", None):
        raise NotMeasurable(f"'{model.experimental_attention_variant}' layers are built only with Transformer "
                            "Engine (megatron-core 0.19.2)", "measure them where Transformer Engine is installed")
    fusion = model.apply_rope_fusion
    switch_to_local(model)
    if not te_kernels:  # as a run without TE runs them: e.g. torch's softmax where the fused one is not built
        run_without_te(model)
    for name, value in dict(tensor_model_parallel_size=tp, sequence_parallel=tp > 1, context_parallel_size=1,
                            expert_model_parallel_size=1, expert_tensor_parallel_size=1,
                            pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
                            pipeline_model_parallel_layout=None, mtp_num_layers=None, fp8=None, fp8_param=False,
                            moe_token_dispatcher_type="alltoall", moe_router_fusion=False, cuda_graph_impl="none",
                            recompute_granularity=granularity, recompute_modules=list(modules),
                            recompute_method=None, recompute_num_layers=None, use_cpu_initialization=True,
                            perform_initialization=True, gradient_accumulation_fusion=False).items():
        setattr(model, name, value)
    with quiet_upstream():
        model.finalize()
    # after the TE check of finalize(): the fused-RoPE stand-ins answer (module doc)
    model.apply_rope_fusion = fusion and te_kernels
    return model


def _layer_spec(model, layer: int, te_attention: bool = True):
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    spec = model.transformer_layer_spec
    spec = spec(model) if callable(spec) else spec
    spec = spec.layer_specs[layer] if isinstance(spec, TransformerBlockSubmodules) else spec
    spec = copy.deepcopy(spec)
    if te_attention:
        spec.submodules.self_attention.submodules.core_attention = _fused_attention_class()
    return spec


def measure_layer(plan: Plan, layer: int, tokens: int = 256, tp: int = 1, granularity: str | None = None,
                  modules: tuple[str, ...] = (), te_kernels: bool = True) -> LayerActivations:
    """Forward and backward of decoder layer ``layer`` of ``plan``'s model; the bytes it keeps for backward, measured
    and from our table (module doc).

    Args:
        plan: any plan of the model (its megatron-bridge config gives the layer's settings: fusions, norms, router).
        layer: 0-based decoder layer.
        tokens: n, tokens per CP rank (a multiple of ``tp``); every listed tensor is linear in n.
        tp: tensor-parallel ranks (sequence parallel when > 1).
        granularity, modules: recompute setting ("selective" and megatron-core's module names, or None).
        te_kernels: with the stand-ins that keep what Transformer Engine's kernels keep (the default: what a TE run
            keeps, beside our table); False measures megatron-core's local modules as they run without TE (the s x s
            softmax probabilities of the local ``DotProductAttention``, the torch RMSNorm's saved set): what a run
            without TE keeps, e.g. the GPU proof's (``predicted_bytes`` stays our table, for TE).

    Raises:
        NotMeasurable: gated DeltaNet, or ``moe_act`` recompute, without Transformer Engine.
    """
    import torch
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.spec_utils import build_module

    from ...cost.memory import layer_activations_kept
    from ...cost.shapes import shapes
    from .fake_world import MIRROR, fake_world

    model = _layer_config(plan, tp, granularity, modules, te_kernels)
    s = shapes(plan.model_spec)
    used: list[str] = ["te-fused-attention"] if te_kernels else []
    torch.manual_seed(0)
    with fake_world(tp, 0, backend=MIRROR), _on_cpu(model, used, te_kernels):
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, expert_tensor_parallel_size=1,
                                                 create_gloo_process_groups=False)
        pgc = ProcessGroupCollection.use_mpu_process_groups()
        if not te_kernels:  # the local attention forks the model-parallel RNG for its (p = 0) dropout
            from megatron.core import tensor_parallel

            tracker = tensor_parallel.get_cuda_rng_tracker()
            tracker.reset()
            tracker.add("model-parallel-rng", 1234)
        built = build_module(_layer_spec(model, layer, te_kernels), config=model, layer_number=layer + 1,
                             pg_collection=pgc)
        built = built.to(model.params_dtype)
        local = tokens // tp if tp > 1 else tokens
        x = torch.randn(local, 1, model.hidden_size, dtype=model.params_dtype, requires_grad=True)
        rotary = None
        if not model.multi_latent_attention:
            from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

            rotary = RotaryEmbedding(kv_channels=model.kv_channels, rotary_percent=model.rotary_percent,
                                     rotary_base=model.rotary_base, use_cpu_initialization=True,
                                     rotary_interleaved=model.rotary_interleaved, cp_group=pgc.cp)(tokens)
        measured, by_module = _saved_bytes(built, x, rotary)
    return LayerActivations(
        model=plan.model, layer=layer, moe=s.is_moe(layer), attention=s.kind(layer), tokens=tokens, tp=tp,
        sequence_parallel=tp > 1, granularity=granularity, modules=tuple(modules), measured_bytes=measured,
        predicted_bytes=layer_activations_kept(s, layer, tokens, tp, 1, tp > 1, granularity, tuple(modules),
                                               te_spec=False),  # the local spec built here: its own pre-MLP norm
        by_module=by_module, stand_ins=tuple(used))


def _saved_bytes(layer, x, rotary) -> tuple[int, dict[str, int]]:
    """(bytes of every storage saved for backward, by module), each storage once; parameters and the RoPE table out;
    sizes after the forward. The backward is run too (the saved set must serve it)."""
    import torch

    skip = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    if rotary is not None:  # the model's one RoPE table (the fused-RoPE stand-ins keep it off the saved set too)
        skip.add(rotary.untyped_storage().data_ptr())
    saved, stack = [], ["layer input"]
    hooks = []
    for name, module in layer.named_modules():
        hooks.append(module.register_forward_pre_hook(lambda m, a, name=name: stack.append(name or "layer")))
        hooks.append(module.register_forward_hook(lambda m, a, o: stack.pop() and None))  # None: keep the output

    def pack(tensor):
        saved.append((tensor, stack[-1]))
        return tensor

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out, _ = layer(x, attention_mask=None, rotary_pos_emb=rotary)
    finally:
        for hook in hooks:
            hook.remove()
    sizes: dict[int, int] = {}
    owner: dict[int, str] = {}  # the last saver of a live storage (an address can be reused once freed)
    for tensor, module in saved:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip and storage.nbytes():
            sizes[storage.data_ptr()] = storage.nbytes()
            owner[storage.data_ptr()] = module
    by_module: dict[str, int] = {}
    for ptr, size in sizes.items():
        name = "layer input" if ptr == x.untyped_storage().data_ptr() else owner[ptr]
        key = ".".join(part for part in name.split(".") if not part.isdigit())
        by_module[key] = by_module.get(key, 0) + size
    out.float().sum().backward()
    return sum(sizes.values()), by_module


CAUSAL_MASK_MODULE = "self_attention.core_attention.scale_mask_softmax"  # the local softmax's bool s x s causal mask
EXCESS_POINTS = (256, 512, 1024)


def local_excess_bytes(plan: Plan, layer: int, tokens: int, points: tuple[int, int, int] = EXCESS_POINTS) -> float:
    """Bytes decoder layer ``layer`` of ``plan``'s model keeps for backward when it runs on megatron-core's local
    modules (a run without Transformer Engine) beyond what it keeps with TE's kernels, for one sequence of ``tokens``
    tokens (TP 1, the plan's recompute; without TE, less the modules only TE recomputes).

    Measured (:func:`measure_layer`, with and without ``te_kernels``) at the three token counts of ``points`` and
    carried to ``tokens`` by the quadratic through them, which is exact: every tensor either run keeps is linear in
    the tokens except the local attention's s x s softmax probabilities (megatron-core 0.19.2
    ``transformer/dot_product_attention.py``, kept for the product with V). The causal mask is left out: megatron-core
    builds it once per sequence length (``transformer/utils.py``, ``get_default_causal_mask``, cached) and every layer
    shares it -- ``tokens``² bytes once per run.

    Raises:
        NotMeasurable: as :func:`measure_layer`.
    """
    from ..local_impl import LOCAL_LIMITS

    granularity = plan.recompute_granularity
    modules = tuple(plan.recompute_modules) if granularity == "selective" else ()
    # the run without TE drops the modules only TE recomputes (lcmoe_recipes.emit.local_impl.run_without_te)
    kept = tuple(m for m in modules if m not in {limit.module for limit in LOCAL_LIMITS})
    local_granularity = granularity if granularity != "selective" or kept else None

    def excess(n: int) -> float:
        local = measure_layer(plan, layer, n, 1, local_granularity, kept, te_kernels=False)
        te = measure_layer(plan, layer, n, 1, granularity, modules)
        return local.measured_bytes - local.by_module.get(CAUSAL_MASK_MODULE, 0) - te.measured_bytes

    (x0, x1, x2), (y0, y1, y2) = points, [excess(n) for n in points]
    # Lagrange form of the quadratic through the three points, at ``tokens``
    return (y0 * (tokens - x1) * (tokens - x2) / ((x0 - x1) * (x0 - x2))
            + y1 * (tokens - x0) * (tokens - x2) / ((x1 - x0) * (x1 - x2))
            + y2 * (tokens - x0) * (tokens - x1) / ((x2 - x0) * (x2 - x1)))
