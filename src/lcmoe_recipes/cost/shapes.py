"""Parameter counts and per-token GEMM sizes of one model, from its config.json values (catalog).

Counts are elements (not bytes). Conventions (HF config names):
* attention -- GQA: q (h x nq·d), k and v (h x nkv·d), o (nq·d x h), plus q/k RMSNorm weights (Qwen3);
  Qwen3-Next's full-attention layers also have an output gate (h x nq·d).
  MLA (DeepSeek-V3, Moonlight): q_down (h x q_lora) + q_up (q_lora x nq·(dn+dr)) or q_proj (h x nq·(dn+dr)) when
  q_lora_rank is null; kv_down (h x kv_lora + dr), kv_up (kv_lora x nq·(dn+dv)), o (nq·dv x h).
  Gated DeltaNet (Qwen3-Next, 3 of every 4 layers): in_proj (h x 2·nk·dk + 2·nv·dv + 2·nv), a depthwise conv over
  q,k,v, out_proj (nv·dv x h).
* MLP -- SwiGLU: 3·h·f (gate, up, down). Routed experts use ``moe_intermediate_size``; shared experts use
  n_shared_experts·moe_intermediate_size (DeepSeek) or ``shared_expert_intermediate_size`` (Qwen3-Next).
* Embedding and output layer: V x h each (none of these models ties them).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from ..catalog import ModelSpec


@dataclass(frozen=True)
class LayerShapes:
    """Per-layer sizes (elements) of one model."""

    h: int                  # hidden size
    vocab: int
    attn_full: int          # params of one softmax-attention block (projections + norms)
    attn_linear: int        # params of one gated-DeltaNet block (0 if none)
    linear_every: int       # layer i is softmax attention when (i+1) % linear_every == 0 (Qwen3-Next: 4); 1 = all full
    dense_mlp: int          # params of a dense SwiGLU MLP (dense layers only)
    expert: int             # params of ONE routed expert
    num_experts: int
    topk: int
    shared: int             # params of the shared expert(s) of one MoE layer
    router: int
    num_dense_layers: int
    num_layers: int
    f_expert: int           # routed expert intermediate size
    f_shared: int
    f_dense: int
    # attention geometry for FLOPs / activations
    nq: int
    nkv: int
    d_qk: int               # query/key head dim (MLA: nope + rope)
    d_v: int
    mla: bool
    q_lora: int
    kv_lora: int
    d_rope: int
    lin_nk: int
    lin_nv: int
    lin_dk: int
    lin_dv: int

    def is_full_attention(self, layer: int) -> bool:
        return (layer + 1) % self.linear_every == 0

    def is_moe(self, layer: int) -> bool:
        return layer >= self.num_dense_layers

    @property
    def embedding(self) -> int:
        return self.vocab * self.h

    def layer_dense_params(self, layer: int) -> int:
        """Params of layer ``layer`` that TP splits and DP replicates (attention, norms, router, shared/dense MLP)."""
        attn = self.attn_full if self.is_full_attention(layer) else self.attn_linear
        mlp = (self.shared + self.router) if self.is_moe(layer) else self.dense_mlp
        return attn + mlp + 2 * self.h

    def layer_expert_params(self, layer: int) -> int:
        """Routed-expert params of layer ``layer`` (split over EP·ETP, replicated over EDP)."""
        return self.expert * self.num_experts if self.is_moe(layer) else 0

    @cached_property
    def total_params(self) -> int:
        total = 2 * self.embedding + self.h
        return total + sum(self.layer_dense_params(i) + self.layer_expert_params(i) for i in range(self.num_layers))

    @cached_property
    def active_params_per_token(self) -> int:
        """Params one token's forward pass multiplies with (routed: topk experts only), embedding excluded."""
        act = self.embedding  # output layer
        for i in range(self.num_layers):
            act += self.layer_dense_params(i) + (self.expert * self.topk if self.is_moe(i) else 0)
        return act


@lru_cache(maxsize=None)
def shapes(spec: ModelSpec) -> LayerShapes:
    """The :class:`LayerShapes` of a catalogue model."""
    c = spec.config
    h = int(c["hidden_size"])
    nq = int(c["num_attention_heads"])
    nkv = int(c.get("num_key_value_heads") or nq)
    mla = "kv_lora_rank" in c
    if mla:
        dn, dr, dv = int(c["qk_nope_head_dim"]), int(c["qk_rope_head_dim"]), int(c["v_head_dim"])
        q_lora = int(c.get("q_lora_rank") or 0)
        kv_lora = int(c["kv_lora_rank"])
        q = (h * q_lora + q_lora * nq * (dn + dr) + q_lora) if q_lora else h * nq * (dn + dr)
        attn_full = q + h * (kv_lora + dr) + kv_lora + kv_lora * nq * (dn + dv) + nq * dv * h
        d_qk, d_v = dn + dr, dv
    else:
        d = int(c.get("head_dim") or h // nq)
        gate = h * nq * d if spec.gated_delta_net else 0  # Qwen3-Next: attention output gate
        attn_full = h * nq * d + 2 * h * nkv * d + nq * d * h + 2 * d + gate
        d_qk = d_v = d
        dn = dr = q_lora = kv_lora = 0
    if spec.gated_delta_net:
        lin_nk, lin_nv = spec.linear_num_heads
        lin_dk, lin_dv = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
        conv = int(c.get("linear_conv_kernel_dim", 4)) * (2 * lin_nk * lin_dk + lin_nv * lin_dv)
        attn_linear = h * (2 * lin_nk * lin_dk + 2 * lin_nv * lin_dv + 2 * lin_nv) + conv + lin_nv * lin_dv * h + 2 * lin_nv
        linear_every = int(c.get("full_attention_interval", 4))
    else:
        lin_nk = lin_nv = lin_dk = lin_dv = attn_linear = 0
        linear_every = 1
    f_exp = int(c["moe_intermediate_size"])
    if "n_shared_experts" in c:
        f_shared = int(c["n_shared_experts"] or 0) * f_exp
    else:
        f_shared = int(c.get("shared_expert_intermediate_size") or 0)
    f_dense = int(c.get("intermediate_size") or 0)
    experts = spec.num_moe_experts
    return LayerShapes(
        h=h, vocab=spec.vocab_size, attn_full=attn_full, attn_linear=attn_linear, linear_every=linear_every,
        dense_mlp=3 * h * f_dense, expert=3 * h * f_exp, num_experts=experts, topk=spec.moe_router_topk,
        shared=3 * h * f_shared + (h if spec.gated_delta_net else 0), router=h * experts,
        num_dense_layers=spec.num_dense_layers, num_layers=spec.num_layers, f_expert=f_exp, f_shared=f_shared,
        f_dense=f_dense, nq=nq, nkv=nkv if not mla else nq, d_qk=d_qk, d_v=d_v, mla=mla, q_lora=q_lora,
        kv_lora=kv_lora, d_rope=dr, lin_nk=lin_nk, lin_nv=lin_nv, lin_dk=lin_dk, lin_dv=lin_dv,
    )
