"""Run the peer simulator SimuMax v1.2 on the published throughput rows its public system configs can express.

    python scripts/simumax_compare.py --simumax PATH --simumax-python PY   # rewrite tests/simumax_v1_2.json
    python scripts/simumax_compare.py --explain                           # which rows it can express, and why not

SimuMax (MooreThreads/SimuMax, tag v1.2, commit 4dcaae513ba7679d56c116a17cd4a691ec41e252; Apache-2.0) is not a
dependency: it is not on the package registries and its requirements (pandas, matplotlib, streamlit, ...) are not
ours. Run it from its own checkout and environment, e.g.::

    git clone https://github.com/MooreThreads/SimuMax && cd SimuMax && git checkout v1.2
    python -m venv .venv && .venv/bin/pip install -e .
    python scripts/simumax_compare.py --simumax SimuMax --simumax-python SimuMax/.venv/bin/python

This script decides which rows SimuMax can express (:func:`expressible`), writes each one's SimuMax model and strategy
(:func:`simumax_inputs`, from our own catalog's Hugging Face config and the row's plan), runs SimuMax's ``PerfLLM``
in that environment (one subprocess per row, :func:`_run_one`), and stores its step time. ``scripts/accuracy_report.py``
reads the stored file, so the report needs no SimuMax. Both SimuMax and our model are compared at our FLOP count: its
TFLOP/s = our FLOPs per GPU per step over its step time.

Only its public system configs are used, as they ship (``configs/system``: ``a100_pcie.json`` and
``b200_bf16_ceperm.json``); no GPU it has no config for is derived.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "simumax_v1_2.json"
SIMUMAX = {"repository": "MooreThreads/SimuMax", "tag": "v1.2", "commit": "4dcaae513ba7679d56c116a17cd4a691ec41e252"}
SYSTEMS = {"b200": "configs/system/b200_bf16_ceperm.json"}   # its public configs of the GPUs our rows ran on

# Assumptions that hold for every row run (stated in docs/accuracy.md).
COMMON = (
    "SimuMax's public B200 config as shipped: measured on one 8-GPU node; its inter-node network is a 200 GB/s "
    "placeholder with no measured collective efficiencies; its HBM size (80 GB) does not enter the step time",
    "the all-to-all dispatcher (SimuMax v1.2 models no DeepEP / HybridEP), no CUDA graphs, no EP overlap",
    "synchronous pipeline send/receive (pp_comm_async false): v1.2's analysis_cost does not time asynchronous VPP",
    "distributed optimizer (zero_state 1), sequence parallel where TP > 1, SimuMax's defaults elsewhere "
    "(straggler model on, fused kernels, FlashAttention)",
    "step time compared at our FLOP count: SimuMax's TFLOP/s = our FLOPs per GPU per step / its step time",
)


def _hf(model: str) -> dict:
    """The model's config.json values as our catalog ships them (``ModelSpec.config``)."""
    from lcmoe_recipes.catalog import get_model

    return get_model(model).config


def _model_assumptions(model: str) -> tuple[str, ...]:
    if model == "gpt_oss_120b":
        return ("attention sinks and the 128-token sliding windows of alternate layers cannot be expressed: every "
                "layer priced as full causal attention", "attention and expert biases and the clamped SwiGLU priced "
                "as a plain SwiGLU without biases")
    return ()


def expressible(plan) -> str | None:
    """None when SimuMax v1.2 can run ``plan`` with a public system config, else the reason it cannot.

    Rules read from SimuMax v1.2: ``configs/system`` (GPUs), the FP8 entries of ``b200_bf16_ceperm.json`` (efficiency
    0), ``core/config.py`` ``ModelConfig`` (no attention sinks, windows, gated DeltaNet or MTP) and ``perf_llm.py``
    ``get_num_layers_to_build`` (even pipeline split, each stage's layers divisible by the VPP size)."""
    if plan.hardware not in SYSTEMS:
        return f"no public SimuMax system config for {plan.hardware.upper()}"
    if plan.precision != "bf16":
        return "its public B200 config has no FP8 GEMM efficiency (0)"
    if plan.model not in ("qwen3_30b", "qwen3_235b", "gpt_oss_120b"):
        return "model not expressible (DeepSeek-V3: MTP; 61 layers over PP8 with VPP cannot be split by its rules)"
    if plan.layout.cp > 1 or plan.recompute_granularity == "full" or plan.optimizer_cpu_offload:
        return "CP, full recompute or optimizer offload not mapped"
    layers = _hf(plan.model)["num_hidden_layers"]
    vpp = plan.layout.vpp or 1
    pipeline = layers + (2 if plan.layout.pp > 1 else 0)   # embedding and loss as pipeline layers, as megatron does
    if plan.layout.pp > 1 and pipeline % (plan.layout.pp * vpp):
        return f"{layers} layers do not split evenly over PP{plan.layout.pp} x VPP{vpp}"
    return None


def simumax_inputs(plan) -> tuple[dict, dict, tuple[str, ...]]:
    """SimuMax's ``ModelConfig`` and ``StrategyConfig`` fields for ``plan`` (an expressible row), and what had to be
    assumed for its model. Raises ValueError for a row :func:`expressible` refuses."""
    why = expressible(plan)
    if why:
        raise ValueError(f"SimuMax v1.2 cannot express {plan.name}: {why}")
    hf = _hf(plan.model)
    lay = plan.layout
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    model = {"model_type": "moe", "model_name": plan.model, "hidden_size": hf["hidden_size"],
             "head_num": hf["num_attention_heads"], "kv_head_num": hf["num_key_value_heads"],
             "head_size": hf["head_dim"], "intermediate_size": hf["intermediate_size"],
             "moe_ffn_hidden_size": hf.get("moe_intermediate_size", hf["intermediate_size"]),
             "layer_num": hf["num_hidden_layers"], "expert_num": experts, "topk": hf["num_experts_per_tok"],
             "vocab_size": hf["vocab_size"], "use_swiglu": True}
    strategy = {"seq_len": plan.seq_length, "micro_batch_size": plan.micro_batch_size,
                "micro_batch_num": plan.num_microbatches, "dtype": "bf16",
                "world_size": lay.world, "tp_size": lay.tp, "pp_size": lay.pp, "ep_size": lay.ep, "etp_size": lay.etp,
                "interleaving_size": lay.vpp or 1, "pp_comm_async": False, "zero_state": 1,
                "enable_sequence_parallel": lay.tp > 1, "moe_dispatcher_policy": "all2all",
                "account_for_embedding_in_pipeline_split": lay.pp > 1, "account_for_loss_in_pipeline_split": lay.pp > 1,
                "grad_reduce_in_bf16": plan.grad_dtype == "bf16"}
    if plan.recompute_modules:
        strategy.update(enable_recompute=True, recompute_granularity="selective_recompute", megatron_recompute=True,
                        megatron_recompute_modules=list(plan.recompute_modules),
                        recompute_layer_num=model["layer_num"])
    else:
        strategy["enable_recompute"] = False
    return model, strategy, _model_assumptions(plan.model)


_RUNNER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from simumax.core.config import ModelConfig, StrategyConfig, SystemConfig
from simumax.core.perf_llm import PerfLLM
job = json.load(sys.stdin)
perf = PerfLLM()
perf.configure(strategy_config=StrategyConfig.init_from_dict(job["strategy"]),
               model_config=ModelConfig.init_from_dict(job["model"]),
               system_config=SystemConfig.init_from_config_file(job["system"]))
perf.run_estimate()
data = perf.analysis_cost().data
parts = data["breakdown_result"]
print("SIMUMAX_RESULT " + json.dumps({"step_ms": data["duration_time_per_iter"],
                                      "tflops_own_count": data["throughput per GPU (TFLOP/s/GPU)"],
                                      "compute_ms": [parts["fwd_compute_time"], parts["bwd_compute_time"],
                                                     parts["recompute_time"]],
                                      "exposed_comm_ms": [parts["intra_exposed_time"], parts["inter_exposed_time"],
                                                          parts["dp_exposed_time"]]}))
"""


def _milliseconds(text) -> float:
    if isinstance(text, (int, float)):
        return float(text)
    value, unit = str(text).split()
    return float(value) * {"ms": 1.0, "s": 1e3, "us": 1e-3}[unit]


def _run_one(python: str, checkout: Path, plan) -> dict:
    model, strategy, _ = simumax_inputs(plan)
    job = {"model": model, "strategy": strategy, "system": str(checkout / SYSTEMS[plan.hardware])}
    done = subprocess.run([python, "-c", _RUNNER, str(checkout)], input=json.dumps(job), capture_output=True,
                          text=True, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("SIMUMAX_RESULT ")), None)
    if done.returncode or line is None:
        raise RuntimeError(f"SimuMax failed on {plan.name}:\n{done.stderr[-2000:]}")
    out = json.loads(line.split(" ", 1)[1])
    return {"step_seconds": round(_milliseconds(out["step_ms"]) / 1e3, 4),
            "compute_seconds": round(sum(map(_milliseconds, out["compute_ms"])) / 1e3, 3),
            "exposed_comm_seconds": round(sum(map(_milliseconds, out["exposed_comm_ms"])) / 1e3, 3),
            "tflops_own_count": round(out["tflops_own_count"], 1)}


def _rows():
    sys.path.insert(0, str(ROOT / "tests"))
    from published import THROUGHPUT_ROWS

    return THROUGHPUT_ROWS


def build(python: str, checkout: Path) -> dict:
    rows = _rows()
    ran, refused = {}, {}
    for key, row in rows.items():
        why = expressible(row.plan)
        if why:
            refused[key] = why
            continue
        ran[key] = {**_run_one(python, checkout, row.plan), "assumed": list(_model_assumptions(row.plan.model))}
    return {"simumax": SIMUMAX, "systems": SYSTEMS, "assumed": list(COMMON), "rows": ran, "not_expressible": refused}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simumax", type=Path, help="a SimuMax v1.2 checkout")
    parser.add_argument("--simumax-python", default=None, help="the python of SimuMax's environment")
    parser.add_argument("--explain", action="store_true", help="list which rows SimuMax can express; run nothing")
    args = parser.parse_args(argv)
    if args.explain:
        for key, row in _rows().items():
            print(f"{key}: {expressible(row.plan) or 'expressible'}")
        return 0
    if not args.simumax or not (args.simumax / "simumax" / "core" / "perf_llm.py").exists():
        parser.error("--simumax must name a SimuMax v1.2 checkout (it has simumax/core/perf_llm.py)")
    result = build(args.simumax_python or sys.executable, args.simumax.resolve())
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(result['rows'])} rows run, {len(result['not_expressible'])} not "
          "expressible")
    return 0


if __name__ == "__main__":
    sys.exit(main())
