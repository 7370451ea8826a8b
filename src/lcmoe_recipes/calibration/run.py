"""The calibration run: a one-node job whose log measures what :mod:`lcmoe_recipes.calibration.fit` needs for a
target plan, in at most :data:`STEPS` steps.

What it must reproduce is each GPU's *shapes*, not the job's size -- the constants it measures are per kernel
shape (GEMM efficiency at that precision, the attention kernel at its call shapes, the memory the allocator holds
beyond the listed tensors), and the cost models carry them to the full job:

* the same GPU, precision, TP, MBS and tokens per rank (seq_length / CP): CP shrinks to what fits the node beside
  TP and seq_length shrinks with it (seq_length·CP'/CP), so every attention call keeps its length;
* the same experts per rank: EP shrinks to the node and the routed experts with it (E·EP'/EP), so each expert's
  GEMMs see the same tokens (tokens per rank x EP' x top-k / E');
* fewer layers, one of each kind the model has (a dense-MLP layer, an MoE layer; full, sliding-window and
  gated-DeltaNet attention), no pipeline (PP 1) and no MTP -- a model variant registered in the catalogue as a user
  entry (its config.json values travel in the YAML header);
* the target's recompute, optimizer offload, CUDA graphs and dispatcher (alltoall where EP' = 1 leaves nothing to
  dispatch); :data:`STEPS` iterations, a microbatch count of :data:`MICROBATCHES` per DP rank, every iteration
  logged with its throughput and memory (the fit skips the warm-up).
"""

from __future__ import annotations

from dataclasses import replace

from ..catalog.models import ModelSpec
from ..catalog.user import register
from ..core.layout import ParallelLayout
from ..core.plan import Plan, Reason
from ..errors import InfeasibleConfig

STEPS = 30
MICROBATCHES = 8
SOURCE = "lcmoe_recipes.calibration.run (docs/accuracy.md, 'Calibrating to your cluster')"


def _variant(spec: ModelSpec, experts: int) -> ModelSpec:
    """``spec`` with one layer of each kind, ``experts`` routed experts and no MTP, registered as a user entry."""
    c = dict(spec.config)
    kinds = []
    for i, (moe, kind) in enumerate(zip(spec.moe_layers, spec.layer_attention)):
        if (moe, kind) not in [k for k, _ in kinds]:
            kinds.append(((moe, kind), i))
    keep = [i for _, i in kinds]
    layers = len(keep)
    c["num_hidden_layers"] = layers
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if key in c:
            c[key] = 0
    for key in ("layer_types", "mlp_layer_types"):
        if c.get(key):
            c[key] = [c[key][i] for i in keep]
    if "first_k_dense_replace" in c:
        c["first_k_dense_replace"] = sum(1 for i in keep if not spec.moe_layers[i])
    if "full_attention_interval" in c:  # gated DeltaNet: the last of each interval is full attention
        c["full_attention_interval"] = layers
    for key in ("n_routed_experts", "num_experts", "num_local_experts"):
        if key in c:
            c[key] = experts
    key = f"{spec.key}_calibration_{layers}l_{experts}e"
    return register(ModelSpec(key, f"{spec.display} -- calibration variant ({layers} layers, {experts} experts)",
                              f"{spec.hf_id} (calibration variant)", mtp=0, hf_config_class=spec.hf_config_class,
                              values=c))


def calibration_run_plan(target: Plan) -> Plan:
    """The one-node plan that measures ``target``'s constants (module doc), with every choice's reason.

    Raises:
        InfeasibleConfig: TP alone does not fit one node.
    """
    hw, lay, spec = target.hardware_spec, target.layout, target.model_spec
    node = hw.gpus_per_node
    if lay.tp > node:
        raise InfeasibleConfig(f"TP={lay.tp} does not fit one {hw.display} node of {node} GPUs",
                               "calibrate a plan with TP <= the GPUs per node")
    cp = min(lay.cp, node // lay.tp)
    seq = target.seq_length // lay.cp * cp
    ep = min(lay.ep * lay.etp, node) if spec.is_moe else 1
    experts = spec.num_moe_experts // (lay.ep * lay.etp) * ep if spec.is_moe else 0
    model = _variant(spec, experts) if spec.is_moe else _variant(spec, 0)
    layout = ParallelLayout(world=node, tp=lay.tp, pp=1, cp=cp, ep=ep, etp=1)
    dp = layout.dp
    dispatcher = target.moe_token_dispatcher_type if ep > 1 else "alltoall"
    why = (f"one {hw.display} node ({node} GPUs) with {target.name}'s per-GPU shapes: TP{lay.tp}, MBS "
           f"{target.micro_batch_size}, {target.seq_length // lay.cp} tokens per rank (CP{lay.cp} -> CP{cp}, "
           f"seq_length {target.seq_length} -> {seq}), {spec.num_moe_experts // (lay.ep * lay.etp)} experts per rank "
           f"(EP{lay.ep} -> EP{ep}, {spec.num_moe_experts} -> {experts} experts), one layer of each kind, PP1, no MTP; "
           f"{STEPS} steps")
    reasons = {**target.reasons, "layout": Reason(why, SOURCE),
               "global_batch_size": Reason(f"{MICROBATCHES} microbatches of MBS {target.micro_batch_size} per DP rank "
                                           f"(DP={dp})", SOURCE)}
    cp_comm = target.cp_comm_type if cp > 1 and target.cp_comm_type != "a2a+p2p" else "p2p"
    return target.with_changes(
        name=f"{target.name}_calibration", model=model.key, seq_length=seq, layout=layout,
        pipeline_model_parallel_layout=None, global_batch_size=MICROBATCHES * target.micro_batch_size * dp,
        mtp_num_layers=0, moe_token_dispatcher_type=dispatcher,
        moe_flex_dispatcher_backend=target.moe_flex_dispatcher_backend if dispatcher == "flex" else None,
        moe_ep_overlap=target.moe_ep_overlap and ep > 1, tp_comm_overlap=target.tp_comm_overlap and layout.tp > 1,
        cp_comm_type=cp_comm, hierarchical_cp_sizes=None,
        schedule=replace(target.schedule, train_iters=STEPS) if target.schedule else None, reasons=reasons)
