#!/usr/bin/env bash
# One-command GPU proof (docs/gpu_proof.md): the three one-GPU proxies converted from Hugging Face checkpoints and
# trained through python -m lcmoe_recipes.train; loss, peak memory and step time beside our prediction, as JSON
# (--out); then the most loaded rank of each named recipe at its full world size alone on this GPU
# (python -m lcmoe_recipes.train --as-rank, docs/build.md): peak memory beside our prediction (--ranks-out); last,
# the attention and GEMM kernels beside what the step model reads (scripts/kernel_bench.py, --kernels-out).
#
#   bash scripts/gpu_proof.sh [--bundle DIR] [--out FILE] [--ranks-out FILE] [--kernels-out FILE] [--work DIR]
#                             [gpu_proof.py all options]
#
# --bundle DIR: wheels built by scripts/build_device_bundle.sh, installed into a private folder first (for a GPU
# machine with PyTorch but without megatron-core / megatron-bridge and no package registry).
set -euo pipefail
cd "$(dirname "$0")/.."
bundle="" out="gpu_proof.json" ranks_out="gpu_proof_ranks.json" kernels_out="gpu_proof_kernels.json"
work="${TMPDIR:-/tmp}/lcmoe_gpu_proof"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --ranks-out) ranks_out="$2"; shift 2 ;;
    --kernels-out) kernels_out="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
python=${PYTHON:-python3}
if [ -n "$bundle" ]; then
  site="$work/site"
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$bundle"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
"$python" -c 'import torch; assert torch.cuda.is_available(), "no CUDA GPU visible"; print("gpu:", torch.cuda.get_device_name(0), "torch", torch.__version__)'
status=0
"$python" scripts/gpu_proof.py all "$work" "$out" "${args[@]}" || status=$?
"$python" scripts/gpu_proof.py ranks "$work" "$ranks_out" || status=$?
"$python" scripts/kernel_bench.py --out "$kernels_out" > "$work/kernels.log" || status=$?
exit $status
