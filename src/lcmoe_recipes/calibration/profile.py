"""A calibration profile: the step model's and memory model's constants fitted to one cluster's own runs, with the
runs they came from -- a YAML file the cost models read in place of the published fit.

    kind: lcmoe_recipes/calibration-profile
    version: 1
    hardware: h100
    precision: fp8_blockwise
    created: '2026-12-02'
    step_constants:            # GPU x kind -> value fitted on the runs (cost/efficiency.py's kinds)
    - {gpu: h100, kind: fp8_blockwise, value: 0.31, published: 0.308, spread: [0.3, 0.32]}
    memory:                    # the memory model's fitted overhead, refitted on the runs' peaks (or null)
      overhead_bytes: 4.1e9
      published_overhead_bytes: 3.8e9
      spread: [4.0e9, 4.2e9]
    runs:                      # every run the constants came from (log, its sha256, the config, what was measured)
    - {log: ..., log_sha256: ..., config: ..., ...}

:meth:`CalibrationProfile.step_table` is what :func:`lcmoe_recipes.cost.estimate_step` takes as ``efficiencies``;
:meth:`CalibrationProfile.memory_constants` what :func:`lcmoe_recipes.cost.estimate_memory` takes as ``constants``.
A profile only speaks for its GPU: the step constants of other GPUs stay the published ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..cost.efficiency import FITTED, GPUS, KINDS
from ..cost.memory import CALIBRATED, MemoryConstants
from .logs import CalibrationError

KIND, VERSION = "lcmoe_recipes/calibration-profile", 1


@dataclass(frozen=True)
class CalibrationProfile:
    """The constants fitted to a cluster's runs (module doc)."""

    hardware: str
    precision: str
    created: str
    step_constants: dict[tuple[str, str], float]
    step_spread: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    memory_overhead_bytes: float | None = None
    memory_spread: tuple[float, float] | None = None
    runs: tuple[dict[str, Any], ...] = ()
    path: str = ""

    def step_table(self) -> dict[tuple[str, str], float]:
        """The published fit with this profile's constants in place of the published ones."""
        return {**FITTED, **self.step_constants}

    def memory_constants(self) -> MemoryConstants:
        """The published memory constants with this profile's overhead (if it measured memory)."""
        if self.memory_overhead_bytes is None:
            return CALIBRATED
        return MemoryConstants(self.memory_overhead_bytes, CALIBRATED.activation_scale)

    def predictions(self, plan) -> dict[str, float]:
        """The plan's predicted step (s), TFLOP/s per GPU and HBM use (GiB) with the published constants and with this
        profile's, side by side (what ``plan`` / ``check`` / ``launch --calibration FILE`` show)."""
        from ..cost import estimate_memory, estimate_step

        published, mine = estimate_step(plan), estimate_step(plan, self.step_table())
        return {"step_s_published": published.step_seconds, "step_s_calibrated": mine.step_seconds,
                "tflops_published": published.tflops_per_gpu, "tflops_calibrated": mine.tflops_per_gpu,
                "hbm_gib_published": estimate_memory(plan).hbm_total / 2**30,
                "hbm_gib_calibrated": estimate_memory(plan, self.memory_constants()).hbm_total / 2**30}

    def to_dict(self) -> dict[str, Any]:
        memory = None if self.memory_overhead_bytes is None else {
            "overhead_bytes": self.memory_overhead_bytes, "published_overhead_bytes": CALIBRATED.overhead_bytes,
            "spread": list(self.memory_spread or (self.memory_overhead_bytes,) * 2)}
        return {"kind": KIND, "version": VERSION, "hardware": self.hardware, "precision": self.precision,
                "created": self.created,
                "step_constants": [{"gpu": g, "kind": k, "value": v, "published": FITTED.get((g, k)),
                                    "spread": list(self.step_spread.get((g, k), (v, v)))}
                                   for (g, k), v in self.step_constants.items()],
                "memory": memory, "runs": list(self.runs)}


def write_profile(profile: CalibrationProfile, path: str | Path) -> Path:
    """Write ``profile`` as YAML at ``path`` (folders created)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(profile.to_dict(), sort_keys=False), encoding="utf-8")
    return p


def read_profile(path: str | Path) -> CalibrationProfile:
    """Read a profile written by :func:`write_profile`.

    Raises:
        CalibrationError: missing or unreadable file, not YAML, not a profile (``kind``), another version, or a
            constant outside the step model's GPUs and kinds -- naming the file and the fix.
    """
    fix = "give a profile written by python -m lcmoe_recipes.calibrate LOG... --config X.yaml"
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CalibrationError(f"cannot read calibration profile '{path}': {exc.strerror or exc}", fix) from None
    except yaml.YAMLError as exc:
        raise CalibrationError(f"calibration profile '{path}' is not YAML: {str(exc).splitlines()[0]}", fix) from None
    if not isinstance(raw, dict) or raw.get("kind") != KIND:
        raise CalibrationError(f"'{path}' is not a calibration profile (no 'kind: {KIND}')", fix)
    if raw.get("version") != VERSION:
        raise CalibrationError(f"calibration profile '{path}' has version {raw.get('version')!r}; this lcmoe_recipes "
                               f"reads version {VERSION}", "rerun python -m lcmoe_recipes.calibrate on the runs' logs")
    constants, spread = {}, {}
    for entry in raw.get("step_constants") or []:
        key = (entry.get("gpu"), entry.get("kind"))
        if key[0] not in GPUS or key[1] not in KINDS or not isinstance(entry.get("value"), (int, float)) \
                or entry["value"] <= 0:
            raise CalibrationError(f"calibration profile '{path}': step constant {entry!r} is not a positive value "
                                   f"for a GPU in {', '.join(GPUS)} and a kind in {', '.join(KINDS)}", fix)
        constants[key] = float(entry["value"])
        spread[key] = tuple(float(v) for v in entry.get("spread") or (entry["value"],) * 2)
    memory = raw.get("memory") or {}
    return CalibrationProfile(str(raw.get("hardware")), str(raw.get("precision")), str(raw.get("created")),
                              constants, spread, memory.get("overhead_bytes"),
                              tuple(memory["spread"]) if memory.get("spread") else None,
                              tuple(raw.get("runs") or ()), str(path))
