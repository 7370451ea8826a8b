"""Open hazards a planned layout walks into, and the planner's answer to each.

An open hazard is a catalogued upstream bug with no fixed release (``catalog/known_issues.yaml``: an entry whose
``affected`` ranges have no upper bound) that applies to the pinned stack (the installed megatron-core /
megatron-bridge, the target's Transformer Engine; :func:`lcmoe_recipes.catalog.versions.installed_versions`). The
planner answers each one in one of three ways (:func:`lcmoe_recipes.planner.search.search_layouts`):

- **recipe**: an upstream recipe changed a setting to avoid it; the planner makes the same change
  (:data:`RECIPE_CHOICES`, applied by :func:`follow_recipe_choices` before the step is priced);
- **avoided**: among the candidates the step model cannot tell apart (the step error band), one walks into fewer open
  hazards than the fastest; that one wins, and the layout's reason says which hazard it avoids;
- **cannot avoid**: every candidate within the band walks into it (and, where every fitting candidate does, it is
  decided by the request: model, sequence length, GPU count); the layout's reason names it with its confidence;
- **not avoided**: a low-confidence report does not decide among the ties (its trigger may reach far beyond the
  configs that failed), so the planner does not give up predicted step time for it; the reason names it.

A plan is judged from the fields it decides (:func:`plan_view`: layout, dispatcher, CUDA graphs, recompute, MTP, CP
exchange, EP overlap, precision, optimizer offload, checkpointing); fields its base recipe sets (aux-loss type,
dataset) are judged again on the emitted ConfigContainer by ``check``. No torch / megatron import.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..catalog.known_issues import KnownIssue
from ..catalog.versions import installed_versions
from ..checks.conditions import holds
from ..checks.known_issues import catalogue, config_view
from ..core.plan import Plan, Reason, mixed_precision_name

SOURCE = ("lcmoe_recipes.planner.hazards: open entries of catalog/known_issues.yaml judged on the plan's fields "
          "(docs/known_issues.md)")


@dataclass(frozen=True)
class RecipeChoice:
    """What an upstream recipe changed to avoid a hazard: the Plan field, its value, and why (with the source)."""

    field: str
    value: Any
    why: str


# hazard id -> the upstream recipe's choice the planner follows
RECIPE_CHOICES = {
    "ep-a2a-overlap-b200": RecipeChoice(
        "moe_ep_overlap", False,
        "EP all-to-all overlap off on B200, as NVIDIA's DeepSeek-V3 B200 BF16 / FP8 current-scaling recipes keep it "
        "(Megatron-Bridge PR #1476; open hazard ep-a2a-overlap-b200, confidence low: the failure avoided is not "
        "recorded)"),
}


@functools.cache
def _open_entries() -> dict[str, KnownIssue]:
    """id -> entry, for every entry without a fixed release."""
    return {i.id: i for i in catalogue()[0] if i.fixed_in() == "no fixed release known"}


def plan_view(plan: Plan) -> dict[str, Any]:
    """The ConfigContainer fields ``plan`` decides, as the emitted config sets them (``emit/settings.py``), in the
    dict form the known-issue triggers read."""
    lay, spec = plan.layout, plan.model_spec
    moe = spec.is_moe
    model = {
        "tensor_model_parallel_size": lay.tp, "pipeline_model_parallel_size": lay.pp,
        "virtual_pipeline_model_parallel_size": lay.vpp, "context_parallel_size": lay.cp,
        "expert_model_parallel_size": lay.ep, "expert_tensor_parallel_size": None if plan.etp_unset else lay.etp,
        "num_moe_experts": spec.num_moe_experts if moe else None,
        "moe_token_dispatcher_type": plan.moe_token_dispatcher_type if moe else None,
        "moe_flex_dispatcher_backend": plan.moe_flex_dispatcher_backend if moe else None,
        "overlap_moe_expert_parallel_comm": plan.moe_ep_overlap,
        "cuda_graph_impl": plan.cuda_graph_impl, "cuda_graph_modules": list(plan.cuda_graph_modules),
        "recompute_granularity": plan.recompute_granularity, "recompute_method": plan.recompute_method,
        "recompute_modules": list(plan.recompute_modules) or None,
        "mtp_num_layers": plan.mtp_num_layers or None,
        "cp_comm_type": plan.cp_comm_type if lay.cp > 1 else None,
        "hierarchical_context_parallel_sizes": list(plan.hierarchical_cp_sizes) if plan.hierarchical_cp_sizes else None,
        "pipeline_model_parallel_layout": plan.pipeline_model_parallel_layout,
        "multi_latent_attention": spec.multi_latent_attention,
        "experimental_attention_variant": "gated_delta_net" if spec.gated_delta_net else None,
        "share_embeddings_and_output_weights": spec.tie_word_embeddings,
        "variable_seq_lengths": plan.variable_length,
        "softmax_type": "learnable" if spec.attention_sinks else "vanilla",
        "calculate_per_token_loss": True if lay.cp > 1 else None,  # _loss: per-token loss with CP > 1
    }
    run_dir = f"nemo_experiments/{plan.name}/checkpoints"  # _checkpoint: a restarted job resumes from its saves
    return {
        "model": model,
        "mixed_precision": mixed_precision_name(plan.precision),
        "optimizer": {"optimizer_cpu_offload": plan.optimizer_cpu_offload,
                      "overlap_cpu_optimizer_d2h_h2d": plan.optimizer_cpu_offload},
        "train": {"micro_batch_size": plan.micro_batch_size, "global_batch_size": plan.global_batch_size},
        "checkpoint": {"save": run_dir, "load": run_dir, "save_optim": True, "load_optim": True},
    }


def open_hazards(plan: Plan, only: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Ids of the open hazards ``plan`` walks into on the pinned stack, in catalogue order (the target's hardware,
    architecture and GPU count decide those keyed to them; an entry ``safe`` on the target's architecture is
    skipped), among ``only`` when given. Judged once per plan and ``only`` (the search asks again for the ties and
    their answers)."""
    return _open_hazards(plan, only)


@functools.lru_cache(maxsize=8192)
def _open_hazards(plan: Plan, only: tuple[str, ...] | None) -> tuple[str, ...]:
    view = config_view(plan_view(plan), plan.hardware_spec, plan.layout.world)
    arch = view.get("target.architecture")
    refs = catalogue()[1]
    return tuple(i.id for i in _pinned_open() if (only is None or i.id in only)
                 and i.on_architecture(arch if isinstance(arch, str) else None) != "safe"
                 and holds(i.trigger, view, refs))


@functools.cache
def _pinned_open() -> tuple[KnownIssue, ...]:
    """The open entries whose ranges hold for the pinned stack (installed_versions)."""
    versions = installed_versions().versions
    return tuple(i for i in _open_entries().values() if i.affects(versions))


def decides(issue_id: str) -> bool:
    """Whether the hazard decides among equal-cost ties: every one but a low-confidence report (whose trigger may
    reach far beyond the configs that failed) -- the planner does not trade predicted step time for those."""
    return _open_entries()[issue_id].confidence != "low"


def hazard_weight(issue_ids: tuple[str, ...]) -> tuple[int, int]:
    """How bad a set of open hazards is, for ranking equal-cost ties: (error entries, entries that decide, see
    :func:`decides`); fewer is better."""
    entries = _open_entries()
    return (sum(entries[i].severity == "error" for i in issue_ids if decides(i)),
            sum(decides(i) for i in issue_ids))


def confidence(issue_id: str) -> str:
    """The entry's confidence, or ``confirmed`` for an open bug whose cause upstream has confirmed."""
    return _open_entries()[issue_id].confidence or "confirmed"


def follow_recipe_choices(plan: Plan) -> Plan:
    """``plan`` with the upstream recipe's choice (:data:`RECIPE_CHOICES`) made for each open hazard it walks into,
    the changed knob's reason saying so; unchanged when it walks into none that has one."""
    for issue_id in open_hazards(plan, tuple(RECIPE_CHOICES)):
        choice = RECIPE_CHOICES[issue_id]
        if choice is None or getattr(plan, choice.field) == choice.value:
            continue
        plan = plan.with_changes(**{choice.field: choice.value},
                                 reasons={**plan.reasons, choice.field: Reason(choice.why, SOURCE)})
    return plan


def describe(issue_id: str) -> str:
    """``deepep-internode-dispatch-timeout (warning, confidence low)``."""
    return f"{issue_id} ({_open_entries()[issue_id].severity}, confidence {confidence(issue_id)})"
