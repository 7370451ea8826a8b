"""``python -m lcmoe_recipes.launch MODEL --seq N [...] [Hydra overrides...]``: the main job.

Parses the flags into one :class:`~lcmoe_recipes.core.request.TrainingRequest`, prepares it (:func:`lcmoe_recipes.jobs.prepare.prepare`:
the named recipe or the search's plan, overridden, checked again for the target, written as YAML), prints a summary,
and runs it (:func:`lcmoe_recipes.jobs.submit.run`): ``--executor local`` (torchrun on this node) or ``--executor slurm`` (a
Slurm job through NeMo-Run); ``--dry-run`` prints the torchrun command or the sbatch script instead.

Exit codes: 0 done; 2 bad input (nothing written); 1 valid config but it cannot run here (too few GPUs) or the
launch failed (sbatch refused it, the job failed): the YAML is written, the message says why.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..cost import estimate_memory, estimate_step
from ..cost.wallclock import failure_cost, phase_time, save_intervals
from ..emit.stack import announce_loading
from ..errors import LcmoeError
from ..jobs.executors.common import EXECUTORS
from ..jobs.executors.kubeflow import KubeflowSettings, check_kubeflow_settings
from ..jobs.executors.slurm import SlurmSettings, check_settings
from ..jobs.prepare import Configured, prepare
from ..jobs.submit import run
from ..planner.recipes import NAMED_RECIPES
from ..report.text import Citations, format_plan
from .common import (ArgumentParser, calibrated_line, effective_json, effective_text, model_argument, read_back,
                     report_error, request_arguments, request_from_args)
from .train import rank_arguments

EPILOG = """\
examples:
  python -m lcmoe_recipes.launch qwen3_235b --seq 131072 --dry-run
  python -m lcmoe_recipes.launch dsv3 --seq 262144 --gpus 512 --hardware h100 --dry-run --output dsv3_256k.yaml
  python -m lcmoe_recipes.launch qwen3_235b --seq 131072 model.tensor_model_parallel_size=8 --dry-run
  python -m lcmoe_recipes.launch qwen3_next --seq 65536 train.global_batch_size=128 '+env_vars.NCCL_DEBUG=INFO' --dry-run
  python -m lcmoe_recipes.launch qwen3_235b --seq 65536 --gpus 64 --hardware gb200 --dry-run   (planned)
  python -m lcmoe_recipes.launch --list
  python -m lcmoe_recipes.launch qwen3_next --seq 8192 --executor local --smoke      (CPU-only 2-rank check)
  python -m lcmoe_recipes.launch dsv3 --seq 131072 --executor slurm --account ACCT --dry-run   (the sbatch script)
  python -m lcmoe_recipes.launch dsv3 --seq 131072 --executor slurm --account ACCT --partition batch --container-image nvcr.io/nvidia/nemo:26.06 --save-dir /lustre/$USER/dsv3_128k --time 2-00:00:00

overrides use Hydra syntax on the ConfigContainer: key=value, +key=value (add), ~key (delete; resets a field to
its default). Keys are megatron-bridge field names, e.g. model.context_parallel_size, train.global_batch_size,
optimizer.optimizer_offload_fraction, model.recompute_modules=[layernorm,moe_act].
"""


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m lcmoe_recipes.launch",
        description="Build, validate and launch a long-context MoE training config (megatron-bridge ConfigContainer).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_argument(parser, ", a named recipe (see --list)")
    parser.add_argument("--seq", type=int, metavar="N", help="sequence length in tokens (seq_length), e.g. 131072")
    parser.add_argument("--dry-run", action="store_true", help="print the summary, write the YAML and print the "
                        "torchrun command; do not launch")
    parser.add_argument("--build", action="store_true", help="before launching (or with --dry-run): build "
                        "megatron-core's real model of every pipeline stage at the full world size on this CPU and "
                        "compare its parameter and gradient bytes with our memory model (docs/build.md); a stage that "
                        "does not build stops the launch (exit 1)")
    parser.add_argument("--output", metavar="FILE", help="where to write the ConfigContainer YAML "
                        "(default: out/<recipe>.yaml; with overrides out/<recipe>+<hash of the overrides>.yaml)")
    parser.add_argument("--list", action="store_true", help="list the named recipes and exit")
    parser.add_argument("--explain", action="store_true", help="print every decision's reason in full (the default "
                        "summary shows the decisions that matter, one line each), every finding with its fix, "
                        "placement, memory and time breakdowns, and every effective value megatron derives from "
                        "the config with where it came from (section 'effective settings (read back from "
                        "megatron)')")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (decisions, findings, memory, "
                        "step, YAML path, cluster command, the effective settings read back from megatron: key "
                        "'effective') instead of text")
    parser.add_argument("--plot", metavar="DIR", help="write memory.png, time.png and sweep.png (4K-256K) into DIR")
    request_arguments(parser.add_argument_group("target, planning and run options (on a named recipe, layout flags "
                                                "plan its target instead, and another --gpus / --hardware / --seq "
                                                "plans its model there)"))
    ext = parser.add_argument_group("context extension (where the weights come from, phases, your own config)")
    source = ext.add_mutually_exclusive_group()
    source.add_argument("--from-hf", metavar="DIR", help="start from the weights of a local Hugging Face checkpoint "
                        "folder (config.json must be the planned model's); megatron-bridge reads it at the first start")
    source.add_argument("--from-checkpoint", metavar="DIR", help="start from the weights of a Megatron checkpoint (a "
                        "previous phase); its saved run config must be the planned model's")
    ext.add_argument("--convert-to", metavar="DIR", help="with --from-hf: convert the folder once into a Megatron "
                     "checkpoint here at the job's start (megatron-bridge's AutoBridge; reused when complete) and "
                     "start from that")
    ext.add_argument("--phases", metavar="S1,S2,...", help="one config per phase, e.g. 32768,131072 (DeepSeek-V3's "
                     "4K->32K->128K); each phase starts from the previous phase's checkpoints and is planned for its "
                     "own length")
    ext.add_argument("--from", dest="from_config", metavar="CONFIG.yaml", help="retarget your own ConfigContainer YAML, "
                     "or one of megatron-bridge's recipes by function name (e.g. the 4K "
                     "deepseek_v3_pretrain_1024gpu_h100_fp8sc_config), to --seq N: layout, CP, batch, recompute, "
                     "offload, CUDA graphs and positions re-planned, everything else kept; prints every field that "
                     "changed and why")
    run = parser.add_argument_group("running (--executor local: torchrun on this node; slurm: NeMo-Run SlurmExecutor; "
                                    "kubeflow: NeMo-Run KubeflowExecutor; GPUs per node from the hardware: 8 HGX, 4 "
                                    "GB200/GB300)")
    run.add_argument("--executor", choices=EXECUTORS, default="local", help="where to run (default: local)")
    rank_arguments(run)
    run.add_argument("--drill", nargs="?", const="out/drill", metavar="DIR", help="slurm: the fault drill instead "
                     "of a run: a 2-rank CPU job trains a small model with megatron-core checkpoints, once "
                     "uninterrupted and once through a SIGKILLed rank, a hung rank, a cancel-and-requeue and a "
                     "truncated checkpoint; prints 'faults injected N, survived N, steps lost S, corrupt loads 0' "
                     "(folder default out/drill; lcmoe_recipes.jobs.drill)")
    run.add_argument("--smoke-ranks", type=int, default=2, metavar="N", help="ranks of a --smoke run (default 2; "
                     "with --executor slurm the smoke job asks for 1 node and no GPUs)")
    run.add_argument("--smoke-nodes", type=int, default=1, metavar="N", help="slurm: nodes of a --smoke job (default "
                     "1); every node checks that the data, tokenizer and checkpoint paths exist there")
    run.add_argument("--nproc-per-node", type=int, metavar="N", help="local: ranks on this node (default: the "
                     "planned world size; a local run is one node)")
    run.add_argument("--no-wait", action="store_true", help="slurm: return once the job is submitted")
    run.add_argument("--mock-data", action="store_true", help="train on megatron-core's mock data (synthetic tokens) "
                     "on purpose: without it a launch that trains (not --dry-run, not --smoke) refuses a config with "
                     "no --data-path")
    run.add_argument("--from-scratch", action="store_true", help="start a context extension from random weights on "
                     "purpose: without it a launch that trains refuses an extension with no --from-hf / "
                     "--from-checkpoint")
    run.add_argument("--time", help="the job's wall-clock limit with its hours: HH:MM:SS or D-HH:MM:SS (slurm default "
                     "04:00:00; kubeflow: none unless given); training stops 20 min before it and saves a checkpoint "
                     "(train.exit_duration_in_mins)")
    run.add_argument("--container-image", metavar="IMAGE", help="the image the job runs (Pyxis/enroot on Slurm, the "
                     "pods' on Kubernetes): its stack is shown beside the target's, known upstream bugs are judged "
                     "for it, and where its megatron-core / megatron-bridge differ from 0.19.2 / 0.6.2 an overlay of "
                     "the pinned wheels is installed into the job folder (docs/launch.md); slurm default: this virtualenv")
    run.add_argument("--no-overlay", action="store_true", help="run the image's own megatron (the entry script then "
                     "refuses versions other than the config's)")
    run.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment variable "
                     "for the job (repeatable; wins over the recipe's env_vars)")
    run.add_argument("--fs-gbps", type=float, metavar="GB/S", help="write bandwidth of the checkpoint filesystem, "
                     "GB/s: sets the save cadence (default 20)")
    run.add_argument("--no-resiliency", action="store_true", help="slurm: no FT launcher, in-job restart or "
                     "straggler detection (on by default for a multi-node training job, sized from the predicted "
                     "step and save; docs/launch.md)")
    run.add_argument("--mtbf-hours", type=float, metavar="H", help="the job's mean time between failures, hours: "
                     "sets the recovery saves' interval, Young/Daly's sqrt(2 x save time x MTBF) (default: Llama 3's "
                     "published per-GPU rate, 419 interruptions in 54 days on 16,384 H100, over the job's GPUs)")
    run.add_argument("--calibration-run", action="store_true", help="instead of the target, the one-node run that "
                     "measures what calibration needs in 30 steps (the target's per-GPU shapes, one layer of each "
                     "kind, PP1); feed its log to lcmoe-calibrate")
    run.add_argument("--budget-hours", type=float, metavar="H", help="warn about a phase predicted to run longer, "
                     "with the --tokens-per-step that fits (default 48)")
    slurm = parser.add_argument_group("slurm executor")
    slurm.add_argument("--account", help="Slurm account (default $SBATCH_ACCOUNT; none: no account line)")
    slurm.add_argument("--partition", help="Slurm partition (default: the cluster's)")
    slurm.add_argument("--qos", help="Slurm QOS")
    slurm.add_argument("--python", metavar="PATH", help="without --container-image: the Python the nodes run (an "
                       "absolute path on shared storage; default this virtualenv's)")
    slurm.add_argument("--container-mounts", metavar="SRC:DST[,...]", help="container mounts, comma-separated")
    slurm.add_argument("--sbatch", action="append", default=[], metavar="FLAG=VALUE", help="extra #SBATCH flag, "
                       "e.g. --sbatch reservation=r1 (repeatable)")
    slurm.add_argument("--no-segment", action="store_true", help="NVL72: do not ask for --segment (Slurm older than "
                       "24.05 lacks it)")
    slurm.add_argument("--tunnel", choices=("local", "ssh"), default="local", help="local: sbatch on this machine; "
                       "ssh: submit on --host as --user")
    slurm.add_argument("--host", help="ssh tunnel: login node")
    slurm.add_argument("--user", help="ssh tunnel: user name")
    slurm.add_argument("--identity", metavar="KEYFILE", help="ssh tunnel: private key")
    slurm.add_argument("--job-dir", metavar="DIR", help="NeMo-Run experiment folder, on a filesystem every node "
                       "sees (on the cluster for ssh; default $NEMORUN_HOME/experiments)")
    kube = parser.add_argument_group("kubeflow executor (Kubeflow Trainer through NeMo-Run; needs --container-image)")
    kube.add_argument("--pvc", metavar="NAME", help="the PersistentVolumeClaim every pod mounts (ReadWriteMany): "
                      "code, checkpoints, logs")
    kube.add_argument("--pvc-mount", default="/shared", metavar="DIR", help="where the pods mount it (default "
                      "/shared); checkpoints and logs must go under it (--save-dir)")
    kube.add_argument("--namespace", default="default", help="Kubernetes namespace (default: default)")
    kube.add_argument("--runtime", default="torch-distributed", help="ClusterTrainingRuntime (default "
                      "torch-distributed)")
    kube.add_argument("--kubeconfig", metavar="FILE", help="kube config (default $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model.tensor_model_parallel_size=4")
    return parser


def list_recipes() -> str:
    """The named recipes as a table."""
    lines = [f"{'recipe':<24} {'model':<11} {'seq':>7} {'GPUs':>5} {'hardware':<8} summary"]
    for r in NAMED_RECIPES.values():
        lines.append(f"{r.name:<24} {r.model:<11} {r.seq_length:>7} {r.num_gpus:>5} {r.hardware:<8} {r.summary}")
    return "\n".join(lines)


def settings_from_args(args) -> SlurmSettings | KubeflowSettings:
    """The Slurm or Kubernetes settings the flags ask for (``--executor``).

    Raises:
        LcmoeError: an --env or --sbatch that is not KEY=VALUE.
    """
    def pairs(items: list[str], flag: str) -> dict[str, str]:
        out = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise LcmoeError(f"{flag} {item!r} is not KEY=VALUE", f"e.g. {flag} NCCL_DEBUG=INFO")
            out[key] = value
        return out

    if args.executor == "kubeflow":
        return KubeflowSettings(image=args.container_image, pvc=args.pvc, mount=args.pvc_mount,
                                namespace=args.namespace, runtime=args.runtime, time=args.time,
                                env=pairs(args.env, "--env"), kubeconfig=args.kubeconfig, overlay=not args.no_overlay)
    mounts = tuple(m for m in (args.container_mounts or "").split(",") if m)
    return SlurmSettings(account=args.account, partition=args.partition, time=args.time or "04:00:00", qos=args.qos,
                         container_image=args.container_image, container_mounts=mounts,
                         env=pairs(args.env, "--env"), tunnel=args.tunnel,
                         host=args.host, user=args.user, identity=args.identity, job_dir=args.job_dir,
                         sbatch=pairs(args.sbatch, "--sbatch"), segment=not args.no_segment, python=args.python,
                         overlay=not args.no_overlay)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    args = _parser().parse_intermixed_args(argv)
    if args.list:
        print(list_recipes())
        return 0
    try:
        for flag, value in (("--smoke-ranks", args.smoke_ranks), ("--smoke-nodes", args.smoke_nodes)):
            if value < 1:
                raise LcmoeError(f"{flag} {value} is not a positive count", f"e.g. {flag} 2")
        if args.drill and args.executor != "slurm":
            raise LcmoeError("--drill runs on Slurm (it cancels and requeues the job)",
                             "add --executor slurm (a one-node cluster: bash scripts/slurm_local.sh start)")
        settings = settings_from_args(args) if args.executor != "local" else None
        if isinstance(settings, SlurmSettings):
            check_settings(settings)  # before megatron-bridge loads (15-40 s), and before anything is written
        elif settings is not None:
            check_kubeflow_settings(settings)
        announce_loading()  # megatron-bridge loads on the way (10-40 s): say so
        request = request_from_args(args, named=tuple(NAMED_RECIPES))
        configs = prepare(request, container_image=args.container_image, output=args.output, settings=settings,
                      smoke=args.smoke or bool(args.drill), smoke_nodes=args.smoke_nodes,
                      budget_hours=args.budget_hours, overlay=not args.no_overlay,
                      start=not (args.dry_run or args.smoke or args.drill),
                      mock_data=args.mock_data, from_scratch=args.from_scratch,
                      resiliency=not args.no_resiliency)
    except LcmoeError as exc:
        return report_error(exc, args.json)

    citations = Citations()
    if args.container_image and not args.json:
        from ..jobs.overlay import compare_stack, format_stack

        print(format_stack(args.container_image, compare_stack(args.container_image,
                                                              configs[0].plan.hardware_spec.cpu_arch)) + "\n")
    for one in configs:
        _print_configured(one, args, citations)
    if args.plot:
        from ..report.plots import write_plot_files

        try:
            written = write_plot_files([b.shown for b in configs], args.plot)
        except LcmoeError as exc:
            return report_error(exc, args.json)
        print("plots: " + ", ".join(str(p) for p in written), file=sys.stderr if args.json else sys.stdout)

    if args.build:
        from ..planner.examine import build_ranks

        for one in configs:
            report = build_ranks(one.cfg, one.plan.layout.world, one.plan.hardware_spec.key, one.plan.name)
            print(report.table(), file=sys.stderr if args.json else sys.stdout)
            if not report.ok:
                return 1
    if args.drill:
        from ..jobs.drill import run_drill

        try:
            verdict = run_drill(configs[0], settings, args.drill)
        except LcmoeError as exc:
            return report_error(exc)
        print(verdict.text())
        print(f"drill: {verdict.seconds:.0f} s")
        return 0 if verdict.ok else 1
    results = []
    if not (args.dry_run and args.executor == "local" and not args.smoke):
        dependency = None
        for one in configs:
            try:
                result = run(one, args.executor, settings, smoke=args.smoke, smoke_ranks=args.smoke_ranks,
                             smoke_nodes=args.smoke_nodes, nproc_per_node=args.nproc_per_node, dry_run=args.dry_run,
                             wait=not args.no_wait and len(configs) == 1, replan=args.replan, after_job=dependency,
                             echo=not args.json)
            except LcmoeError as exc:
                if args.json:
                    print(json.dumps({"valid": True, "yaml": str(one.output), "launch": {"error": exc.message,
                                      "fix": exc.fix}}, indent=2))
                else:
                    report_error(exc)
                return exc.exit_code
            results.append(result)
            if not result.ok:
                break
            # a dry run shows the chain as it will be: the next phase's sbatch waits on this job (afterok)
            dependency = result.job_id or (f"<job id of {one.plan.name}>" if args.dry_run else None)
    if args.json:
        _print_json(configs, results, args)
    else:
        for result in results:
            if result.script:
                what = ("TrainJob manifest (what NeMo-Run's KubeflowExecutor submits)" if result.executor == "kubeflow"
                        else f"sbatch script ({result.command} $SBATCH_SCRIPT)")
                print(f"\n{what}:\n{result.script}")
            elif result.state == "DRY_RUN":
                print(f"\nlocal command:\n  {result.command}")
            print("\n" + result.summary())
        if sources := citations.listing():
            print("\n" + sources)
    failed = next((r for r in results if not r.ok), None)
    if failed is None:
        return 0
    # a smoke run exits as the entry script does (2: refused, e.g. a path missing on a node; 1: a wrong answer)
    return failed.exit_code if args.smoke and failed.executor == "local" and failed.exit_code in (1, 2) else 1


def _read_back(one: Configured, args: argparse.Namespace):
    """:func:`lcmoe_recipes.cli.common.read_back` of one prepared config, for the TE its job runs."""
    return read_back(one.cfg, one.shown.hardware_spec, one.shown.layout.world, args.container_image,
                     overlay=not args.no_overlay)


def _print_json(configs: list[Configured], results: list, args: argparse.Namespace) -> None:
    from ..report.explain import explain_json

    docs = []
    for index, one in enumerate(configs):
        doc = {**explain_json(one.shown, one.warnings), "valid": True, "yaml": str(one.output),
               "command": one.command, "overrides": one.overrides,
               "effective": effective_json(_read_back(one, args))}
        if one.changes:
            doc["changes"] = [{"field": d.path, "before": d.upstream, "after": d.ours, "setting": d.setting,
                               "reason": d.reason.why} for d in one.changes]
        if index < len(results):
            doc["launch"] = dataclasses.asdict(results[index])
        docs.append(doc)
    print(json.dumps(docs[0] if len(docs) == 1 else {"phases": docs}, indent=2, default=str))


def _print_configured(one: Configured, args: argparse.Namespace, citations: Citations) -> None:
    """The summary of one prepared config: target and checks passed, what a retargeting changed, the plan's rows with
    the decisions that matter (every reason with --explain), the prediction, the YAML and the cluster command."""
    if args.json:
        return
    plan, hw = one.plan, one.plan.hardware_spec
    print(f"{plan.name}: valid for {plan.layout.world} x {hw.key} (our checks + memory model + megatron-bridge "
          "validate())")
    if one.changes:
        print(f"retargeted {one.meta.get('retargeted_from')}: {len(one.changes)} field(s) changed (each setting's "
              "reason once, below its fields)")
        by_setting: dict[str, list] = {}
        for d in one.changes:
            by_setting.setdefault(d.setting, []).append(d)
        for setting, changes in by_setting.items():
            for d in changes:
                print(f"  {d.path}: {d.upstream!r} -> {d.ours!r}")
            print(f"    [{setting}: {changes[0].reason.why}]")
    from ..emit.paths import data_text

    print(format_plan(one.shown, one.warnings, one.overrides, citations, explain=args.explain,
                      extra_rows=[("data", data_text(one.cfg))]))
    mem, step = estimate_memory(one.shown), estimate_step(one.shown)
    print(f"  predicted: {mem.hbm_total / 2**30:.1f} of {hw.hbm_gib:.0f} GiB HBM use per GPU (PP rank {mem.pp_rank}); "
          f"step "
          f"{step.step_seconds:.1f} s, {step.tflops_per_gpu:.0f} TFLOP/s per GPU, MFU {step.mfu:.0%} (docs/accuracy.md)")
    if args.calibration:
        print("  " + calibrated_line(one.shown, args.calibration))
    if one.shown.schedule is not None:
        print(f"  phase: {phase_time(one.shown).text()}")
    cadence = save_intervals(one.shown)
    written = getattr(one.cfg.checkpoint, "non_persistent_save_interval", None)
    if written and written != cadence.non_persistent:  # the job's time limit lowered it (the notes say why)
        cadence = dataclasses.replace(cadence, non_persistent=written, bound="the job's time limit")
    losses = failure_cost(one.shown, cadence)
    if not args.explain:
        print(f"  checkpoints: {cadence.short()}; {losses.short()}")
    else:
        from ..report.explain import explain_text

        print(f"  checkpoints: {cadence.recovery} steps between the saves a restart resumes from: {cadence.reason.why}")
        print(f"  {losses.text()}")
        print("\n" + explain_text(one.shown, one.warnings, citations, with_decisions=False))
        print("\n" + effective_text(_read_back(one, args)))
    print(f"\nConfigContainer YAML: {one.output}")
    if args.executor == "local" and not args.smoke:  # for slurm, the sbatch script is the command
        nodes = plan.layout.world // hw.gpus_per_node
        where = (f"on each of the {nodes} nodes" if nodes > 1 else
                 f"on one node, {min(plan.layout.world, hw.gpus_per_node)} GPUs")
        print(f"cluster command ({where}):\n  {one.command}")
