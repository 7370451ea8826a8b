"""Kernel throughput on this GPU beside what the step model reads for it (docs/accuracy.md, "Measured on a GPU").

Two sets, each timed with CUDA events (median of ``--repeats`` runs after ``--warmup``), in BF16:

* **attention**: PyTorch's ``scaled_dot_product_attention`` with its cuDNN backend (``SDPBackend.CUDNN_ATTENTION``,
  the cuDNN fused-attention kernels Transformer Engine's FusedAttention also calls) and, beside it, its flash
  backend (FlashAttention-2), forward and backward, with and without the causal mask, at the FlashAttention-3
  paper's benchmark shapes (batch x seq = 16K tokens, hidden 2048, head dims 64/128/256; arXiv 2407.08608, Figures 5
  and 6), plus longer causal sequences (32K-128K, head dim 128, one sequence) that the published table does not
  reach. FLOPs as that benchmark counts them (:func:`attention_flops`). Beside each: the published TFLOP/s the step
  model reads for this GPU (:func:`lcmoe_recipes.catalog.kernels.attention_tflops`, before the fitted per-GPU scale).
* **gemm**: ``torch.matmul`` (cuBLAS) at the routed-expert GEMM shapes of our MoE models -- tokens per expert x hidden
  x expert width, forward (fc1: h -> 2f gated, fc2: f -> h) -- and gpt-oss's 2,880 beside the next multiples of 128
  (wave and tile quantization), timed one launch at a time and back to back, and in FP8 with tensorwise, rowwise
  and blockwise scales where this PyTorch runs them (:func:`fp8_gemm`). Beside each: its share of the GPU's dense
  BF16 peak (:attr:`lcmoe_recipes.catalog.Hardware.peak_tflops`) and the fitted end-to-end GEMM efficiency the step
  model reads (:func:`lcmoe_recipes.cost.efficiency.constant`, which also absorbs the kernels it does not list).
* **grouped_gemm**: the same GEMMs for 4 and 16 local experts in one grouped launch (``torch._grouped_mm``), beside
  the experts' GEMMs launched one after another (:func:`run_grouped`).

    python scripts/kernel_bench.py --out kernels.json [--gpu h200] [--quick]
    python scripts/kernel_bench.py --list          # the shapes and the model's numbers, no GPU needed

Needs PyTorch with CUDA; nothing else beyond this repository's ``src``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from lcmoe_recipes.catalog import get_hardware, get_model  # noqa: E402
from lcmoe_recipes.catalog.kernels import attention_tflops  # noqa: E402
from lcmoe_recipes.cost.efficiency import constant  # noqa: E402

TOKENS = 16384   # batch x seq of the published benchmark
HIDDEN = 2048    # heads x head_dim of the published benchmark
TABLE_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
LONG_SEQ = (32768, 65536, 131072)
GEMM_MODELS = ("deepseek_v3", "qwen3_235b", "qwen3_30b", "gpt_oss_120b")
TOKENS_PER_EXPERT = (512, 2048, 8192)


def attention_flops(seq_q: int, seq_k: int, heads: int, head_dim: int, batch: int, causal: bool,
                    backward: bool) -> float:
    """FLOPs of one attention call as the FlashAttention-3 benchmark counts them: forward 4·seq_q·seq_k·head_dim·heads
    per sequence (halved under a causal mask), backward 2.5 x forward."""
    flops = 4.0 * seq_q * seq_k * head_dim * heads * batch * (0.5 if causal else 1.0)
    return flops * (2.5 if backward else 1.0)


def attention_cases(quick: bool = False) -> list[dict]:
    """The attention shapes, each with the published TFLOP/s the step model reads (``modelled_tflops``, per GPU key
    filled in by :func:`with_model`)."""
    cases = []
    dims = (128,) if quick else (64, 128, 256)
    seqs = (4096, 16384) if quick else TABLE_SEQ
    for head_dim in dims:
        for seq in seqs:
            for causal in (False, True):
                for backward in (False, True):
                    if backward and head_dim == 256:
                        continue  # the paper's backward figure has head dims 64 and 128 only
                    cases.append({"head_dim": head_dim, "seq": seq, "batch": TOKENS // seq, "heads": HIDDEN // head_dim,
                                  "causal": causal, "backward": backward})
    for seq in (LONG_SEQ[:1] if quick else LONG_SEQ):
        for backward in (False, True):
            cases.append({"head_dim": 128, "seq": seq, "batch": 1, "heads": HIDDEN // 128, "causal": True,
                          "backward": backward})
    return cases


def gemm_cases(quick: bool = False) -> list[dict]:
    """Routed-expert GEMMs (m = tokens per expert, k, n) of :data:`GEMM_MODELS`, forward fc1 (h -> 2f, gated) and fc2
    (f -> h); gpt-oss's f = h = 2,880 also at 2,944 and 3,072 (the next multiples of 128 and 512)."""
    cases = []
    for name in (GEMM_MODELS[:1] + GEMM_MODELS[-1:] if quick else GEMM_MODELS):
        spec = get_model(name)
        h, f = spec.hidden_size, spec.moe_ffn_hidden_size
        widths = [(h, f)] + ([(w, w) for w in (2944, 3072)] if name == "gpt_oss_120b" else [])
        for hh, ff in widths:
            for m in (TOKENS_PER_EXPERT[1:2] if quick else TOKENS_PER_EXPERT):
                cases.append({"model": name, "gemm": "fc1", "m": m, "k": hh, "n": 2 * ff})
                cases.append({"model": name, "gemm": "fc2", "m": m, "k": ff, "n": hh})
    return cases


def with_model(cases: list[dict], gemms: list[dict], gpu: str) -> None:
    """Add the step model's numbers for GPU ``gpu`` to each case, in place."""
    for c in cases:
        length = c["seq"]  # queries = keys: the loop length either way
        c["modelled_tflops"] = attention_tflops(gpu, c["backward"], c["causal"], c["head_dim"], length)
    peak = get_hardware(gpu).peak_tflops["bf16"]
    eff = constant(gpu, "bf16")
    for g in gemms:
        g["peak_tflops"] = peak
        g["fitted_end_to_end_efficiency"] = eff.value


def _time(fn, warmup: int, repeats: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def run_attention(cases: list[dict], warmup: int, repeats: int) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    for c in cases:
        shape = (c["batch"], c["heads"], c["seq"], c["head_dim"])
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        flops = attention_flops(c["seq"], c["seq"], c["heads"], c["head_dim"], c["batch"], c["causal"], c["backward"])
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash2", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel([backend]):
                    if c["backward"]:
                        out = sdpa(q, k, v, is_causal=c["causal"])
                        grad = torch.randn_like(out)
                        seconds = _time(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True),
                                        warmup, repeats)
                    else:
                        with torch.no_grad():
                            seconds = _time(lambda: sdpa(q, k, v, is_causal=c["causal"]), warmup, repeats)
                c[f"{name}_tflops"] = flops / seconds / 1e12
            except RuntimeError as err:  # a backend that does not take this shape
                c[f"{name}_error"] = str(err).splitlines()[0][:200]
        del q, k, v
        torch.cuda.empty_cache()
        print(json.dumps(c), flush=True)


def run_gemm(cases: list[dict], warmup: int, repeats: int) -> None:
    """Each case's BF16 ``a @ b``: ``tflops`` timed one launch between CUDA events (the first run's way, which
    counts a launch's start-up: the figures in tests/measured_h200.json), ``tflops_back_to_back`` over
    :data:`INNER` launches queued back to back (as a training step's stream runs them), and each FP8 scaling of
    :func:`fp8_gemm` that this PyTorch runs (``fp8_<scaling>_tflops``, or ``fp8_<scaling>_error``)."""
    import torch

    for g in cases:
        a = torch.randn(g["m"], g["k"], device="cuda", dtype=torch.bfloat16)
        b = torch.randn(g["k"], g["n"], device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * g["m"] * g["k"] * g["n"]
        g["tflops"] = flops / _time(lambda: a @ b, warmup, repeats) / 1e12
        g["tflops_back_to_back"] = flops / _time(_queued(lambda: a @ b), warmup, repeats) * INNER / 1e12
        g["share_of_peak"] = g["tflops"] / g["peak_tflops"]
        for scaling in FP8_SCALINGS:
            try:
                fn = fp8_gemm(a, b, scaling)
                g[f"fp8_{scaling}_tflops"] = flops / _time(_queued(fn), warmup, repeats) * INNER / 1e12
            except (RuntimeError, AttributeError, TypeError, ValueError, NotImplementedError) as err:
                g[f"fp8_{scaling}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        del a, b
        print(json.dumps(g), flush=True)


INNER = 20  # launches queued between two CUDA events (back-to-back timing)
FP8_SCALINGS = ("tensorwise", "rowwise", "blockwise")  # Megatron's fp8 "tensorwise" (current scaling) and
# "blockwise" (1x128 activations, 128x128 weights: DeepSeek-V3's recipe); rowwise for reference


def _queued(fn):
    """``fn`` run :data:`INNER` times in a row (time it with :func:`_time`, then divide by INNER)."""
    def run():
        for _ in range(INNER):
            fn()
    return run


def fp8_gemm(a, b, scaling: str):
    """A callable computing ``a @ b`` in FP8 (e4m3) with unit scales of the given granularity, through PyTorch's
    scaled matmul (``torch._scaled_mm``; blockwise through ``torch.nn.functional.scaled_mm`` where this PyTorch has
    it). Raises what PyTorch raises where this GPU or version lacks the scaling."""
    import torch

    m, k = a.shape
    n = b.shape[1]
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major, as the FP8 kernels take it
    one = dict(device=a.device, dtype=torch.float32)
    if scaling == "tensorwise":
        sa, sb = torch.ones((), **one), torch.ones((), **one)
    elif scaling == "rowwise":
        sa, sb = torch.ones(m, 1, **one), torch.ones(1, n, **one)
    else:
        from torch.nn.functional import ScalingType, scaled_mm

        sa = torch.ones(k // 128, m, **one).t()  # one scale per 1x128 block of a row, outer-dim major
        sb = torch.ones(k // 128, (n + 127) // 128, **one)  # one per 128x128 block
        fn = lambda: scaled_mm(a8, b8, sa, ScalingType.BlockWise1x128, sb, ScalingType.BlockWise128x128,  # noqa
                               output_dtype=torch.bfloat16)
        fn()
        return fn
    fn = lambda: torch._scaled_mm(a8, b8, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)  # noqa: E731
    fn()
    return fn


GROUPED_LOCAL_EXPERTS = (4, 16)  # experts per EP rank: DeepSeek-V3 256 / EP64, Qwen3-30B-A3B 128 / EP8


def grouped_cases(quick: bool = False) -> list[dict]:
    """Routed-expert GEMMs as Transformer Engine's grouped GEMM runs them: every local expert of a rank in one launch
    (``experts`` x (m tokens each) x k x n), forward fc1 and fc2, for the models and token counts of
    :func:`gemm_cases`."""
    out = []
    for g in gemm_cases(quick):
        if g["model"] == "gpt_oss_120b" and g["k"] not in (2880, 5760) and g["n"] not in (2880, 5760):
            continue  # the padded widths are for the one-GEMM comparison only
        for experts in GROUPED_LOCAL_EXPERTS:
            out.append({**{k: g[k] for k in ("model", "gemm", "m", "k", "n")}, "experts": experts})
    return out


def run_grouped(cases: list[dict], warmup: int, repeats: int) -> None:
    """Each case through PyTorch's grouped GEMM (``torch._grouped_mm``: one CUTLASS launch over all experts, BF16),
    back to back, beside the same experts' GEMMs as separate ``a @ b`` launches in a row (``sequential_tflops``)."""
    import torch

    for g in cases:
        e, m, k, n = g["experts"], g["m"], g["k"], g["n"]
        a = torch.randn(e * m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)  # (e, k, n), column-major
        offs = torch.arange(m, e * m + 1, m, device="cuda", dtype=torch.int32)
        flops = 2.0 * e * m * k * n
        try:
            grouped = getattr(torch, "_grouped_mm", None) or torch.nn.functional.grouped_mm
            g["grouped_tflops"] = flops / _time(_queued(lambda: grouped(a, w, offs=offs)), warmup, repeats) \
                * INNER / 1e12
        except (RuntimeError, AttributeError, TypeError) as err:
            g["grouped_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        parts = [(a[i * m:(i + 1) * m], w[i]) for i in range(e)]
        g["sequential_tflops"] = flops / _time(_queued(lambda: [x @ y for x, y in parts]), warmup, repeats) \
            * INNER / 1e12
        del a, w
        print(json.dumps(g), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    parser.add_argument("--gpu", default="h200",
                        help="catalogue GPU whose modelled numbers stand beside (default h200)")
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument("--list", action="store_true", help="print the shapes and the model's numbers; no GPU")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    attention, gemms, grouped = attention_cases(args.quick), gemm_cases(args.quick), grouped_cases(args.quick)
    with_model(attention, gemms, args.gpu)
    report = {"gpu_key": args.gpu, "attention": attention, "gemm": gemms, "grouped_gemm": grouped}
    if not args.list:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("kernel_bench: no CUDA GPU visible (--list prints the shapes without one)")
        start = time.monotonic()
        report.update(date=time.strftime("%Y-%m-%d"), device=torch.cuda.get_device_name(0), torch=torch.__version__,
                      cudnn=torch.backends.cudnn.version(), cuda=torch.version.cuda)
        run_gemm(gemms, args.warmup, args.repeats)
        run_grouped(grouped, args.warmup, args.repeats)
        run_attention(attention, args.warmup, args.repeats)
        report["seconds"] = round(time.monotonic() - start, 1)
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text)
    if args.list or not args.out:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
