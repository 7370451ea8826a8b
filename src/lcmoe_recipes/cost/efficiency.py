"""The step model's fitted constants, per GPU and precision, and where each one comes from.

Three kinds, each one number per GPU (and precision for GEMMs):

* ``(gpu, precision)`` -- the fraction of the GPU's dense peak at that precision its GEMMs reach in training (bf16,
  fp8_blockwise, fp8_cs, mxfp8): kernel efficiency, grouped-GEMM imbalance over small experts, the GEMMs' own
  operand traffic, the memory-bound kernels beyond those :mod:`lcmoe_recipes.cost.elementwise` prices (norms,
  residual adds, router scores, permutation, SwiGLU, the CP ring's merges and FP8 casts are priced there), and
  unmodelled overlap losses;
* ``(gpu, "attention")`` -- the scale on the published attention-kernel throughput (:mod:`lcmoe_recipes.cost.
  attention`): what the framework loses around the kernel (TE's wrappers, the ring's bookkeeping; the CP ring's
  merges are priced apart); 1 would mean the kernel runs as fast as in its benchmark;
* ``(gpu, "gdn_step")`` -- seconds per sequential 64-token chunk of the gated-DeltaNet scan.

:data:`FITTED` holds the constants fitted to published rows (``python scripts/calibrate_step.py``, the fit subset of
``tests/published.py``); :data:`BORROWED` says, for every other GPU x kind, which fitted constant stands in for it and
why -- nothing is copied silently: :func:`constant` returns the borrowed value with the note, ``--explain`` shows it,
and the error band of a plan that reads a borrowed constant widens (:func:`lcmoe_recipes.cost.bands.step_band_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

GPUS = ("h100", "h200", "b200", "gb200", "gb300")
GEMM_PRECISIONS = ("bf16", "fp8_blockwise", "fp8_cs", "mxfp8")
KINDS = GEMM_PRECISIONS + ("attention", "gdn_step")

# Fitted 2026-12-04 by `python scripts/calibrate_step.py` on the fit subset of tests/published.py (least squares in
# log(predicted / published), each published value at our FLOP count: Row.comparable); the leave-one-out spread
# of each is in docs/accuracy.md.
FITTED: dict[tuple[str, str], float] = {
    ('b200', 'bf16'): 0.403,
    ('b200', 'mxfp8'): 0.171,
    ('gb200', 'attention'): 1.28,
    ('gb200', 'bf16'): 0.348,
    ('gb200', 'gdn_step'): 1.51e-05,
    ('gb200', 'mxfp8'): 0.307,
    ('gb300', 'bf16'): 0.484,
    ('gb300', 'mxfp8'): 0.417,
    ('h100', 'attention'): 0.86,
    ('h100', 'bf16'): 0.339,
    ('h100', 'fp8_blockwise'): 0.275,
    ('h100', 'fp8_cs'): 0.15,
}

_SAME_HOPPER = "H200 has H100's GH100 tensor cores and clocks (datasheets); only its HBM differs"
_SAME_KERNEL = "the same SM100 cuDNN attention kernel; the Blackwell GPUs differ in clocks, not in the kernel"
_OTHER_FP8 = ("no fitted row at this precision on this GPU: another FP8 recipe's efficiency (a fraction of the same "
              "FP8 tensor-core peak, another scaling granularity) stands in")
_FP8_FOR_BF16 = ("no fitted BF16 row on this GPU: its FP8 efficiency (a fraction of the FP8 peak, twice the BF16 "
                 "one) stands in")
_OTHER_BLACKWELL = "no fitted row on this GPU at this precision: the same Blackwell tensor cores on GB200 stand in"
_GDN = "no published gated-DeltaNet row on this GPU: GB200's scan time per chunk stands in"
_NOT_RUNNABLE = "not a recipe this GPU runs (MXFP8 is a Blackwell, SM 10.x, format)"
# Transformer Engine runs Float8BlockScaling on SM 9.0 and later (its docs' FP8 blockwise-scaling example requires
# SM90+), so Blackwell runs it; no published row measures it there, and MXFP8 (the native 1x32 block scaling) stands in
_BLOCKWISE_ON_BLACKWELL = ("no published blockwise-FP8 row on Blackwell (Transformer Engine runs it on SM 9.0 and "
                           "later): MXFP8, Blackwell's native block scaling, stands in")
_HOPPER_ATTENTION = "no fitted long-context row on Blackwell: Hopper's scale on the same cuDNN kernel family stands in"

# (gpu, kind) -> (the key whose value stands in, why), for every GPU x kind; FITTED wins where it has the key. The
# chains end at four keys the fit subset always pins (two or more rows each): h100 fp8_blockwise, h100 attention,
# gb200 mxfp8, gb200 gdn_step.
BORROWED: dict[tuple[str, str], tuple[tuple[str, str], str]] = {
    **{("h200", k): (("h100", k), _SAME_HOPPER) for k in KINDS},
    ("h100", "bf16"): (("h100", "fp8_cs"), _FP8_FOR_BF16),
    ("h100", "fp8_cs"): (("h100", "fp8_blockwise"), _OTHER_FP8),
    ("h100", "mxfp8"): (("h100", "fp8_blockwise"), _NOT_RUNNABLE),
    ("h100", "gdn_step"): (("gb200", "gdn_step"), _GDN),
    ("gb200", "bf16"): (("gb200", "mxfp8"), _FP8_FOR_BF16),
    ("gb200", "fp8_cs"): (("gb200", "mxfp8"), _OTHER_FP8),
    ("gb200", "fp8_blockwise"): (("gb200", "mxfp8"), _BLOCKWISE_ON_BLACKWELL),
    ("gb200", "attention"): (("h100", "attention"), _HOPPER_ATTENTION),
    **{(gpu, k): ((gpu, "mxfp8"), why) for gpu in ("gb300", "b200")
       for k, why in (("bf16", _FP8_FOR_BF16), ("fp8_cs", _OTHER_FP8), ("fp8_blockwise", _BLOCKWISE_ON_BLACKWELL))},
    **{(gpu, "mxfp8"): (("gb200", "mxfp8"), _OTHER_BLACKWELL) for gpu in ("gb300", "b200")},
    **{(gpu, "attention"): (("gb200", "attention"), _SAME_KERNEL) for gpu in ("gb300", "b200")},
    **{(gpu, "gdn_step"): (("gb200", "gdn_step"), _GDN) for gpu in ("gb300", "b200")},
}


@dataclass(frozen=True)
class Constant:
    """One constant as the step model reads it: its value, and where it comes from."""

    key: tuple[str, str]
    value: float
    source: tuple[str, str]  # the FITTED key the value is (itself when fitted on this GPU x kind)
    note: str                # empty when fitted; else why the borrowed value stands in

    @property
    def anchored(self) -> bool:
        """Fitted to published rows of this very GPU and kind."""
        return self.source == self.key


def constant(gpu: str, kind: str, table: dict[tuple[str, str], float] | None = None) -> Constant:
    """The constant of ``kind`` (a precision key, "attention" or "gdn_step") for GPU ``gpu``, from ``table``
    (default :data:`FITTED`), following :data:`BORROWED` where the GPU x kind has no fitted value.

    Raises:
        KeyError: a GPU or kind outside :data:`GPUS` / :data:`KINDS`.
    """
    table = FITTED if table is None else table
    key, notes = (gpu, kind), []
    while key not in table:
        key, why = BORROWED[key]
        notes.append(f"{key[0]} {key[1]} stands in: {why}")
    return Constant((gpu, kind), table[key], key, "; ".join(notes))
