"""Parameter counts and per-token GEMM sizes of one model, from its features (:class:`lcmoe_recipes.catalog.ModelSpec`).

Counts are elements (not bytes). What each layer holds, by feature (HF config names; megatron-core 0.19.2 module in
brackets):

* softmax attention (full or sliding window) [``SelfAttention``]: q (h x nq·d), k and v (h x nkv·d), o (nq·d x h);
  q/k RMSNorm weights with ``qk_layernorm``; q/k/v biases with ``attention_bias``; an output gate (h x nq·d) with
  ``attention_output_gate`` (Qwen3-Next); one softmax offset per head with ``attention_sinks`` (gpt-oss); an output
  bias with ``linear_bias``. A sliding window changes no parameter.
* MLA [``MLASelfAttention``]: q_down (h x q_lora) + q_up (q_lora x nq·(dn+dr)), or q_proj (h x nq·(dn+dr)) when
  q_lora_rank is null; kv_down (h x kv_lora + dr), kv_up (kv_lora x nq·(dn+dv)), o (nq·dv x h).
* gated DeltaNet [``GatedDeltaNet``, ``ssm/gated_delta_net``]: in_proj (h x 2·nk·dk + 2·nv·dv + 2·nv), a depthwise
  conv over q,k,v, A_log and dt_bias (nv each), out_proj (nv·dv x h).
* MLP: SwiGLU-style gated (3·h·f: gate, up, down; gpt-oss's clamped GLU has the same shapes), plus biases with
  ``linear_bias``. Routed experts use the expert width, shared experts the shared width (plus an h-wide gate with
  ``shared_expert_gate``), dense layers the dense width; the router is h x experts.
* embedding V x h; output layer V x h unless ``tie_word_embeddings``.

Tensor parallelism splits most of these, not all: every norm weight, the router (and its bias), the shared-expert
gate, the biases of the row-parallel output projections, and MLA's down projections (q_down, kv_down: Transformer
Engine's ``TELinear`` with ``parallel_mode="duplicated"``, megatron-core 0.19.2 ``multi_latent_attention.py:525`` /
``:572``) are whole on every TP rank (:meth:`LayerShapes.layer_replicated_params`). The build
(:mod:`lcmoe_recipes.emit.probe.build`) counts them on the built model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

from ..catalog import ModelSpec
from ..catalog.models import GDN, SLIDING


@dataclass(frozen=True)
class LayerShapes:
    """Per-layer sizes (elements) of one model."""

    h: int                  # hidden size
    vocab: int
    tied: bool              # embedding and output layer share one matrix
    attn_softmax: int       # params of one softmax-attention block (MLA or GQA, projections + norms + biases)
    attn_replicated: int    # ... of which whole on every TP rank (q/k or MLA latent norms, MLA down projections,
                            # the output projection's bias)
    attn_linear: int        # params of one gated-DeltaNet block (0 if none)
    kinds: tuple[str, ...]  # attention kind per layer: "mla", "full", "sliding", "gdn"
    moe: tuple[bool, ...]   # MoE MLP per layer
    window: int             # sliding-window size in tokens (0: none)
    dense_mlp: int          # params of a dense MLP (dense layers only)
    expert: int             # params of ONE routed expert
    num_experts: int
    topk: int
    shared: int             # params of the shared expert(s) of one MoE layer (gate included)
    shared_replicated: int  # ... of which whole on every TP rank (the gate, the down projection's bias)
    dense_replicated: int   # params of a dense MLP whole on every TP rank (the down projection's bias)
    router: int
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
    qk_norm: bool
    out_gate: bool          # softmax-attention output gate (Qwen3-Next)
    q_lora: int
    kv_lora: int
    d_rope: int
    lin_nk: int
    lin_nv: int
    lin_dk: int
    lin_dv: int
    sinks: bool = False     # learnable softmax offsets (gpt-oss: megatron-core softmax_type="learnable")

    def kind(self, layer: int) -> str:
        """Attention kind of decoder layer ``layer`` ("mla", "full", "sliding", "gdn")."""
        return self.kinds[layer]

    def is_softmax(self, layer: int) -> bool:
        """Softmax attention (MLA, full or sliding window), as opposed to gated DeltaNet."""
        return self.kinds[layer] != GDN

    def is_moe(self, layer: int) -> bool:
        return self.moe[layer]

    def keys_seen(self, seq_length: int) -> float:
        """Keys a query attends to on average in a softmax layer: seq/2 (causal), or the window when it is shorter
        (the last ``window`` tokens; the first ``window`` queries see fewer)."""
        if not self.window or self.window >= seq_length:
            return seq_length / 2
        w = self.window
        return w - w * w / (2 * seq_length)

    def layer_keys_seen(self, layer: int, seq_length: int) -> float:
        return self.keys_seen(seq_length) if self.kinds[layer] == SLIDING else seq_length / 2

    @property
    def embedding(self) -> int:
        return self.vocab * self.h

    @property
    def output_layer(self) -> int:
        """Params of the output layer held apart from the embedding (0 when tied)."""
        return 0 if self.tied else self.embedding

    def layer_dense_params(self, layer: int) -> int:
        """Params of layer ``layer`` that TP splits and DP replicates (attention, norms, router, shared/dense MLP)."""
        attn = self.attn_linear if self.kinds[layer] == GDN else self.attn_softmax
        mlp = (self.shared + self.router) if self.moe[layer] else self.dense_mlp
        return attn + mlp + 2 * self.h

    def layer_replicated_params(self, layer: int) -> int:
        """The part of :meth:`layer_dense_params` that tensor parallelism does not split: the two layer norms, the
        attention's norms / MLA down projections / output bias, the router, the shared-expert gate, the MLP output
        biases."""
        attn = 0 if self.kinds[layer] == GDN else self.attn_replicated
        mlp = (self.shared_replicated + self.router) if self.moe[layer] else self.dense_replicated
        return attn + mlp + 2 * self.h

    def layer_expert_params(self, layer: int) -> int:
        """Routed-expert params of layer ``layer`` (split over EP·ETP, replicated over EDP)."""
        return self.expert * self.num_experts if self.moe[layer] else 0

    @cached_property
    def total_params(self) -> int:
        total = self.embedding + self.output_layer + self.h
        return total + sum(self.layer_dense_params(i) + self.layer_expert_params(i) for i in range(self.num_layers))

    @cached_property
    def active_params_per_token(self) -> int:
        """Params one token's forward pass multiplies with (routed: topk experts only), embedding excluded."""
        act = self.embedding  # output layer (tied or not, the logits GEMM runs)
        for i in range(self.num_layers):
            act += self.layer_dense_params(i) + (self.expert * self.topk if self.moe[i] else 0)
        return act


def _gated_mlp(h: int, f: int, bias: bool) -> int:
    """A gated MLP (gate + up: h x 2f, down: f x h), with biases when ``bias``."""
    return 3 * h * f + (2 * f + h if bias else 0)


@lru_cache(maxsize=None)
def shapes(spec: ModelSpec) -> LayerShapes:
    """The :class:`LayerShapes` of a catalogue model (built from its feature properties only)."""
    c = spec.config
    h, nq, nkv = spec.hidden_size, spec.num_attention_heads, spec.num_query_groups
    if spec.multi_latent_attention:
        dn, dr, dv = int(c["qk_nope_head_dim"]), int(c["qk_rope_head_dim"]), int(c["v_head_dim"])
        q_lora = int(c.get("q_lora_rank") or 0)
        kv_lora = int(c["kv_lora_rank"])
        q = (h * q_lora + q_lora * nq * (dn + dr) + q_lora) if q_lora else h * nq * (dn + dr)
        attn = q + h * (kv_lora + dr) + kv_lora + kv_lora * nq * (dn + dv) + nq * dv * h
        # whole on every TP rank: the q and kv latent norms and the two down projections
        attn_replicated = ((h * q_lora + q_lora) if q_lora else 0) + h * (kv_lora + dr) + kv_lora
        d_qk, d_v, nkv = dn + dr, dv, nq
    else:
        d = spec.kv_channels
        attn = h * nq * d + 2 * h * nkv * d + nq * d * h
        attn += 2 * d if spec.qk_layernorm else 0
        attn += h * nq * d if spec.attention_output_gate else 0
        attn += (nq + 2 * nkv) * d if spec.attention_bias else 0
        attn += nq if spec.attention_sinks else 0
        attn += h if spec.linear_bias else 0
        attn_replicated = (2 * d if spec.qk_layernorm else 0) + (h if spec.linear_bias else 0)
        d_qk = d_v = d
        dn = dr = q_lora = kv_lora = 0
    if spec.gated_delta_net:
        lin_nk, lin_nv = spec.linear_num_heads
        lin_dk, lin_dv = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
        conv = int(c.get("linear_conv_kernel_dim", 4)) * (2 * lin_nk * lin_dk + lin_nv * lin_dv)
        attn_linear = h * (2 * lin_nk * lin_dk + 2 * lin_nv * lin_dv + 2 * lin_nv) + conv + lin_nv * lin_dv * h + 2 * lin_nv
    else:
        lin_nk = lin_nv = lin_dk = lin_dv = attn_linear = 0
    f_exp, f_shared, f_dense = spec.moe_ffn_hidden_size, spec.shared_expert_ffn_hidden_size, spec.ffn_hidden_size
    bias = spec.linear_bias
    experts = spec.num_moe_experts
    shared = (_gated_mlp(h, f_shared, bias) if f_shared else 0) + (h if spec.shared_expert_gate else 0)
    shared_replicated = (h if f_shared and bias else 0) + (h if spec.shared_expert_gate else 0)
    return LayerShapes(
        h=h, vocab=spec.vocab_size, tied=spec.tie_word_embeddings, attn_softmax=attn, attn_replicated=attn_replicated,
        attn_linear=attn_linear, shared_replicated=shared_replicated,
        dense_replicated=h if f_dense and bias else 0,
        kinds=spec.layer_attention, moe=spec.moe_layers, window=spec.sliding_window or 0,
        dense_mlp=_gated_mlp(h, f_dense, bias) if f_dense else 0,
        expert=_gated_mlp(h, f_exp, bias) if experts else 0, num_experts=experts, topk=spec.moe_router_topk,
        shared=shared, router=h * experts + (experts if bias else 0), num_layers=spec.num_layers,
        f_expert=f_exp, f_shared=f_shared, f_dense=f_dense, nq=nq, nkv=nkv, d_qk=d_qk, d_v=d_v,
        mla=spec.multi_latent_attention, qk_norm=spec.qk_layernorm, out_gate=spec.attention_output_gate,
        q_lora=q_lora, kv_lora=kv_lora, d_rope=dr, lin_nk=lin_nk, lin_nv=lin_nv, lin_dk=lin_dk, lin_dv=lin_dv,
        sinks=spec.attention_sinks,
    )
