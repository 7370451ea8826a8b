"""Plan -> megatron-bridge ``ConfigContainer``, ConfigContainer -> Plan, and validation for the target.

A ConfigContainer starts from megatron-bridge's own recipe for the model and GPU (``plan.base_recipe``, built offline
by :mod:`.upstream`: its kernels, fusions, optimizer settings and process environment), or, for an architecture with
no upstream recipe, from megatron-bridge's generic pre-training template (``recipes.common._pretrain_common``) with
the model provider from ``AutoBridge.from_hf_config``. Then :mod:`.settings` writes what the Plan decides, each
group with its reason. Field names are Megatron's.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from types import SimpleNamespace
from typing import Any

from ..catalog import MODELS, Hardware, get_hardware
from ..catalog.registry import match_model
from ..checks import Finding, check_plan, raise_for_errors
from ..checks.known_issues import StackVersions, config_view, known_issue_findings
from ..checks.config_asserts import config_assert_findings
from ..checks.timeouts import timeout_findings
from ..errors import InfeasibleConfig, UnknownName
from ..job_paths import path_findings
from ..layout import ParallelLayout
from ..plan import Plan, Positions, Schedule
from .fields import grad_reduce_in_fp32, layout_to_str, precision_of
from .settings import apply_settings
from .stack import load_bridge, quiet_upstream
from .target import target_environment
from .yaml_io import TARGET_ATTR, target_meta




def base_config(plan: Plan):
    """The ConfigContainer ``plan`` starts from: upstream's recipe ``plan.base_recipe`` built offline with the plan's
    model, or megatron-bridge's pre-training template with the model's provider; the two provider fields
    megatron-bridge fills by probing the *building* machine are answered for the target."""
    spec = plan.model_spec
    if plan.base_recipe:
        from .upstream import upstream_config

        cfg = upstream_config(plan.base_recipe, spec)
    else:
        from megatron.bridge import AutoBridge
        from megatron.bridge.recipes.common import _pretrain_common

        cfg = _pretrain_common()
        with quiet_upstream():  # transformers' "torch_dtype is deprecated", Bridge's local-fusion notices
            cfg.model = AutoBridge.from_hf_config(spec.hf_config()).to_megatron_provider(load_weights=False)
        if spec.is_moe:
            cfg.model.moe_grouped_gemm = cfg.model.moe_permute_fusion = True
    _answer_local_probes_for_target(cfg.model)
    return cfg


def build_config(plan: Plan, validate: bool = True, quiet: bool = False):
    """The megatron-bridge ``ConfigContainer`` for ``plan``: :func:`base_config`, then every setting of
    :mod:`lcmoe_recipes.emit.settings`.

    Args:
        plan: a Plan (from a named recipe or the planner).
        validate: also run :func:`validate_config` for the plan's hardware and world size (default True).
        quiet: no progress line while megatron-bridge loads.

    Returns:
        ``megatron.bridge.training.config.ConfigContainer``.

    Raises:
        InfeasibleConfig: the plan (or the resulting config) breaks one of our rules or upstream validation.
    """
    raise_for_errors(check_plan(plan), f"plan {plan.name}")
    load_bridge(quiet=quiet)
    cfg = base_config(plan)
    apply_settings(cfg, plan)
    if validate:
        validate_config(cfg, plan.hardware_spec, plan.layout.world)
    setattr(cfg, TARGET_ATTR, target_meta(plan))  # read by launch.submit; not a dataclass field, so not in the YAML
    return cfg


def _answer_local_probes_for_target(model) -> None:
    """Replace the two provider fields megatron-bridge 0.6.2 fills by probing the *building* machine for TE.

    With ``transformer_impl="transformer_engine"`` the target (the cluster container) has TE, so:

    * ``transformer_layer_spec``: the DeepSeek-V2/V3 bridges (``deepseek_v3_bridge.py``) store
      ``partial(get_gpt_decoder_block_spec, use_transformer_engine=HAVE_TE)``; built without TE that would make the
      cluster build local (non-TE) layers. Target answer: True.
    * ``gradient_accumulation_fusion``: ``GPTModelProvider``'s default is ``fusions.can_enable_gradient_accumulation_fusion()``
      (True when TE or APEX's fused_weight_gradient_mlp_cuda imports). Target answer: True.

    A test checks that the YAML emitted without TE equals the one emitted with TE (tests/test_full_env.py).
    """
    if getattr(model, "transformer_impl", None) != "transformer_engine":
        return
    spec = getattr(model, "transformer_layer_spec", None)
    if isinstance(spec, functools.partial) and "use_transformer_engine" in spec.keywords:
        model.transformer_layer_spec = functools.partial(spec.func, *spec.args,
                                                         **{**spec.keywords, "use_transformer_engine": True})
    model.gradient_accumulation_fusion = True


def plan_from_config(cfg, hardware: str | Hardware, world_size: int, name: str = "config") -> Plan:
    """Read a ConfigContainer (ours, upstream's or a user's) back into a Plan, so the same checks run on it.

    Raises:
        UnknownName: the model is not in our catalogue, nor a registered config.json (matched by layer count,
            experts, hidden size, heads and vocabulary).
    """
    m = cfg.model
    hw = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    spec = match_model(m.num_layers, m.num_moe_experts, m.hidden_size, m.num_attention_heads, m.vocab_size)
    if spec is None:
        raise UnknownName(f"the config's model (num_layers={m.num_layers}, num_moe_experts={m.num_moe_experts}, "
                          f"hidden_size={m.hidden_size}, vocab_size={m.vocab_size}) is not in the catalogue",
                          "give its config.json with --model-config PATH, or use one of: "
                          + ", ".join(s.display for s in MODELS.values()))
    model_key = spec.key
    from megatron.bridge.models.transformer_config import _set_moe_expert_tensor_parallel_default

    # ETP as the run will have it: megatron-bridge's own default (1 when EP > 1 and ETP is unset), then
    # megatron-core's (ETP = TP when still unset).
    degrees = SimpleNamespace(expert_tensor_parallel_size=m.expert_tensor_parallel_size,
                              expert_model_parallel_size=m.expert_model_parallel_size)
    _set_moe_expert_tensor_parallel_default(degrees)
    etp = degrees.expert_tensor_parallel_size
    layout = ParallelLayout(world=world_size, tp=m.tensor_model_parallel_size, pp=m.pipeline_model_parallel_size,
                            cp=m.context_parallel_size, ep=m.expert_model_parallel_size,
                            etp=etp if etp is not None else m.tensor_model_parallel_size,
                            vpp=m.virtual_pipeline_model_parallel_size)
    modules = m.recompute_modules
    graphs = m.cuda_graph_modules if m.cuda_graph_scope is None else m.cuda_graph_scope
    if isinstance(graphs, str):  # deprecated spelling: "full" means the whole layer, i.e. []
        graphs = [] if graphs == "full" else [graphs]
    graphs = [getattr(g, "name", g) for g in graphs or ()]
    opt = cfg.optimizer
    precision_aware = bool(opt.use_precision_aware_optimizer)
    hcp = m.hierarchical_context_parallel_sizes
    return Plan(
        name=name, model=model_key, hardware=hw.key, seq_length=m.seq_length, layout=layout,
        pipeline_model_parallel_layout=layout_to_str(m.pipeline_model_parallel_layout),
        micro_batch_size=cfg.train.micro_batch_size, global_batch_size=cfg.train.global_batch_size,
        precision=precision_of(cfg.mixed_precision),
        moe_token_dispatcher_type=m.moe_token_dispatcher_type, moe_flex_dispatcher_backend=m.moe_flex_dispatcher_backend,
        recompute_granularity=m.recompute_granularity,
        recompute_modules=tuple(modules) if modules is not None else (("core_attn",) if m.recompute_granularity == "selective" else ()),
        recompute_method=m.recompute_method, recompute_num_layers=m.recompute_num_layers,
        optimizer_cpu_offload=bool(opt.optimizer_cpu_offload),
        optimizer_offload_fraction=float(opt.optimizer_offload_fraction or 0.0),
        use_distributed_optimizer=bool(opt.use_distributed_optimizer or cfg.ddp.use_distributed_optimizer),
        use_precision_aware_optimizer=precision_aware,
        cuda_graph_impl=m.cuda_graph_impl or "none", cuda_graph_modules=tuple(graphs),
        sequence_parallel=bool(m.sequence_parallel), mtp_num_layers=m.mtp_num_layers or 0,
        variable_length=_variable_length(cfg), etp_unset=m.expert_tensor_parallel_size is None,
        grad_dtype="fp32" if grad_reduce_in_fp32(cfg) else "bf16",
        moment_dtype=("bf16" if precision_aware and str(opt.exp_avg_dtype).endswith("bfloat16") else "fp32"),
        positions=_positions_of(m), cp_comm_type=_cp_comm_type(m.cp_comm_type),
        hierarchical_cp_sizes=tuple(hcp) if hcp else None, schedule=_schedule_of(cfg),
        pretrained_checkpoint=cfg.checkpoint.pretrained_checkpoint,
        create_attention_mask=bool(getattr(cfg.dataset, "create_attention_mask", False)),
        num_workers=int(getattr(cfg.dataset, "num_workers", 0) or 0), eval_iters=int(_eval_iters(cfg) or 0),
        eval_global_batch_size=getattr(cfg.validation, "eval_global_batch_size", None),
        pin_cpu_grads=bool(opt.pin_cpu_grads),
        moe_ep_overlap=bool(m.overlap_moe_expert_parallel_comm
                            or (cfg.comm_overlap is not None and cfg.comm_overlap.overlap_moe_expert_parallel_comm)),
    )


def _positions_of(m) -> Positions | None:
    """The RoPE setup a model provider describes (MLA: megatron-core's MLA fields; GPT: megatron-bridge's yarn_*);
    None for an MLA ``rope_type`` other than rope / yarn, which megatron-core refuses (rule mla/rope-type)."""
    base = float(m.rotary_base)
    if getattr(m, "multi_latent_attention", False):
        if getattr(m, "rope_type", "rope") not in ("rope", "yarn"):
            return None
        if getattr(m, "rope_type", "rope") == "yarn" and (m.rotary_scaling_factor or 1) > 1:
            return Positions(rotary_base=base, scaling="yarn", factor=float(m.rotary_scaling_factor),
                             original_max_position_embeddings=m.original_max_position_embeddings,
                             beta_fast=m.beta_fast, beta_slow=m.beta_slow, mscale=m.mscale, mscale_all_dim=m.mscale_all_dim)
        return Positions(rotary_base=base)
    if m.position_embedding_type == "yarn":
        return Positions(rotary_base=base, scaling="yarn", factor=m.yarn_rotary_scaling_factor,
                         original_max_position_embeddings=m.yarn_original_max_position_embeddings,
                         beta_fast=m.yarn_beta_fast, beta_slow=m.yarn_beta_slow, mscale=m.yarn_mscale,
                         mscale_all_dim=m.yarn_mscale_all_dim)
    return Positions(rotary_base=base)


def _schedule_of(cfg) -> Schedule | None:
    """The optimizer schedule of an iteration-based config (None for a sample-based one)."""
    if not cfg.train.train_iters:
        return None
    return Schedule(train_iters=cfg.train.train_iters, lr=cfg.optimizer.lr, min_lr=cfg.optimizer.min_lr,
                    lr_warmup_iters=cfg.scheduler.lr_warmup_iters or 0, lr_decay_style=cfg.scheduler.lr_decay_style)


def _eval_iters(cfg) -> int | None:
    """``validation.eval_iters``, or the deprecated ``train.eval_iters`` where set: megatron-bridge 0.6.2's
    ``ConfigContainer.validate()`` copies that over the validation one (upstream's perf recipes set it to 0)."""
    deprecated = getattr(cfg.train, "eval_iters", None)
    return deprecated if deprecated is not None else cfg.validation.eval_iters


def _cp_comm_type(value: Any) -> str:
    """megatron-core's ``cp_comm_type`` (a string, or one per layer) as one string: the per-layer list's value when
    every layer agrees, else its first entry."""
    if value is None:
        return "p2p"
    if isinstance(value, str):
        return value
    values = list(value)
    return str(values[0]) if values else "p2p"


def _variable_length(cfg) -> bool:
    """True when batch shapes change step to step: packed (THD) sequences not padded to a static size, or
    ``variable_seq_lengths`` (megatron-bridge 0.6.2 ``validate()``'s packing fields)."""
    data = cfg.dataset
    specs = getattr(data, "offline_packing_specs", None)
    if getattr(data, "enable_in_batch_packing", False):
        return not getattr(data, "pad_to_max_length", False)
    if getattr(data, "enable_offline_packing", False):
        return not (getattr(data, "pad_to_max_length", False) and getattr(specs, "pad_cu_seqlens", False))
    return bool(getattr(cfg.model, "variable_seq_lengths", False))


def _check_pipeline_layout(cfg, name: str) -> None:
    """The pipeline layout against PP, VPP and the layer counts, with megatron-core's own parser."""
    m = cfg.model
    layout = m.pipeline_model_parallel_layout
    if layout is None:
        return
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    text = layout_to_str(layout)
    try:
        stages = PipelineParallelLayerLayout.get_num_stages_from_str(text) if isinstance(layout, str) else len(layout)
        pp, vpp = m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size
        if stages % pp:
            raise InfeasibleConfig(f"{name}: pipeline_model_parallel_layout '{text}' has {stages} stages, not a multiple "
                                   f"of PP={pp}", f"use PP in {[d for d in range(1, stages + 1) if stages % d == 0]} or "
                                   "rebuild the layout (set model.pipeline_model_parallel_layout=null or a new string)")
        if (vpp or 1) != stages // pp:
            raise InfeasibleConfig(f"{name}: pipeline_model_parallel_layout '{text}' has {stages} stages = PP {pp} x VPP "
                                   f"{stages // pp}, but virtual_pipeline_model_parallel_size is {vpp}",
                                   f"set VPP={stages // pp}, or give a layout with PP·VPP = {pp * (vpp or 1)} stages")
        parsed = PipelineParallelLayerLayout(layout if not isinstance(layout, str) else text, pp)
        parsed.validate_layer_layout(num_layers=m.num_layers, mtp_num_layers=m.mtp_num_layers)
    except InfeasibleConfig:
        raise
    except (AssertionError, ValueError) as exc:
        raise InfeasibleConfig(f"{name}: pipeline_model_parallel_layout '{text}' is not valid for {m.num_layers} layers "
                               f"+ {m.mtp_num_layers or 0} MTP: {exc}",
                               "give a layout with every decoder layer once, MTP after the decoders, loss last") from None


def config_findings(cfg, hardware: str | Hardware, world_size: int, name: str = "config",
                    versions: StackVersions | None = None) -> list:
    """Every finding for a ConfigContainer on ``world_size`` GPUs of ``hardware``, errors first.

    1. model and dataset ``seq_length`` must agree (rule ``config/seq-length``);
    2. read back into a Plan and run :func:`lcmoe_recipes.checks.check_plan` (rank folding, divisibility,
       batch, placement, dispatcher-on-hardware, recompute, offload, CUDA-graph rules: what upstream ``validate()``
       leaves to run time), then the memory model against the target's HBM (:func:`lcmoe_recipes.cost.memory_findings`);
       with them the data, tokenizer and checkpoint paths (:func:`lcmoe_recipes.job_paths.path_findings`);
    3. if those pass: the pipeline layout with megatron-core's ``PipelineParallelLayerLayout`` (rule
       ``pipeline/layout``);
    4. if those pass: megatron-bridge's ``runtime_config_update`` (mixed-precision resolution, DP size, comm-overlap
       setup, ``validate()`` with every megatron-core post-init check) on a deep copy, inside
       :func:`lcmoe_recipes.emit.target.target_environment` so the world size, GPU and TE probes answer for the
       target -- the TE probe with ``versions``' Transformer Engine when given (an image's: megatron-core's
       ``is_te_min_version`` gates judged for the TE the job runs) -- (its message mapped to our rule id and fix,
       else rule ``upstream/validate``); if it passes, the
       asserts megatron-core raises later and the settings upstream overrides, read from that resolved copy
       (:func:`lcmoe_recipes.checks.config_asserts.config_assert_findings`, docs/checks.md). The copy is thrown away:
       ``cfg`` is never changed;
    5. always: the known upstream bugs whose trigger holds for ``cfg`` and whose affected versions include
       ``versions`` (default: the installed ones; rules ``known-issue/<id>``, see docs/known_issues.md);
    6. if no error so far: the distributed timeouts against the predicted longest waits
       (:func:`lcmoe_recipes.checks.timeouts.timeout_findings`, rules ``timeout/*``).

    Returns:
        list of :class:`lcmoe_recipes.checks.Finding`.
    """
    hw = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    te = versions.versions.get("transformer-engine") if versions is not None else None
    findings = _rule_and_upstream_findings(cfg, hw, world_size, name, te)
    # 5. Known upstream bugs for the versions the config will run with (catalog/known_issues.yaml).
    view = config_view(cfg, hw, world_size)
    findings += known_issue_findings(view, versions)
    # 6. Timeouts against the cost model's longest waits (checks/timeouts.py), for a layout the checks accept.
    if not any(f.severity == "error" for f in findings):
        findings += timeout_findings(view, plan_from_config(cfg, hw, world_size, name))
    return sorted(findings, key=lambda f: f.severity != "error")


@contextlib.contextmanager
def _te_version_as(version: str | None):
    """megatron-core's TE version probe (``megatron.core.utils._te_version``, read by ``is_te_min_version``) answers
    ``version`` for the duration; nothing changes for None."""
    if version is None:
        yield
        return
    import megatron.core.utils as mcore_utils
    from packaging.version import Version

    saved = mcore_utils._te_version
    mcore_utils._te_version = Version(version)
    try:
        yield
    finally:
        mcore_utils._te_version = saved


def _rule_and_upstream_findings(cfg, hw: Hardware, world_size: int, name: str, te_version: str | None = None) -> list:
    """Steps 1-4 of :func:`config_findings`: every finding of our checks (memory where the layout is legal), then,
    when none is an error, the pipeline layout with megatron-core's parser and upstream validation; the hygiene
    warnings of :mod:`lcmoe_recipes.checks.hygiene` always."""
    from ..checks.hygiene import hygiene_findings
    from ..explain import all_findings  # the checks, then the predicted peak against the target's HBM

    load_bridge(quiet=True)
    model_seq, data_seq = cfg.model.seq_length, getattr(cfg.dataset, "seq_length", cfg.model.seq_length)
    if model_seq != data_seq:
        return [Finding("error", "config/seq-length", f"'seq_length' is {model_seq} on the model but "
                        f"{data_seq} on the dataset", f"set both: model.seq_length={model_seq} dataset.seq_length={model_seq}")]
    if isinstance(cfg.mixed_precision, str):  # a recipe name: upstream resolves it at setup; an unknown one stops here
        from megatron.bridge.training.mixed_precision import get_mixed_precision_config

        from ..checks.upstream_messages import UPSTREAM_MESSAGES

        try:
            get_mixed_precision_config(cfg.mixed_precision)
        except (KeyError, ValueError):
            fix = next(m.fix for m in UPSTREAM_MESSAGES if m.rule == "precision/name")
            return [Finding("error", "precision/name", f"mixed_precision '{cfg.mixed_precision}' is not a "
                            "megatron-bridge mixed-precision recipe name", fix)]
    plan = plan_from_config(cfg, hw, world_size, name)
    findings = path_findings(cfg) + all_findings(plan)  # + data, tokenizer, checkpoint paths (lcmoe_recipes.job_paths)
    if not any(f.severity == "error" for f in findings):
        try:
            _check_pipeline_layout(cfg, name)
        except InfeasibleConfig as exc:
            findings.insert(0, Finding("error", "pipeline/layout", exc.message.removeprefix(f"{name}: "), exc.fix))
    if not any(f.severity == "error" for f in findings):
        from megatron.bridge.training.config import runtime_config_update

        trial = copy.deepcopy(cfg)
        error = None
        # checkpoint.pretrained_checkpoint is read on the cluster: its existence is checked where the job runs.
        with target_environment(hw, world_size, cluster_paths=[trial.checkpoint.pretrained_checkpoint]), \
                _te_version_as(te_version), quiet_upstream():
            try:
                runtime_config_update(trial)
            except (AssertionError, ValueError, RuntimeError, TypeError, AttributeError, KeyError) as exc:
                error = exc
        # docs/checks.md: upstream's message mapped to our rule, else the asserts that fire after check time and the
        # settings upstream overrides, read from the resolved trial copy.
        with quiet_upstream():  # field defaults it compares with probe this machine (e.g. the fusion notice)
            findings[:0] = config_assert_findings(cfg, trial, hw, world_size, upstream_error=error)
    return sorted(findings + hygiene_findings(cfg, plan.model_spec), key=lambda f: f.severity != "error")


def validate_config(cfg, hardware: str | Hardware, world_size: int, name: str = "config",
                    versions: StackVersions | None = None) -> list:
    """:func:`config_findings` (known upstream bugs judged for ``versions``, default the installed ones), raising on
    the first error.

    Returns:
        the warnings (list of :class:`lcmoe_recipes.checks.Finding`).

    Raises:
        InfeasibleConfig: the first error, with its fix (all findings attached).
    """
    findings = config_findings(cfg, hardware, world_size, name, versions)
    raise_for_errors(findings, name)
    return findings
