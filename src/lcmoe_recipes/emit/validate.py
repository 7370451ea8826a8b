"""A ConfigContainer checked for its target: our checks on the Plan it states, the memory and host models, the paths it
reads, megatron-bridge's own ``validate()`` with the target's probes answered (:mod:`.target`), the upstream asserts
that fire later, and the known upstream bugs for the versions the job runs (:func:`config_findings`,
:func:`validate_config`)."""

from __future__ import annotations

from ..catalog import Hardware, get_hardware
from ..checks import Finding, raise_for_errors
from ..checks.config_asserts import config_assert_findings
from ..checks.known_issues import StackVersions, assumed_version_findings, config_view, known_issue_findings
from ..checks.timeouts import timeout_findings
from ..checks.weights import pretrained_findings
from ..errors import InfeasibleConfig
from .fields import layout_to_str
from .paths import path_findings
from .readback import plan_from_config
from .stack import load_bridge, quiet_upstream
from .target import resolve_for_target, te_version_as


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
                    versions: StackVersions | None = None, own: bool | None = None) -> list:
    """Every finding for a ConfigContainer on ``world_size`` GPUs of ``hardware``, errors first.

    1. model and dataset ``seq_length`` must agree (rule ``config/seq-length``);
    2. read back into a Plan and run :func:`lcmoe_recipes.checks.check_plan` (rank folding, divisibility,
       batch, placement, dispatcher-on-hardware, recompute, offload, CUDA-graph rules: what upstream ``validate()``
       leaves to run time), then the memory model against the target's HBM (:func:`lcmoe_recipes.checks.memory.memory_findings`);
       with them the data, tokenizer and checkpoint paths (:func:`lcmoe_recipes.emit.paths.path_findings`);
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
       ``cfg`` is never changed; where ``own`` is not None and nothing failed, the effective settings read back
       from megatron itself (:func:`lcmoe_recipes.emit.effective.effective_settings`): each value that differs from
       the config is an error when ``own`` (our recipes and planner output must state what runs), else a warning
       naming the fix (rules ``effective/*``);
    5. always: the known upstream bugs whose trigger holds for ``cfg`` and whose affected versions include
       ``versions`` (default: the installed ones; rules ``known-issue/<id>``, see docs/known_issues.md);
    6. if no error so far: the distributed timeouts against the predicted longest waits
       (:func:`lcmoe_recipes.checks.timeouts.timeout_findings`, rules ``timeout/*``).

    Returns:
        list of :class:`lcmoe_recipes.checks.Finding`.
    """
    hw = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    te = versions.versions.get("transformer-engine") if versions is not None else None
    findings = _rule_and_upstream_findings(cfg, hw, world_size, name, te, own)
    # 5. Known upstream bugs for the versions the config will run with (catalog/known_issues.yaml).
    view = config_view(cfg, hw, world_size)
    findings += known_issue_findings(view, versions) + assumed_version_findings(view, versions)
    # 6. Timeouts against the cost model's longest waits (checks/timeouts.py), for a layout the checks accept.
    if not any(f.severity == "error" for f in findings):
        findings += timeout_findings(view, plan_from_config(cfg, hw, world_size, name))
    findings += hardware_env_findings(cfg, hw)
    return sorted(findings, key=lambda f: f.severity != "error")


def hardware_env_findings(cfg, hw: Hardware) -> list:
    """Warnings for a config that runs HybridEP (flex dispatcher): ``env/hybridep-ranks`` when its
    ``NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN`` is not EP x ETP (launch derives it; a hand edit of EP leaves it
    behind), and ``env/nvlink-domain`` when HybridEP's NVLink-domain variables are set for another system than ``hw``
    (:data:`~lcmoe_recipes.emit.settings.HARDWARE_ENV`): a GB200 recipe checked for H100 keeps
    ``NVLINK_DOMAIN_SIZE=72`` and ``USE_MNNVL=1``, which HybridEP reads to size its intra-domain groups and to choose
    multi-node NVLink."""
    from .settings import HARDWARE_ENV

    m, env = cfg.model, dict(getattr(cfg, "env_vars", None) or {})
    if m.moe_token_dispatcher_type != "flex" or getattr(m, "moe_flex_dispatcher_backend", None) != "hybridep":
        return []
    out = []
    etp = m.expert_tensor_parallel_size or m.tensor_model_parallel_size  # megatron-core: ETP None means TP
    ranks, key = m.expert_model_parallel_size * etp, "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"
    if key in env and str(env[key]) != str(ranks):  # a hand-edited EP that left the variable behind
        out.append(Finding("warning", "env/hybridep-ranks", f"env_vars.{key}={env[key]}, but EP x ETP = "
                           f"{m.expert_model_parallel_size} x {etp} = {ranks}: HybridEP sizes its groups from it",
                           f"set env_vars.{key}={ranks} (what launch derives for EP={m.expert_model_parallel_size}, "
                           f"ETP={etp})"))
    wanted = {k: v for k, v in HARDWARE_ENV.get(hw.nvlink_domain, {}).items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    wrong = {k: env[k] for k, v in wanted.items() if k in env and str(env[k]) != str(v)}
    if wrong:
        out.append(Finding("warning", "env/nvlink-domain", "env_vars " + ", ".join(f"{k}={v}" for k, v in wrong.items())
                           + f" describe another system than {hw.display} (NVLink domain of {hw.nvlink_domain} GPUs), "
                           "and HybridEP reads them", "set " + " ".join(f"env_vars.{k}={wanted[k]}" for k in wrong)
                           + " (what launch writes for this GPU)"))
    return out


def _rule_and_upstream_findings(cfg, hw: Hardware, world_size: int, name: str, te_version: str | None = None,
                                own: bool | None = None) -> list:
    """Steps 1-4 of :func:`config_findings`: every finding of our checks (memory where the layout is legal), then,
    when none is an error, the pipeline layout with megatron-core's parser and upstream validation; the hygiene
    warnings of :mod:`lcmoe_recipes.checks.hygiene` always."""
    from ..checks.hygiene import hygiene_findings
    from ..checks.findings import all_findings  # the checks, then the predicted peak against the target's HBM

    load_bridge(quiet=True)
    model_seq, data_seq = cfg.model.seq_length, getattr(cfg.dataset, "seq_length", cfg.model.seq_length)
    if model_seq != data_seq:
        return [Finding("error", "config/seq-length", f"'seq_length' is {model_seq} on the model but "
                        f"{data_seq} on the dataset", "set both to one value (in the YAML, or as launch overrides): "
                        f"model.seq_length={model_seq} dataset.seq_length={model_seq}")]
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
    # + data, tokenizer, checkpoint paths (lcmoe_recipes.emit.paths), and the weights it starts from where seen here
    findings = (path_findings(cfg) + pretrained_findings(getattr(cfg.checkpoint, "pretrained_checkpoint", None),
                                                         plan.model_spec) + all_findings(plan))
    if not any(f.severity == "error" for f in findings):
        try:
            _check_pipeline_layout(cfg, name)
        except InfeasibleConfig as exc:
            findings.insert(0, Finding("error", "pipeline/layout", exc.message.removeprefix(f"{name}: "), exc.fix))
    if not any(f.severity == "error" for f in findings):
        trial, error = resolve_for_target(cfg, hw, world_size, te_version)
        # docs/checks.md: upstream's message mapped to our rule, else the asserts that fire after check time and the
        # settings upstream overrides, read from the resolved trial copy.
        with quiet_upstream():  # field defaults it compares with probe this machine (e.g. the fusion notice)
            findings[:0] = config_assert_findings(cfg, trial, hw, world_size, upstream_error=error)
        if own is not None and not any(f.severity == "error" for f in findings):
            from .effective import effective_findings

            with te_version_as(te_version):
                findings[:0] = effective_findings(cfg, hw, world_size, own, resolved=trial)
    return sorted(findings + hygiene_findings(cfg, plan.model_spec), key=lambda f: f.severity != "error")


def validate_config(cfg, hardware: str | Hardware, world_size: int, name: str = "config",
                    versions: StackVersions | None = None, own: bool | None = None) -> list:
    """:func:`config_findings` (known upstream bugs judged for ``versions``, default the installed ones), raising on
    the first error.

    Returns:
        the warnings (list of :class:`lcmoe_recipes.checks.Finding`).

    Raises:
        InfeasibleConfig: the first error, with its fix (all findings attached).
    """
    findings = config_findings(cfg, hardware, world_size, name, versions, own)
    raise_for_errors(findings, name)
    return findings
