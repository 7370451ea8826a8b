#!/usr/bin/env bash
# Wheels for a GPU machine that has Python 3.12 + PyTorch (CUDA 13) but no package registry (docs/gpu_proof.md):
# everything in requirements/device.txt, --no-deps, for CPython 3.12 on manylinux x86_64, into a git-ignored folder.
# A package published only as a source archive (pure Python) is built into a wheel here.
#
#   bash scripts/build_device_bundle.sh [DIR]      (default: .device_bundle)
#
# Fails when the bundle plus the repository's tracked files exceed 64 MiB: the machine takes at most 64 MiB of files
# per call, the working tree included (a call that carries anything else must fit it in what is left; the run prints
# the sum).
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.device_bundle}"
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
rm -rf "$dest" && mkdir -p "$dest"
platforms=()
for tag in manylinux_2_39_x86_64 manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 \
           manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
           manylinux2014_x86_64 manylinux1_x86_64 any; do
  platforms+=(--platform "$tag")
done
grep -Ev '^\s*(#|$)' requirements/device.txt | sed 's/\s*#.*//' | while read -r req; do
  if ! "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --abi cp312 --abi abi3 --abi none "${platforms[@]}" -d "$dest" "$req" 2>/dev/null; then
    echo "building $req from its source archive (pure Python)"
    "$python" -m pip wheel -q --no-deps --no-build-isolation -w "$dest" "$req"
  fi
done
bytes=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
count=$(ls "$dest"/*.whl | wc -l)
echo "bundle: $count wheels, $((bytes / 1048576)) MiB in $dest"
ls -1 "$dest" > "$dest/MANIFEST.txt"
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
echo "bundle + tracked files: $(((bytes + tree) / 1024)) KiB of the 65536 KiB the GPU machine takes per call"
if [ $((bytes + tree)) -gt $((64 * 1048576)) ]; then
  echo "error: bundle + working tree = $(((bytes + tree) / 1048576)) MiB; the GPU machine takes at most 64 MiB per call" >&2
  exit 1
fi
