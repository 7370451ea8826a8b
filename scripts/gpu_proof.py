"""The GPU proof: one-GPU proxies of the three families, each converted from a Hugging Face checkpoint and trained
through our own entry script on real tokens; measured loss, peak memory and step time beside our cost model.

Run it with ``bash scripts/gpu_proof.sh`` (docs/gpu_proof.md). Subcommands (each a separate process, as a cluster
job's steps would be):

* ``data DIR``: the repository's own text (README, docs, source) as byte-level tokens (id = UTF-8 byte, one
  end-of-document id 256 after each file), written with megatron-core's ``IndexedDatasetBuilder`` as
  ``DIR/text_document.{bin,idx}``, and the Hugging Face tokenizer of those ids as ``DIR/tokenizer`` (the train step's
  ``--tokenizer``). Nothing is downloaded.
* ``hf MODEL DIR``: the proxy's config.json with random weights, saved by transformers (``save_pretrained``).
* ``logits MODEL HF MEGATRON``: the converted checkpoint loaded back (megatron-bridge ``AutoBridge.load_megatron_model``)
  and one forward pass in fp32 against the Hugging Face model's logits on the same tokens.
* ``config MODEL YAML``: the proxy planned for 1 x H200 (our planner and checks), megatron-core's local modules where
  Transformer Engine is absent, started from the converted checkpoint, validated, written as YAML; the prediction
  (``lcmoe_recipes.cost.estimate_memory`` / ``estimate_step``) beside it as JSON, with, on the local modules, what
  they keep beyond TE's kernels (:func:`local_excess`: the s x s softmax probabilities first).
* ``all WORK OUT``: everything above for each proxy, then ``python -m lcmoe_recipes.train --metrics`` under torchrun,
  and the table in ``OUT`` (JSON).
* ``ranks WORK OUT``: the most loaded rank of each named recipe at its full world size, alone on this GPU
  (``python -m lcmoe_recipes.train --recipe NAME --as-rank R``, :mod:`lcmoe_recipes.emit.probe.rank_run`): torch's peak
  allocated / reserved beside our prediction for that rank, as JSON in ``OUT``; a rank predicted larger than this
  GPU, or one that needs Transformer Engine where it is absent, is recorded as skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lcmoe_recipes.catalog import get_model  # noqa: E402

PROXIES = ("proxy_qwen3_moe", "proxy_dsv3", "proxy_qwen3_next")
LOGIT_TOLERANCE = 1e-3  # max |logit difference| in fp32 (TF32 off); logits of these random models are O(1)


EOD = "<|endoftext|>"
EOD_ID = 256  # the byte-level tokenizer's one special token, after the 256 bytes


def write_tokenizer(folder: Path) -> Path:
    """A byte-level Hugging Face tokenizer (``tokenizers``' ByteLevel pre-tokenizer, no merges: id = UTF-8 byte) with
    one end-of-document token, id :data:`EOD_ID`, saved with ``save_pretrained``: the tokenizer the proof's data is
    written with, given to the entry script as ``--tokenizer`` (a user's run gives its own the same way)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    vocab[EOD] = EOD_ID
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOD, bos_token=EOD, pad_token=EOD)
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return folder


def build_data(folder: Path) -> tuple[Path, Path]:
    """The repository's text files as byte-level tokens (:func:`write_tokenizer`'s ids) in a Megatron indexed dataset;
    returns (dataset prefix, tokenizer folder)."""
    import numpy as np
    import torch

    from lcmoe_recipes.emit.stack import load_bridge

    load_bridge(quiet=True)
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tokenizer(folder / "tokenizer")
    prefix = folder / "text_document"
    files = sorted(p for pattern in ("*.md", "docs/*.md", "src/**/*.py", "scripts/*.py", "tests/*.py", "recipes/*.yaml")
                   for p in ROOT.glob(pattern))
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    tokens = 0
    for path in files:
        ids = list(path.read_bytes()) + [EOD_ID]
        builder.add_document(torch.tensor(ids, dtype=torch.int32), [len(ids)])
        tokens += len(ids)
    builder.finalize(f"{prefix}.idx")
    print(f"data: {len(files)} files, {tokens} tokens -> {prefix}.bin/.idx (tokenizer {tokenizer})")
    return prefix, tokenizer


def hf_config_class(model: str) -> str:
    """The ``transformers`` config class of catalogue model ``model``: its own, else the one the catalogue derives
    from its ``model_type`` (:meth:`lcmoe_recipes.catalog.ModelSpec.hf_config`)."""
    spec = get_model(model)
    return spec.hf_config_class or type(spec.hf_config()).__name__


def write_hf(model: str, folder: Path) -> None:
    from lcmoe_recipes.emit.convert import write_random_hf_checkpoint

    spec = get_model(model)
    write_random_hf_checkpoint({**spec.config, "torch_dtype": "float32"}, hf_config_class(model), folder)
    print(f"hf: {spec.display} with random weights -> {folder}")


def logits(model: str, hf: Path, megatron: Path) -> dict:
    """Megatron (converted, loaded back) vs Hugging Face logits on 2 x 256 tokens, fp32."""
    import torch
    import transformers

    from lcmoe_recipes.emit.stack import load_bridge

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    load_bridge(quiet=True)
    from megatron.bridge import AutoBridge
    from megatron.bridge.training.model_load_save import temporary_distributed_context

    spec = get_model(model)
    torch.manual_seed(1)
    ids = torch.randint(0, min(spec.vocab_size, 256), (2, 256), device="cuda")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        expected = ref(input_ids=ids).logits.float()
    del ref
    with temporary_distributed_context(backend="nccl"):
        bridge = AutoBridge.from_hf_pretrained(str(hf))
        chunks = bridge.load_megatron_model(str(megatron))
        net = chunks[0].cuda().float().eval()
        positions = torch.arange(ids.shape[1], device="cuda").unsqueeze(0).expand_as(ids)
        with torch.no_grad():
            got = net(input_ids=ids, position_ids=positions, attention_mask=None)
        got = got[..., : spec.vocab_size].float()
    diff = (got - expected).abs()
    result = {"max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item(),
              "top1_agreement": (got.argmax(-1) == expected.argmax(-1)).float().mean().item(),
              "logit_scale": expected.abs().mean().item(), "tolerance": LOGIT_TOLERANCE}
    result["match"] = result["max_abs_diff"] <= LOGIT_TOLERANCE
    print("logits: " + json.dumps(result))
    return result


def proof_plan(model: str, seq_length: int, global_batch_size: int):
    """The proxy planned by our planner for 1 x H200 in BF16 with the all-to-all dispatcher (no DeepEP/HybridEP
    and no FP8 without Transformer Engine)."""
    from lcmoe_recipes.planner.search import search_layouts
    from lcmoe_recipes.core.request import TrainingRequest

    return search_layouts(TrainingRequest(model=model, seq_length=seq_length, hardware="h200", num_gpus=1, precision="bf16",
                                dispatcher="alltoall", global_batch_size=global_batch_size)).best.plan


def proof_config(model: str, yaml_path: Path, pretrained: Path | None, steps: int, seq_length: int,
                 global_batch_size: int, drop_mtp: bool) -> dict:
    """Write the proxy's ConfigContainer (validated for 1 x H200) and return our prediction for its plan."""
    from lcmoe_recipes import emit
    from lcmoe_recipes.cost import estimate_memory, estimate_step
    from lcmoe_recipes.emit.local_impl import optimizer_without_te, use_local_implementation
    from lcmoe_recipes.emit.readback import plan_from_config
    from lcmoe_recipes.emit.stack import te_installed

    plan = proof_plan(model, seq_length, global_batch_size)
    cfg = emit.config_from_plan(plan, validate=False, quiet=True)
    changes = [] if te_installed() else (use_local_implementation(cfg.model, drop_mtp=drop_mtp)
                                         + optimizer_without_te(cfg.optimizer))
    cfg.train.train_iters = steps
    cfg.scheduler.lr_warmup_iters = min(2, steps - 1)
    cfg.scheduler.lr_decay_iters = steps
    cfg.logger.log_interval = 1
    cfg.checkpoint.save = None
    cfg.checkpoint.load = None  # nothing to resume: the run starts from pretrained_checkpoint
    cfg.checkpoint.async_save = False  # nothing is saved (megatron-bridge refuses async_save without a save path)
    cfg.checkpoint.pretrained_checkpoint = str(pretrained) if pretrained else None
    cfg.validation.eval_interval = None
    cfg.validation.eval_iters = 0
    meta = emit.target_meta(plan)
    emit.validate_config(cfg, "h200", 1, plan.name)
    emit.write_yaml(cfg, yaml_path, meta)
    plan = plan_from_config(cfg, "h200", 1, plan.name)  # as it runs: the local modules' and optimizer's changes
    mem, step = estimate_memory(plan), estimate_step(plan)
    prediction = {"plan": {"layout": str(plan.layout), "micro_batch_size": plan.micro_batch_size,
                           "global_batch_size": plan.global_batch_size, "seq_length": plan.seq_length,
                           "recompute": [plan.recompute_granularity, list(plan.recompute_modules)],
                           "precision": plan.precision},
                  "predicted_peak_gib": mem.gib()["total"], "predicted_memory_gib": mem.gib(),
                  "predicted_step_seconds": step.step_seconds, "local_implementation": changes}
    if changes:
        prediction.update(local_excess(plan))
    print(f"config: {model} -> {yaml_path}")
    return prediction


def local_excess(plan) -> dict:
    """What the proof's run keeps beyond our memory model's (which prices Transformer Engine's kernels) because it
    runs on megatron-core's local modules: per decoder layer on the rank, measured on this CPU with and without TE's
    kernels' stand-ins and carried to the sequence length (:func:`lcmoe_recipes.emit.probe.activations.
    local_excess_bytes`), times the microbatch size (one microbatch in flight at PP 1), plus the one causal mask
    every layer shares (seq_length² bytes). Returns the excess and the peak prediction as run, in GiB."""
    from lcmoe_recipes.cost import estimate_memory
    from lcmoe_recipes.cost.step import rank_kinds
    from lcmoe_recipes.emit.probe.activations import local_excess_bytes

    if plan.layout.pp != 1:
        raise SystemExit("local_excess: the proof runs one GPU (PP 1)")
    excess = plan.seq_length ** 2 + plan.micro_batch_size * sum(
        count * local_excess_bytes(plan, layer, plan.seq_length) for _, layer, count in rank_kinds(plan, 0))
    return {"local_excess_gib": excess / 2**30,
            "predicted_peak_as_run_gib": (estimate_memory(plan).total + excess) / 2**30}


def measured_over_predicted(prediction: dict, measured: dict) -> dict:
    """Measured peak and step time over ours (``proof_config``'s prediction; {} where there is none), and the peak
    over our prediction as run where the run used the local modules (``predicted_peak_as_run_gib``)."""
    if "predicted_peak_gib" not in prediction:
        return {}
    out = {"peak_measured_over_predicted": measured["peak_allocated_gib"] / prediction["predicted_peak_gib"],
           "step_measured_over_predicted": measured["step_seconds_median"] / prediction["predicted_step_seconds"]}
    if "predicted_peak_as_run_gib" in prediction:  # our model plus what the local modules keep beyond TE's
        out["peak_measured_over_predicted_as_run"] = (measured["peak_allocated_gib"]
                                                      / prediction["predicted_peak_as_run_gib"])
    return out


def _run(cmd: list[str], log: Path, timeout: int) -> int:
    print("+ " + " ".join(cmd), flush=True)
    with open(log, "w") as out:
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT).returncode


def _tail(log: Path, lines: int = 8) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def run_all(work: Path, out: Path, steps: int, seq_length: int, global_batch_size: int, models: list[str]) -> dict:
    import torch

    from lcmoe_recipes.emit.stack import te_installed

    work.mkdir(parents=True, exist_ok=True)
    te = te_installed()
    report = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "transformer_engine": te, "steps": steps, "seq_length": seq_length,
              "global_batch_size": global_batch_size, "data": "byte-level tokens of this repository's text",
              "models": {}}
    py = sys.executable
    here = str(Path(__file__).resolve())
    prefix, tokenizer = build_data(work / "data")
    for model in models:
        spec, row = get_model(model), {}
        report["models"][model] = row
        if not te and (spec.gated_delta_net or spec.multi_latent_attention):
            row["skipped"] = (("gated DeltaNet layers are built only with Transformer Engine (megatron-core 0.19.2 "
                               "experimental_attention_variant_module_specs)" if spec.gated_delta_net else
                               "multi-latent attention runs only with Transformer Engine (megatron-core 0.19.2 "
                               "multi_latent_attention.py passes k_channels to a core attention only TE's takes)")
                              + "; none on this machine")
            continue
        drop_mtp = bool(spec.mtp_num_layers) and not te
        if drop_mtp:
            row["mtp"] = "left out: megatron-bridge 0.6.2 builds MTP layers only with Transformer Engine"
        hf, mg, logs = work / f"hf_{model}", work / f"mg_{model}", work / f"logs_{model}"
        logs.mkdir(exist_ok=True)
        steps_done = []
        for name, cmd, timeout in (
                ("hf", [py, here, "hf", model, str(hf)], 600),
                ("convert", [py, "-m", "lcmoe_recipes.convert", "--hf", str(hf), "--out", str(mg), "--model", model]
                 + (["--drop-mtp"] if drop_mtp else []), 900),
                ("logits", [py, here, "logits", model, str(hf), str(mg)], 600),
                ("config", [py, here, "config", model, str(work / f"{model}.yaml"), "--pretrained", str(mg),
                            "--steps", str(steps), "--seq", str(seq_length), "--gbs", str(global_batch_size)]
                 + (["--drop-mtp"] if drop_mtp else []), 600),
                ("train", [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m",
                           "lcmoe_recipes.train", "--config", str(work / f"{model}.yaml"), "--data-path", str(prefix),
                           "--tokenizer", str(tokenizer), "--metrics", str(work / f"{model}.metrics.json")], 1800)):
            start = time.monotonic()
            rc = _run(cmd, logs / f"{name}.log", timeout)
            steps_done.append({"step": name, "rc": rc, "seconds": round(time.monotonic() - start, 1)})
            if rc:
                row.setdefault("failed", []).append({"step": name, "rc": rc, "log_tail": _tail(logs / f"{name}.log")})
                if name != "logits":  # a logit mismatch or crash is recorded; training still runs
                    break
                continue
            if name == "logits":
                line = next(l for l in (logs / "logits.log").read_text().splitlines() if l.startswith("logits: "))
                row["logits"] = json.loads(line.removeprefix("logits: "))
            if name == "config":
                row.update(json.loads((work / f"{model}.yaml.prediction.json").read_text()))
        row["steps"] = steps_done
        metrics = work / f"{model}.metrics.json"
        if metrics.exists():
            measured = json.loads(metrics.read_text())["steps"]
            times = [s["seconds"] for s in measured[3:]] or [s["seconds"] for s in measured]
            losses = [s["loss"].get("lm loss") for s in measured]
            row["measured"] = {"loss_first": losses[0], "loss_last": losses[-1], "losses": losses,
                               "peak_allocated_gib": max(s["max_allocated_bytes"] for s in measured) / 2**30,
                               "step_seconds_median": statistics.median(times), "steps_timed": len(times)}
            row["measured"].update(measured_over_predicted(row, row["measured"]))
        out.write_text(json.dumps(report, indent=1))
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return report


AS_RANK_STEPS = 3
AS_RANK_HEADROOM = 0.95  # run a rank only when our prediction is under this share of the GPU's memory


def rank_jobs(recipes: list[str], gpu_bytes: int, te: bool) -> list[dict]:
    """Per named recipe: its most loaded rank, our prediction for it, and either the command that measures it on this
    GPU or why it is skipped (predicted larger than ``AS_RANK_HEADROOM`` of ``gpu_bytes``, or a part that needs
    Transformer Engine where ``te`` is False)."""
    from lcmoe_recipes import recipe_plan
    from lcmoe_recipes.cost import estimate_memory
    from lcmoe_recipes.emit.probe.rank_run import most_loaded_rank

    jobs = []
    for name in recipes:
        plan = recipe_plan(name)
        spec, rank, predicted = plan.model_spec, most_loaded_rank(plan), estimate_memory(plan).total
        job = {"recipe": name, "rank": rank, "predicted_gib": predicted / 2**30}
        if predicted > AS_RANK_HEADROOM * gpu_bytes:
            job["skipped"] = (f"predicted {predicted / 2**30:.0f} GiB for rank {rank}, more than "
                              f"{AS_RANK_HEADROOM:.0%} of this GPU's {gpu_bytes / 2**30:.0f} GiB")
        elif not te and (plan.precision != "bf16" or spec.gated_delta_net or spec.multi_latent_attention
                         or plan.mtp_num_layers or plan.layout.cp > 1):
            job["skipped"] = "needs Transformer Engine (FP8, MLA, MTP, gated DeltaNet or CP > 1); none on this machine"
        else:
            job["command"] = [sys.executable, "-m", "lcmoe_recipes.train", "--recipe", name, "--as-rank", str(rank),
                              "--steps", str(AS_RANK_STEPS)]
        jobs.append(job)
    return jobs


def run_ranks(work: Path, out: Path, recipes: list[str]) -> dict:
    """The most loaded rank of each named recipe, alone on this GPU (module doc, ``ranks``)."""
    import torch

    from lcmoe_recipes.emit.stack import te_installed

    if not torch.cuda.is_available():
        raise SystemExit("ranks: no CUDA GPU visible")
    work.mkdir(parents=True, exist_ok=True)
    te = te_installed()
    report = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "transformer_engine": te, "steps": AS_RANK_STEPS, "recipes": {}}
    for job in rank_jobs(recipes, torch.cuda.get_device_properties(0).total_memory, te):
        row = report["recipes"][job.pop("recipe")] = job
        if "command" not in row:
            continue
        folder = work / f"rank_{job['rank']}_{len(report['recipes'])}"
        folder.mkdir(exist_ok=True)
        start = time.monotonic()
        rc = _run(row.pop("command") + ["--out", str(folder)], folder / "run.log", 1800)
        row.update(rc=rc, seconds=round(time.monotonic() - start, 1))
        if (folder / "as_rank.json").exists():
            row["result"] = json.loads((folder / "as_rank.json").read_text())
        elif rc:
            row["log_tail"] = _tail(folder / "run.log")
        out.write_text(json.dumps(report, indent=1))
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("data")
    p.add_argument("folder", type=Path)
    p = sub.add_parser("hf")
    p.add_argument("model")
    p.add_argument("folder", type=Path)
    p = sub.add_parser("logits")
    p.add_argument("model")
    p.add_argument("hf", type=Path)
    p.add_argument("megatron", type=Path)
    p = sub.add_parser("ranks")
    p.add_argument("work", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--recipes", nargs="+", default=None, help="named recipes (default: all)")
    for name in ("config", "all"):
        p = sub.add_parser(name)
        if name == "config":
            p.add_argument("model")
            p.add_argument("yaml", type=Path)
            p.add_argument("--pretrained", type=Path)
            p.add_argument("--drop-mtp", action="store_true")
        else:
            p.add_argument("work", type=Path)
            p.add_argument("out", type=Path)
            p.add_argument("--models", nargs="+", default=list(PROXIES), choices=PROXIES)
        p.add_argument("--steps", type=int, default=20)
        p.add_argument("--seq", type=int, default=4096)
        p.add_argument("--gbs", type=int, default=8)
    args = parser.parse_args(argv)
    if args.command == "data":
        build_data(args.folder)
    elif args.command == "hf":
        write_hf(args.model, args.folder)
    elif args.command == "logits":
        logits(args.model, args.hf, args.megatron)
    elif args.command == "config":
        prediction = proof_config(args.model, args.yaml, args.pretrained, args.steps, args.seq, args.gbs, args.drop_mtp)
        Path(f"{args.yaml}.prediction.json").write_text(json.dumps(prediction, indent=1))
    elif args.command == "ranks":
        from lcmoe_recipes import NAMED_RECIPES

        run_ranks(args.work, args.out, args.recipes or list(NAMED_RECIPES))
    else:
        run_all(args.work, args.out, args.steps, args.seq, args.gbs, args.models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
