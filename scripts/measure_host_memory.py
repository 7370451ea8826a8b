"""Measure the host-memory numbers src/lcmoe_recipes/cost/host.py cites (no GPU needed):

1. megatron-core's attention-mask build: peak RSS growth per element of the s x s mask while
   ``_get_ltor_masks_and_position_ids(..., create_attention_mask=True)`` runs, and what stays held afterwards;
2. a rank's own process: unique memory (USS) after importing torch and megatron-bridge's training modules;
3. a data-loader worker forked from it: its USS (it shares the rank's pages until it writes to them).

    python scripts/measure_host_memory.py [--seq 8192]

Each measurement runs in a fresh interpreter, so one does not inherit another's memory.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

MASK = """
import gc, sys, torch
from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids
s = int(sys.argv[1])
data = torch.zeros(s, dtype=torch.long)
gc.collect()
def status(field):  # bytes
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak RSS (VmHWM) to the current RSS (Linux proc(5))
before = status("VmRSS")
mask, loss_mask, position_ids = _get_ltor_masks_and_position_ids(data, 0, False, False, False, True)
peak, held = status("VmHWM"), status("VmRSS")
print(f"mask {tuple(mask.shape)} {mask.dtype}, loss_mask {loss_mask.dtype}, position_ids {position_ids.dtype}")
print(f"build peak {(peak - before) / s**2:.2f} bytes per element; held after {(held - before) / s**2:.2f}")
"""


PROCESS = """
import warnings
warnings.filterwarnings("ignore")
import psutil, torch
from lcmoe_recipes.emit.stack import load_bridge
load_bridge(quiet=True)
from megatron.bridge.training.config import ConfigContainer  # noqa: F401
from megatron.bridge.training.gpt_step import forward_step  # noqa: F401
from torch.utils.data import DataLoader, Dataset
me = psutil.Process()
print(f"rank process after imports: USS {me.memory_full_info().uss / 2**30:.2f} GiB")

class Probe(Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        return torch.tensor(psutil.Process().memory_full_info().uss)

uss = max(int(b) for b in DataLoader(Probe(), batch_size=1, num_workers=1))
print(f"forked data-loader worker: USS {uss / 2**30:.2f} GiB")
"""


def run(code: str, *args: str) -> str:
    """Run ``code`` in a fresh interpreter; its stdout (RuntimeError with its stderr if it fails)."""
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr.strip()[-2000:] or f"exit {done.returncode}")
    return done.stdout


def measure_mask(seq: int) -> tuple[float, float]:
    """(peak RSS growth, RSS held afterwards) per element of the seq x seq mask megatron-core builds, in bytes."""
    line = run(MASK, str(seq)).splitlines()[-1].split()
    return float(line[2]), float(line[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192, help="mask side s (default 8192: 512 MiB of float32 at peak)")
    args = parser.parse_args()
    try:
        print(run(MASK, str(args.seq)) + run(PROCESS), end="")
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
