#!/usr/bin/env bash
# Set up the lcmoe_recipes environment in a virtual environment (default: .venv at the repository root).
#
#   scripts/setup.sh             light environment: megatron-core 0.19.2 + megatron-bridge 0.6.2, no Transformer Engine
#   scripts/setup.sh --with-te   full environment: also builds Transformer Engine 2.20.2 from source (~25 min on 2 cores)
#   scripts/setup.sh --venv DIR  use another folder for the virtual environment
#   scripts/setup.sh --relock    rewrite requirements/lock.txt from what got installed
#
# Needs Python 3.12 (megatron-bridge 0.6.2 requires >=3.12,<3.13): `python3.12` on PATH, or a 3.12.x known to pyenv.
# Idempotent: a second run checks the installed versions and returns in seconds. See docs/install.md.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
with_te=0
relock=0
while [ $# -gt 0 ]; do
  case "$1" in
    --with-te) with_te=1 ;;
    --venv) venv="$(realpath -m "$2")"; shift ;;
    --relock) relock=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$1' (use --with-te, --venv DIR, --relock, --help)" >&2; exit 2 ;;
  esac
  shift
done

is_python312() {  # runs, and is 3.12 (a pyenv shim can exist without working)
  [ -n "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1
}

find_python312() {
  local cand v
  cand="$(command -v python3.12 2>/dev/null || true)"
  if is_python312 "$cand"; then echo "$cand"; return 0; fi
  if command -v pyenv >/dev/null 2>&1; then
    v="$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$' | sort -V | tail -n 1 || true)"
    cand="$( [ -n "$v" ] && pyenv prefix "$v" 2>/dev/null)/bin/python"
    if is_python312 "$cand"; then echo "$cand"; return 0; fi
  fi
  return 1
}

start=$(date +%s)
if [ ! -x "$venv/bin/python" ]; then
  if ! py="$(find_python312)"; then
    cat >&2 <<'EOF'
setup.sh: no Python 3.12 found. megatron-bridge 0.6.2 needs Python >=3.12,<3.13.
Install one and run this script again, for example:
  pyenv install 3.12      (then this script finds it through pyenv)
  apt-get install python3.12 python3.12-venv    (where your distribution has it)
  conda create -n py312 python=3.12 && conda activate py312
EOF
    exit 1
  fi
  echo "setup.sh: creating $venv with $py ($("$py" --version))"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
pipq() {  # pip, minus the "Location ... is ignored" lines some machines' pip config prints per package
  set +e
  "${pip[@]}" "$@" 2>&1 | grep -v -e "is ignored: it is neither a file nor a directory"
  local rc=${PIPESTATUS[0]}
  set -e
  return "$rc"
}

if [ "$relock" = 1 ]; then  # resolve requirements/light.txt afresh; the freeze below becomes the new lock
  pipq install -r "$root/requirements/light.txt"
else
  pipq install -c "$root/requirements/lock.txt" -r "$root/requirements/light.txt"
fi
# megatron-core / megatron-bridge without their declared dependencies: see requirements/light.txt for why.
pipq install --no-deps -r "$root/requirements/megatron.txt"
pipq install --no-deps --no-build-isolation -e "$root" >/dev/null 2>&1 || pipq install --no-deps -e "$root"

if [ "$with_te" = 1 ] && ! "$venv/bin/python" -c 'import torch, transformer_engine.pytorch' >/dev/null 2>&1; then
  echo "setup.sh: building Transformer Engine (transformer-engine-torch 2.20.2 from source; ~25 min on 2 cores)"
  pipq install -c "$root/requirements/lock.txt" -r "$root/requirements/te.txt"
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # The system CUDA folder lacks nccl.h / cusparse.h; torch's nvidia-* wheels carry the headers.
  # The cu13 wheel's headers lack crt/*.h: take those from a CUDA toolkit when there is one.
  cuda_inc="${CUDA_HOME:-/usr/local/cuda}/include"
  export CPLUS_INCLUDE_PATH="$site/nvidia/nccl/include:$site/nvidia/cudnn/include:$site/nvidia/cu13/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
  [ -d "$cuda_inc/crt" ] && export CPLUS_INCLUDE_PATH="$CPLUS_INCLUDE_PATH:$cuda_inc"
  NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
    pipq install --no-build-isolation --no-deps transformer-engine-torch==2.20.2
  "$venv/bin/python" -c 'import torch, transformer_engine.pytorch; print("setup.sh: Transformer Engine", transformer_engine.__version__)'
fi

if [ "$relock" = 1 ]; then
  { echo "# Pinned versions of the light environment (pip freeze of a fresh scripts/setup.sh run, $(date +%F))."
    echo "# Regenerate: scripts/setup.sh --relock"
    "${pip[@]}" freeze --exclude-editable | grep -v -i -E '^(megatron-core|megatron-bridge|transformer.engine|lcmoe)'; } > "$root/requirements/lock.txt"
fi

echo "setup.sh: ready in $(( $(date +%s) - start )) s: $venv ($(du -sh "$venv" | cut -f1))"
