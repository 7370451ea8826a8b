"""--explain and --json: every decision with its value, reason and source, every finding with its fix, and the cost
breakdowns -- as plain text for terminals and CI logs, as JSON for tools, as rich tables on a terminal.

Nothing here imports torch or megatron.
"""

from __future__ import annotations

import sys
from typing import Any

from ..checks import Finding
from ..checks.feasibility import layout_is_legal
from ..checks.findings import all_findings
from ..core.plan import BASE_NOT_RECORDED, PRECISIONS, Plan
from ..core.ranks import placement
from ..core.request import DEFAULT_MEMORY_MARGIN
from ..cost import HOST_MARGIN, estimate_host_memory, estimate_memory, estimate_step
from ..cost.attention import attention_backends, target_cudnn
from ..cost.provenance import budget_lines, constant_lines
from .text import Citations, schedule_text


def decisions(plan: Plan) -> list[tuple[str, str, str, str]]:
    """(knob, value, reason, source) for every decision of the plan; knobs without a recorded reason say so."""
    lay = plan.layout
    values = {
        "layout": lay.describe(),
        "pipeline_model_parallel_layout": plan.pipeline_model_parallel_layout or "even split (no pipeline)",
        "cp": str(lay.cp),
        "cp_comm_type": (plan.cp_comm_type or "p2p") + (
            f" (sizes {' x '.join(map(str, plan.hierarchical_cp_sizes))}: all-to-all inside, ring across)"
            if plan.hierarchical_cp_sizes else ""),
        "precision": f"{plan.precision} ({PRECISIONS.get(plan.precision, plan.precision)})",
        "dispatcher": plan.moe_token_dispatcher_type + (f" + {plan.moe_flex_dispatcher_backend}"
                                                         if plan.moe_flex_dispatcher_backend else ""),
        "recompute": ("full" if plan.recompute_granularity == "full" else
                      ", ".join(plan.recompute_modules) if plan.recompute_granularity else "none"),
        "optimizer_cpu_offload": f"{plan.optimizer_offload_fraction:g}" if plan.optimizer_cpu_offload else "off",
        "cuda_graphs": (f"{plan.cuda_graph_impl}: {', '.join(plan.cuda_graph_modules) or 'whole layer'}"
                        if plan.cuda_graph_impl != "none" else "none"),
        "global_batch_size": f"GBS {plan.global_batch_size}, MBS {plan.micro_batch_size}, "
                             f"{plan.num_microbatches} microbatches per DP rank",
        "sequence_parallel": "on" if plan.sequence_parallel else "off",
        **({"moe_ep_overlap": "on" if plan.moe_ep_overlap else "off"} if plan.model_spec.is_moe else {}),
        "positions": plan.positions.describe() if plan.positions else "as the model was trained",
        "schedule": schedule_text(plan),
        "pretrained_checkpoint": plan.pretrained_checkpoint or "none: random initialisation",
        "base_recipe": plan.base_recipe or ("not recorded" if plan.reasons.get("base_recipe") == BASE_NOT_RECORDED
                                            else "megatron-bridge recipes/common.py _pretrain_common"),
    }
    out = []
    for knob, value in values.items():
        reason = plan.reasons.get(knob)
        out.append((knob, value, reason.why if reason else "(no recorded reason: set by the config)",
                    reason.source if reason else "-"))
    return out


def explain_text(plan: Plan, findings: list[Finding] | None = None, citations: Citations | None = None,
                 with_decisions: bool = True) -> str:
    """Plain text: decisions (unless ``with_decisions`` is False: the caller printed every reason already), findings
    with fixes, placement, GPU and host memory and time breakdowns. With ``citations``, sources are cited by key (the
    caller lists them once, at the end of its output)."""
    findings = all_findings(plan) if findings is None else findings
    mem, step, hw = estimate_memory(plan), estimate_step(plan), plan.hardware_spec
    host = estimate_host_memory(plan)
    lines = [f"{plan.name}: {plan.model_spec.display}, seq_length {plan.seq_length}, {plan.layout.world} x {hw.display}"]
    if with_decisions:
        lines += ["", "decisions (value -- reason [source]):"]
        for knob, value, why, source in decisions(plan):
            cited = citations.cite(source) if citations is not None and source != "-" else f"[{source}]"
            lines.append(f"  {knob}: {value}\n      {why} {cited}")
    lines += ["", "findings:"] + ([f"  {f.severity} {f.rule}: {f.message}\n      fix: {f.fix}" for f in findings]
                                   or ["  none"])
    lines += ["", "placement (megatron-core rank order; group size, nodes spanned, NVLink blocks spanned):"]
    lines += [f"  {kind:<4} {size:>5} {nodes:>4} {blocks:>4}"
              for kind, (size, nodes, blocks) in placement(plan.layout, hw.gpus_per_node, hw.job_block).items()]
    gib = mem.gib()
    lines += ["", f"memory per GPU, PP rank {mem.pp_rank} (GiB; HBM {hw.hbm_gib:.0f}):"]
    lines += [f"  {k:<12} {v:8.1f}" for k, v in gib.items()]
    lines += ["", f"host memory per node, node {host.node} ({host.ranks} ranks; GiB; RAM {hw.host_memory_gib:.0f}, "
                  f"planning limit {HOST_MARGIN:.0%}, {hw.cpu_cores} CPU cores):"]
    lines += [f"  {k:<12} {v:8.1f}" for k, v in host.gib().items()]
    lines += ["", f"step {step.step_seconds:.2f} s ({step.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
                  f"{step.tflops_per_gpu:.0f} TFLOP/s/GPU, MFU {step.mfu:.1%}); seconds per step:"]
    lines += [f"  {k:<18} {v:8.2f}" for k, v in step.parts.items()]
    lines += ["traffic per GPU per step (GB):"] + [f"  {k:<5} {v / 1e9:10.2f}" for k, v in step.comm_bytes.items()]
    lines += ["overlaps (exposed = max(0, communication - the compute it runs beside); cost/overlap.py):"]
    lines += [f"  {o.describe()}" for o in step.overlaps] or ["  none: no communication"]
    image = target_cudnn()[1]
    lines += [f"attention backend (Transformer Engine's selection rules, cuDNN of {image}):"]
    lines += [f"  {kind:<8} {backend.describe()}" for kind, backend in attention_backends(plan)] or ["  none"]
    lines += [""] + budget_lines(plan, DEFAULT_MEMORY_MARGIN) + [""] + constant_lines(plan)
    return "\n".join(lines)


def explain_json(plan: Plan, findings: list[Finding] | None = None) -> dict[str, Any]:
    """The same content as :func:`explain_text`, as JSON-ready data (host memory: ``host_memory_gib`` per term on
    node ``host_node``, ``host_ram_gib`` per node). A layout that does not fold into its GPUs (a structural error:
    :func:`~lcmoe_recipes.checks.feasibility.layout_is_legal`) has no DP, memory or step: its document carries the
    layout and findings, ``priced`` False and why."""
    findings = all_findings(plan) if findings is None else findings
    lay, hw = plan.layout, plan.hardware_spec
    legal = layout_is_legal(findings)  # else the layout does not fold: DP, memory and step do not exist yet
    head = {"recipe": plan.name, "model": plan.model, "hardware": plan.hardware, "seq_length": plan.seq_length,
            "layout": {"world": lay.world, "tp": lay.tp, "pp": lay.pp, "vpp": lay.vpp, "cp": lay.cp, "ep": lay.ep,
                       "etp": lay.etp, "dp": lay.dp if legal else None, "edp": lay.edp if legal else None},
            "findings": [{"severity": f.severity, "rule": f.rule, "message": f.message, "fix": f.fix}
                         for f in findings], "priced": legal}
    if not legal:
        return {**head, "not_priced": "the layout does not fold into the GPUs (the errors in findings): no DP, memory "
                                      "or step exists to price until they are fixed"}
    mem, step = estimate_memory(plan), estimate_step(plan)
    host = estimate_host_memory(plan)
    return {
        **head,
        "decisions": [{"knob": k, "value": v, "reason": r, "source": s} for k, v, r, s in decisions(plan)],
        "memory_gib": mem.gib(), "memory_pp_rank": mem.pp_rank, "hbm_gib": hw.hbm_gib,
        "host_memory_gib": host.gib(), "host_node": host.node, "host_ranks": host.ranks,
        "host_ram_gib": hw.host_memory_gib, "host_margin": HOST_MARGIN,
        "step": {"seconds": step.step_seconds, "tokens_per_s_per_gpu": step.tokens_per_s_per_gpu,
                 "tflops_per_gpu": step.tflops_per_gpu, "mfu": step.mfu, "parts_seconds": step.parts,
                 "comm_bytes": step.comm_bytes,
                 "overlaps": [{"name": o.name, "on": o.on, "why": o.why, "communication_seconds": o.communication,
                               "exposed_seconds": o.exposed} for o in step.overlaps],
                 "attention_backends": [{"kind": kind, "backend": b.name, "why": list(b.why),
                                         "cudnn": ".".join(map(str, b.cudnn))}
                                        for kind, b in attention_backends(plan)]},
        "hbm_budget_gib": {line.replace(" ", "_"): gib for line, gib in mem.budget(hw.hbm_bytes, DEFAULT_MEMORY_MARGIN)},
        "provenance": constant_lines(plan),
    }


def print_table(columns: tuple[str, ...], rows: list[tuple], title: str = "", file=None) -> None:
    """A table: rich's on a terminal, aligned plain text otherwise (CI logs, pipes, tests)."""
    file = file or sys.stdout
    if file.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title or None)
        for c in columns:
            table.add_column(str(c), justify="left" if c in ("recompute", "collective", "component") else "right")
        for r in rows:
            table.add_row(*(str(x) for x in r))
        Console(file=file).print(table)
        return
    text = [tuple(str(c) for c in columns)] + [tuple(str(x) for x in r) for r in rows]
    widths = [max(len(r[i]) for r in text) for i in range(len(columns))]
    if title:
        print(title, file=file)
    for r in text:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths)), file=file)
