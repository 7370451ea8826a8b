"""Readable text for plans, decision tables and findings (no megatron import): a compact summary a person reads,
with every source cited once by a short key and listed at the end; ``--explain`` (:mod:`lcmoe_recipes.report.explain`) keeps
every reason in full."""

from __future__ import annotations

import textwrap

from ..checks import Finding
from ..checks.feasibility import layout_is_legal
from ..core.plan import BASE_NOT_RECORDED, PRECISIONS, Plan
from ..core.ranks import placement

# The decisions a long-context plan turns on, shown one line each in the summary (every reason: --explain).
KEY_DECISIONS = ("model", "layout", "cp_comm_type", "recompute", "optimizer_cpu_offload", "dispatcher", "positions")
# shown in the summary only when they differ from megatron-core's default (the ring exchange is its default)
_ONLY_WHEN_SET = {"cp_comm_type": lambda plan: plan.layout.cp > 1 and plan.cp_comm_type not in (None, "p2p")}
WIDTH = 104  # characters per summary line
TIES_SHOWN = 12  # ties --explain lists (the winner always; every one is in --json)


def split_sources(source: str) -> list[str]:
    """The citations in a reason's source: ``;``-separated at the top level (not inside parentheses)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(source):
        depth += ch in "([" and 1 or ch in ")]" and -1 or 0
        if ch == ";" and depth == 0:
            parts.append(source[start:i])
            start = i + 1
    parts.append(source[start:])
    return [p.strip() for p in parts if p.strip()]


class Citations:
    """Sources cited by short keys (``[1]``, ``[2]``...): each distinct citation once per output, listed at the end."""

    def __init__(self) -> None:
        self.keys: dict[str, int] = {}

    def cite(self, source: str) -> str:
        """``[1, 3]``: the keys of ``source``'s citations, numbering new ones in order of first use."""
        keys = []
        for part in split_sources(source):
            keys.append(self.keys.setdefault(part, len(self.keys) + 1))
        return "[" + ", ".join(str(k) for k in dict.fromkeys(keys)) + "]" if keys else ""

    def listing(self, indent: str = "  ") -> str:
        """Every citation with its key, one per line (empty when nothing was cited)."""
        if not self.keys:
            return ""
        lines = [f"{indent}[{k}] {part}" for part, k in self.keys.items()]
        return "sources:\n" + "\n".join(textwrap.shorten(line, 400, placeholder=" ...") if len(line) > 400 else line
                                         for line in lines)


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.0f} GiB"


def one_line(text: str, tail: str = "", width: int = WIDTH) -> str:
    """``text`` (its indent kept) cut at a word to fit ``width`` with ``tail`` after it (``...`` where cut)."""
    body = text.lstrip()
    indent = text[: len(text) - len(body)]
    room = width - len(indent) - len(tail) - 1
    if len(body) > room:
        body = textwrap.shorten(body, room, placeholder=" ...")
    return f"{indent}{body} {tail}".rstrip()


def schedule_text(plan: Plan) -> str:
    """'1000 steps x 62.9M tokens = 62.9B tokens; LR 7.3e-06 constant after 20 warm-up steps' (or the base's)."""
    s = plan.schedule
    if s is None:
        return "the base recipe's"
    total = s.train_iters * plan.tokens_per_step
    decay = "constant" if s.lr_decay_style == "constant" else f"{s.lr_decay_style} to {s.min_lr:g}"
    return (f"{s.train_iters} steps x {plan.tokens_per_step / 1e6:.1f}M tokens = {total / 1e9:.1f}B tokens; LR {s.lr:g} "
            f"{decay} after {s.lr_warmup_iters} warm-up steps")


def plan_rows(plan: Plan) -> list[tuple[str, str]]:
    """(label, value) rows of ``plan``: target, layout (DP/EDP), batch, every knob."""
    lay, model, hw = plan.layout, plan.model_spec, plan.hardware_spec
    nodes = lay.world // hw.gpus_per_node
    return [
        ("recipe", plan.name),
        ("model", f"{model.display}: {model.num_layers} layers"
                  + (f" + {plan.mtp_num_layers} MTP" if plan.mtp_num_layers else "")
                  + (f", {model.num_moe_experts} experts top-{model.moe_router_topk}" if model.is_moe else ", dense MLP")
                  + f", {model.attention_kind} attention"
                  + (f" (window {model.sliding_window})" if model.sliding_window else "")),
        ("target", f"{lay.world} x {hw.display} ({nodes} nodes x {hw.gpus_per_node}, NVLink domain {hw.nvlink_domain}, "
                   f"{_gib(hw.hbm_bytes)} HBM each)"),
        ("seq_length", f"{plan.seq_length:,} tokens (model and dataset)"),
        ("layout", f"TP={lay.tp} PP={lay.pp} VPP={lay.vpp or 1} CP={lay.cp} EP={lay.ep} ETP={lay.etp} "
                   f"-> DP={lay.dp} EDP={lay.edp}"),
        ("pipeline layout", plan.pipeline_model_parallel_layout or "even split"),
        ("batch", f"MBS={plan.micro_batch_size} GBS={plan.global_batch_size} -> {plan.num_microbatches} "
                  f"microbatch{'' if plan.num_microbatches == 1 else 'es'} per DP rank, "
                  f"{plan.tokens_per_step / 1e6:.1f}M tokens per step"),
        ("precision", f"{plan.precision} (mixed_precision='{PRECISIONS.get(plan.precision, plan.precision)}')"),
        ("dispatcher", plan.moe_token_dispatcher_type
         + (f" + {plan.moe_flex_dispatcher_backend}" if plan.moe_flex_dispatcher_backend else "")),
        ("recompute", f"{plan.recompute_granularity}: {', '.join(plan.recompute_modules)}"
         if plan.recompute_granularity == "selective"
         else (f"full ({plan.recompute_method}, recompute_num_layers={plan.recompute_num_layers})"
               if plan.recompute_granularity else "none")),
        ("optimizer", ("distributed" if plan.use_distributed_optimizer else "replicated")
         + (", precision-aware" if plan.use_precision_aware_optimizer else "")
         + (f", CPU offload fraction {plan.optimizer_offload_fraction:g}" if plan.optimizer_cpu_offload else ", no CPU offload")),
        ("CUDA graphs", f"{plan.cuda_graph_impl}: {', '.join(plan.cuda_graph_modules)}"
         if plan.cuda_graph_impl != "none" else "none"),
        ("sequence parallel", "on" if plan.sequence_parallel else "off"),
        ("positions", plan.positions.describe() if plan.positions else "as the model was trained"),
        ("schedule", schedule_text(plan)),
        ("weights", f"from {plan.pretrained_checkpoint} (model weights; optimizer state fresh)"
         if plan.pretrained_checkpoint else "random: --from-hf DIR or --from-checkpoint DIR to extend a pretrained "
                                            "model"),
        ("based on", base_recipe_text(plan)),
    ]


def base_recipe_text(plan: Plan) -> str:
    """The megatron-bridge recipe ``plan`` started from, in words: the same for identical configs, whether planned here
    or read back from the YAML that records it."""
    if plan.base_recipe:
        return f"megatron-bridge {plan.base_recipe.rpartition(':')[2]}"
    if plan.reasons.get("base_recipe") == BASE_NOT_RECORDED:
        return "not recorded (a YAML without an lcmoe_recipes header)"
    return "megatron-bridge's pre-training template"


def key_reasons(plan: Plan) -> dict:
    """The reasons of :data:`KEY_DECISIONS` that ``plan`` has, in that order (the summary's "why" lines)."""
    return {k: plan.reasons[k] for k in KEY_DECISIONS
            if k in plan.reasons and _ONLY_WHEN_SET.get(k, lambda _: True)(plan)}


def format_plan(plan: Plan, warnings: list[Finding] = (), overrides: list[str] = (), citations: Citations | None = None,
                explain: bool = False, extra_rows: list[tuple[str, str]] = ()) -> str:
    """``plan`` as text: its rows (target, layout with DP and EDP, batch, every knob; ``extra_rows`` after its
    ``weights``), then why -- one line for each of :data:`KEY_DECISIONS` it has a reason for, or with ``explain`` every
    reason in full -- and the warnings. Sources are cited by key from ``citations`` (listed by the caller, once per
    output)."""
    citations = citations if citations is not None else Citations()
    rows = plan_rows(plan)
    if extra_rows:
        at = next(i for i, (k, _) in enumerate(rows) if k == "weights") + 1
        rows[at:at] = list(extra_rows)
    width = max(len(k) for k, _ in rows)
    lines = [f"  {k:<{width}}  {v}" for k, v in rows]
    if overrides:
        lines.append(f"  {'overrides':<{width}}  {' '.join(overrides)}")
    shown = plan.reasons if explain else key_reasons(plan)
    if shown:
        lines.append("  why:" if explain else "  why (the decisions that matter; --explain for every reason):")
        for knob, r in shown.items():
            tail = citations.cite(r.source)
            lines.append(f"    - {knob}: {r.why} {tail}" if explain else one_line(f"    - {knob}: {r.why}", tail))
    if warnings:
        lines.append("  warnings:")
        lines += [f"    - {w.rule}: {w.message}; {w.fix}" if explain else _short_warning(w) for w in warnings]
        if not explain and any(_is_known_issue(w) for w in warnings):
            lines.append("    (known upstream issues in one line each: --explain for each one's symptom, affected "
                         "versions and fix)")
    return "\n".join(lines)


def _is_known_issue(w: Finding) -> bool:
    return w.rule.startswith("known-issue/") and "]. " in w.message


def _short_warning(w: Finding) -> str:
    return f"    - {short_finding(w)}"


def short_finding(w: Finding) -> str:
    """A finding as a summary lists it: ``rule: message; fix`` in full, except a known upstream issue, whose title and
    sources stand for it (its symptom, affected versions and fix are several lines each; --explain prints them)."""
    if _is_known_issue(w):
        return f"{w.rule}: {w.message.split(']. ', 1)[0]}]"
    return f"{w.rule}: {w.message}; {w.fix}"


TABLE_COLUMNS = ("rank", "TP", "CP", "EP", "PP", "VPP", "DP", "EDP", "recompute", "offload", "MBS", "memory GiB",
                 "TP s", "CP s", "EP s", "DP s", "bubble s", "step s", "TFLOP/s", "MFU")
# with a calibration profile, the step and TFLOP/s columns are the profile's; these are the published fit's beside them
PUBLISHED_COLUMNS = ("step s (published)", "TFLOP/s (published)")


def table_records(result, calibrated: bool = False) -> list[dict]:
    """One record per ranked candidate, numbers unformatted (GiB of HBM use: the allocator's peak plus the buffers
    outside it; seconds per step; TFLOP/s; MFU as a fraction). ``calibrated``: the search ran with a calibration
    profile's constants, and the published fit's step and TFLOP/s are added beside them."""
    from ..cost import estimate_step

    records = []
    for i, c in enumerate(result.ranked, 1):
        lay, p, parts = c.plan.layout, c.plan, c.step.parts
        rec = "full" if p.recompute_granularity == "full" else ("+".join(p.recompute_modules) or "none")
        record = {"rank": i, "TP": lay.tp, "CP": lay.cp, "EP": lay.ep, "PP": lay.pp, "VPP": lay.vpp or 1,
                  "DP": lay.dp, "EDP": lay.edp, "recompute": rec, "offload": p.optimizer_offload_fraction,
                  "MBS": p.micro_batch_size, "memory GiB": c.memory.hbm_total / 2**30, "TP s": parts["tp_exposed"],
                  "CP s": parts["cp_exposed"], "EP s": parts["ep_exposed"], "DP s": parts["dp_exposed"],
                  "bubble s": parts["bubble"], "step s": c.step.step_seconds, "TFLOP/s": c.step.tflops_per_gpu,
                  "MFU": c.step.mfu}
        if calibrated:
            published = estimate_step(c.plan)
            record.update(zip(PUBLISHED_COLUMNS, (published.step_seconds, published.tflops_per_gpu)))
        records.append(record)
    return records


_JSON_KEYS = {"TFLOP/s": "tflops_per_gpu", "memory GiB": "hbm_use_gib", PUBLISHED_COLUMNS[0]: "step_seconds_published",
              PUBLISHED_COLUMNS[1]: "tflops_per_gpu_published"}


def json_key(column: str) -> str:
    """A decision-table column as a JSON key: lower case, no spaces, units spelled out ("memory GiB" ->
    "hbm_use_gib": the allocator's peak and the buffers outside it, "TP s" -> "tp_seconds", "TFLOP/s" ->
    "tflops_per_gpu")."""
    if column in _JSON_KEYS:
        return _JSON_KEYS[column]
    key = column.lower()
    if key.endswith(" s"):
        key = key[:-2] + "_seconds"
    return key.replace(" ", "_")


def json_records(result, calibrated: bool = False) -> list[dict]:
    """:func:`table_records` keyed by :func:`json_key` (``plan --json``)."""
    return [{json_key(k): v for k, v in r.items()} for r in table_records(result, calibrated)]


def table_rows(result, calibrated: bool = False) -> list[tuple]:
    """:func:`table_records` formatted for the text table and the CSV."""
    formats = {"offload": "{:g}", "memory GiB": "{:.1f}", "TP s": "{:.2f}", "CP s": "{:.2f}", "EP s": "{:.2f}",
               "DP s": "{:.2f}", "bubble s": "{:.2f}", "step s": "{:.2f}", "TFLOP/s": "{:.0f}", "MFU": "{:.1%}",
               PUBLISHED_COLUMNS[0]: "{:.2f}", PUBLISHED_COLUMNS[1]: "{:.0f}"}
    return [tuple(formats[k].format(v) if k in formats else v for k, v in r.items())
            for r in table_records(result, calibrated)]


def table_columns(calibrated: bool = False) -> tuple[str, ...]:
    """The decision table's columns (:data:`TABLE_COLUMNS`, and :data:`PUBLISHED_COLUMNS` with a profile)."""
    return TABLE_COLUMNS + (PUBLISHED_COLUMNS if calibrated else ())


def format_table(result, markdown: bool = False, calibrated: bool = False) -> str:
    """The decision table as aligned text (or Markdown)."""
    rows = [tuple(str(x) for x in table_columns(calibrated))] + [tuple(str(x) for x in r)
                                                                for r in table_rows(result, calibrated)]
    return aligned(rows, markdown)


def aligned(rows: list[tuple[str, ...]], markdown: bool = False, labels: bool = False) -> str:
    """Rows as Markdown, or as text columns aligned right (the first left when it holds ``labels``)."""
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows[1:]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) if labels and i == 0 else v.rjust(w)
                                for i, (v, w) in enumerate(zip(r, widths))) for r in rows)


def format_result(result, citations: Citations | None = None, explain: bool = False, calibrated: bool = False) -> str:
    """Decision table, the winner's knobs with their reasons, and what was rejected."""
    best = result.best
    citations = citations if citations is not None else Citations()
    layout = best.plan.reasons.get("layout")
    # the rules that passed over the faster rows shown (the CSV's tie-break column), the deciding one first
    passed = sorted({o[len("passed over ("):-1] for o in tie_outcomes(result) if o.startswith("passed over (")},
                    key=lambda r: (r != result.rule, r))
    rules = " and ".join(f"'{r}'" for r in passed or [result.rule])
    out = [f"{result.request.model} at seq_length {result.request.seq_length} on {result.request.num_gpus} x "
           f"{result.request.hardware}: {result.considered} layouts considered, {len(result.ranked)} shown "
           "(exposed seconds per step by collective)" + (
               f"; rank 1 is the winner, the others fastest first: the faster ones lost the tie-break (rule"
               f"{'s' if len(passed) > 1 else ''} {rules}, below)" if result.rule != "fastest" else ""),
           format_table(result, calibrated=calibrated), "",
           f"winner: {result.why} {citations.cite(layout.source) if layout else ''}".rstrip(),
           f"  pipeline layout {best.plan.pipeline_model_parallel_layout or 'none'}, MBS {best.plan.micro_batch_size} "
           f"GBS {best.plan.global_batch_size}, {best.plan.precision}, {best.plan.moe_token_dispatcher_type}"
           + (f" + {best.plan.moe_flex_dispatcher_backend}" if best.plan.moe_flex_dispatcher_backend else "")]
    shown = best.plan.reasons if explain else {k: r for k, r in key_reasons(best.plan).items()
                                               if k != "layout"}  # the layout's reason is the winner line
    for knob, r in shown.items():
        line = f"  - {knob}: {r.why}"
        out.append(f"{line} {citations.cite(r.source)}" if explain else one_line(line, citations.cite(r.source)))
    after = f", after {', '.join(result.rules[:-1])}" if len(result.rules) > 1 else ""
    out.append(f"  decided by: {result.rule}{after} (within ±{result.band:.1%} of the fastest, {result.ties} tie(s); "
               f"{result.band_reason})" if result.band_reason else f"  decided by: {result.rule}{after}")
    if result.tp_note:
        out.append(f"  TP: {result.tp_note}")
    if explain and len(result.tie_break) > 1:
        out.append("  ties (layout, MBS, step s, HBM headroom GiB, keeps the memory band free; the rule that passed "
                   "it over, or the winner):")
        shown = [t for t in result.tie_break[:TIES_SHOWN]] + [t for t in result.tie_break[TIES_SHOWN:] if t.winner]
        out += [f"    {t.layout}, MBS {t.mbs}: {t.step:.2f} s, {t.headroom / 2**30:.1f} GiB free"
                f"{', band free' if t.safe else ''}"
                + ("  <- winner" if t.winner else f"  (passed over: {t.passed_over})" if t.passed_over else "")
                for t in shown]
        if len(result.tie_break) > len(shown):
            out.append(f"    ... and {len(result.tie_break) - len(shown)} more (all in --json: tie_break)")
    if result.rejected:
        out.append("rejected: " + ", ".join(f"{k} {v}" for k, v in sorted(result.rejected.items(), key=lambda kv: -kv[1])))
    return "\n".join(out)


def tie_outcomes(result) -> list[str]:
    """Per ranked candidate, what the tie-break made of it (the text's table says it in its header and the winner
    line): "winner (rule R)" for rank 1, with the rule that decided (:attr:`SearchResult.rule`); "passed over (R)"
    for a faster tie the rule R passed over; "tie" for a slower one inside the error band; "" outside the band."""
    ties = {(t.layout, t.mbs): t for t in result.tie_break}
    out = []
    for i, c in enumerate(result.ranked):
        tie = ties.get((c.plan.layout.describe(), c.plan.micro_batch_size))
        out.append(f"winner (rule {result.rule})" if i == 0 else "" if tie is None else
                   f"passed over ({tie.passed_over})" if tie.passed_over and tie.step < result.best.step.step_seconds
                   else "tie")
    return out


def csv_table(result, calibrated: bool = False) -> list[tuple]:
    """The decision table's CSV rows, header first: :func:`table_columns` and a last column "tie-break"
    (:func:`tie_outcomes`: rank 1 is the winner, not always the fastest)."""
    return [table_columns(calibrated) + ("tie-break",)] + [
        row + (outcome,) for row, outcome in zip(table_rows(result, calibrated), tie_outcomes(result))]


def write_csv(result, path, calibrated: bool = False) -> None:
    """:func:`csv_table` written to ``path`` (``plan --csv``)."""
    import csv

    with open(path, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(csv_table(result, calibrated))


def format_costs(plan: Plan) -> str:
    """GPU memory breakdown (GiB per component), host memory per node (GiB per term) and step-time breakdown
    (seconds per cause, bytes per collective)."""
    from ..cost import estimate_host_memory, estimate_memory, estimate_step

    mem, step, host = estimate_memory(plan), estimate_step(plan), estimate_host_memory(plan)
    gib, host_gib = mem.gib(), host.gib()
    lines = [f"memory per GPU (PP rank {mem.pp_rank}, the most loaded), GiB: "
             + ", ".join(f"{k} {v:.1f}" for k, v in gib.items() if k != "total")
             + f" = {gib['total']:.1f} (allocator peak); HBM use with the CUDA context, NCCL and dispatcher "
             f"buffers {mem.hbm_total / 2**30:.1f} of {plan.hardware_spec.hbm_gib:.0f}"]
    lines.append(f"host memory per node (node {host.node}, {host.ranks} ranks, the most loaded), GiB: "
                 + ", ".join(f"{k} {v:.1f}" for k, v in host_gib.items() if k != "total")
                 + f" = {host_gib['total']:.1f} of {plan.hardware_spec.host_memory_gib:.0f}")
    lines.append(f"step {step.step_seconds:.2f} s: " + ", ".join(f"{k} {v:.2f}" for k, v in step.parts.items() if v > 0))
    lines.append("traffic per GPU per step, GB: " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in step.comm_bytes.items()
                                                            if v > 0))
    lines.append(f"predicted {step.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, {step.tflops_per_gpu:.0f} TFLOP/s/GPU, "
                 f"MFU {step.mfu:.1%} (of {plan.hardware_spec.peak(plan.precision):.0f} TFLOP/s dense {plan.precision})")
    return "\n".join(lines)


def format_findings(plan: Plan, findings: list[Finding]) -> str:
    """Layout, group placement and findings as text."""
    hw, lay = plan.hardware_spec, plan.layout
    lines = [f"{plan.name}: {lay.describe()} x {hw.display} ({hw.gpus_per_node} GPUs per node; NVLink domain "
             f"{hw.nvlink_domain}, placed in blocks of {hw.job_block})"]
    if not any(f.rule.startswith("rank-folding") for f in findings):
        lines.append("  group  size  nodes spanned  NVLink blocks spanned   (megatron-core rank order tp-cp-ep-dp-pp)")
        for kind, (size, nodes, blocks) in placement(lay, hw.gpus_per_node, hw.job_block).items():
            lines.append(f"  {kind:<5} {size:>5} {nodes:>14} {blocks:>22}")
    if layout_is_legal(findings):
        lines.append(format_costs(plan))
    if not findings:
        lines.append("no findings")
    for f in findings:
        lines.append(f"{f.severity:<7} {f.rule}: {f.message}")
        lines.append(f"        fix: {f.fix}")
    errors = sum(f.severity == "error" for f in findings)
    lines.append(f"{errors} error(s), {len(findings) - errors} warning(s)")
    return "\n".join(lines)
