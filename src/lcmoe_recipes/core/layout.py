"""ParallelLayout: the parallel degrees of one run and the sizes Megatron derives from them.

Megatron folds expert parallelism into the dense ranks ("MoE parallel folding"): the world is cut once into
a dense grid TP x CP x DP x PP and once into an expert grid ETP x EP x EDP x PP over the same ranks, so

    DP  = world / (TP * PP * CP)
    EDP = world / (ETP * EP * PP)

EP is *not* an extra factor of the world size (the "TP*EP*CP*PP*DP = world" rule seen in tutorials is wrong for
Megatron: DeepSeek-V3 at 128K runs TP1 CP32 EP32 PP8 on 256 GPUs).
Source: megatron-core 0.19.2 ``parallel_state.initialize_model_parallel`` (the two ``RankGenerator`` grids).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..errors import InfeasibleConfig


@dataclass(frozen=True)
class ParallelLayout:
    """Parallel degrees for ``world`` GPUs. Degrees are Megatron's: TP, PP, VPP (None = no interleaving), CP,
    EP, ETP. Construction checks only that each degree is a positive integer; whether they fold into ``world``
    is a check (:func:`lcmoe_recipes.checks.check_plan`), so that a bad user config can be read and reported on.
    """

    world: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    vpp: int | None = None

    def __post_init__(self) -> None:
        for name in ("world", "tp", "pp", "cp", "ep", "etp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InfeasibleConfig(f"{name.upper()}={value!r} is not a positive integer", "use 1 or more")
        if self.vpp is not None and (not isinstance(self.vpp, int) or self.vpp < 1):
            raise InfeasibleConfig(f"VPP={self.vpp!r} is not a positive integer", "use None (no interleaving) or >= 2")

    def __hash__(self) -> int:
        """The hash dataclasses would give (the seven degrees), computed once: the search keys its caches on layouts
        thousands of times per request."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.world, self.tp, self.pp, self.cp, self.ep, self.etp, self.vpp))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict:
        """Pickle and copy without the cached hash (it is recomputed where the copy lands)."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def dense_model_size(self) -> int:
        """TP·PP·CP: ranks holding one replica of the dense part; must divide ``world``."""
        return self.tp * self.pp * self.cp

    @property
    def expert_model_size(self) -> int:
        """ETP·EP·PP: ranks holding one replica of the experts; must divide ``world``."""
        return self.etp * self.ep * self.pp

    @cached_property  # read thousands of times per search; an instance never changes
    def dp(self) -> int:
        """Data-parallel size world/(TP·PP·CP). Raises InfeasibleConfig if that is not a whole number."""
        if self.world % self.dense_model_size:
            raise InfeasibleConfig(
                f"world size {self.world} is not divisible by TP·PP·CP = {self.tp}·{self.pp}·{self.cp} = "
                f"{self.dense_model_size}",
                "change TP, PP or CP (or the GPU count) so that their product divides the GPU count",
            )
        return self.world // self.dense_model_size

    @cached_property
    def edp(self) -> int:
        """Expert data-parallel size world/(ETP·EP·PP). Raises InfeasibleConfig if not a whole number."""
        if self.world % self.expert_model_size:
            raise InfeasibleConfig(
                f"world size {self.world} is not divisible by ETP·EP·PP = {self.etp}·{self.ep}·{self.pp} = "
                f"{self.expert_model_size}",
                "change EP, ETP or PP (or the GPU count) so that their product divides the GPU count",
            )
        return self.world // self.expert_model_size

    @property
    def num_pipeline_stages(self) -> int:
        """PP·VPP: model chunks in the pipeline layout."""
        return self.pp * (self.vpp or 1)

    def describe(self) -> str:
        """One line, e.g. 'TP1 CP32 EP32 ETP1 PP8 VPP4 -> DP1 EDP1 on 256 GPUs'."""
        vpp = f" VPP{self.vpp}" if self.vpp else ""
        try:
            derived = f"DP{self.dp} EDP{self.edp}"
        except InfeasibleConfig:
            derived = "DP/EDP undefined"
        return (f"TP{self.tp} CP{self.cp} EP{self.ep} ETP{self.etp} PP{self.pp}{vpp} -> {derived} "
                f"on {self.world} GPUs")
