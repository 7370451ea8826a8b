"""TrainingRequest: the validated input of the planner ("train model M at seq_length S on N GPUs of type H")."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .catalog import get_hardware, get_model
from .cost import HBM_MARGIN
from .plan import PRECISIONS
from .rules.extension import RunOptions
from .rules.positions import ROPE_CHOICES

DISPATCHER_BACKENDS = ("deepep", "hybridep", "alltoall")
# the least HBM fraction a plan keeps free: the memory check (lcmoe_recipes.cost.memory_findings) refuses a predicted
# peak above HBM_MARGIN (95%) of HBM, for the allocator's fragmentation and NCCL buffers
DEFAULT_MEMORY_MARGIN = round(1 - HBM_MARGIN, 6)


class TrainingRequest(BaseModel):
    """What the user asks for; everything but model, seq_length, hardware and num_gpus is an optional wish.

    Raises:
        pydantic.ValidationError: with one line per bad field, naming the valid values.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, protected_namespaces=())

    model: str = Field(description="catalogue model or alias (dsv3, qwen3_235b, qwen3_next, ...), or the path of a "
                       "config.json; with model_config, the catalogue key of that file")
    model_config_path: str | None = Field(default=None, alias="model_config",
                                          description="a model's Hugging Face config.json (or a folder holding one): "
                                          "any architecture megatron-bridge builds (lcmoe_recipes.catalog.user)")
    seq_length: int = Field(gt=0, description="tokens per sample")
    hardware: str = Field(description="h100, h200, b200, gb200 or gb300")
    num_gpus: int = Field(gt=0, description="world size")
    precision: str | None = Field(default=None, description=f"one of {', '.join(PRECISIONS)}")
    global_batch_size: int | None = Field(default=None, gt=0)
    micro_batch_size: int = Field(default=1, gt=0)
    dispatcher: str | None = Field(default=None, description=f"one of {', '.join(DISPATCHER_BACKENDS)}")
    tp: int | None = Field(default=None, gt=0)
    pp: int | None = Field(default=None, gt=0)
    cp: int | None = Field(default=None, gt=0)
    ep: int | None = Field(default=None, gt=0)
    allow_cpu_offload: bool = True
    variable_length: bool = Field(default=False, description="packed / variable-length batches (no CUDA graphs)")
    rope: str = Field(default="auto", description="positions: auto, yarn, abf or keep (rules/positions.py)")
    tokens_per_step: int | None = Field(default=None, gt=0, description="tokens per optimizer step")
    lr: float | None = Field(default=None, gt=0, description="learning rate of the phase")
    train_iters: int | None = Field(default=None, gt=0, description="optimizer steps of the phase")
    pretrained_checkpoint: str | None = Field(default=None, description="Megatron checkpoint to start from")

    memory_margin: float = Field(default=DEFAULT_MEMORY_MARGIN, description="fraction of HBM the plan keeps free "
                                 "(default 0.05: the predicted peak may reach 95% of HBM)")

    def run_options(self) -> RunOptions:
        """The per-run options every plan's common decisions take (:mod:`lcmoe_recipes.rules.extension`)."""
        return RunOptions(rope=self.rope, tokens_per_step=self.tokens_per_step, global_batch_size=self.global_batch_size,
                          micro_batch_size=self.micro_batch_size, lr=self.lr, train_iters=self.train_iters,
                          pretrained_checkpoint=self.pretrained_checkpoint)

    @field_validator("rope")
    @classmethod
    def _rope(cls, value: str) -> str:
        if value not in ROPE_CHOICES:
            raise ValueError(f"unknown rope '{value}'; valid: {', '.join(ROPE_CHOICES)}")
        return value

    def __init__(self, **data) -> None:
        path = data.get("model_config", data.get("model_config_path"))
        if path is not None:
            get_model(str(path))  # a bad file raises ModelConfigError itself (exit 2 on the command line), not wrapped
        super().__init__(**data)

    @model_validator(mode="before")
    @classmethod
    def _model_from_config(cls, data):
        """``model_config=PATH``: load and register the file; ``model`` becomes its catalogue key (a ``model`` given
        as well must name the same entry)."""
        if isinstance(data, dict):
            path = data.get("model_config", data.get("model_config_path"))
            if path is not None:
                key = get_model(str(path)).key  # loads and registers; raises ModelConfigError (a ValueError)
                if data.get("model") not in (None, key):
                    raise ValueError(f"model {data['model']!r} and model_config {str(path)!r} name different models; "
                                     "give one of them")
                data = {**data, "model": key}
        return data

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        return get_model(value).key  # raises UnknownName (a ValueError) listing the valid models

    @field_validator("hardware")
    @classmethod
    def _hardware(cls, value: str) -> str:
        return get_hardware(value).key

    @field_validator("precision")
    @classmethod
    def _precision(cls, value: str | None) -> str | None:
        if value is not None and value not in PRECISIONS:
            raise ValueError(f"unknown precision '{value}'; valid: {', '.join(PRECISIONS)}")
        return value

    @field_validator("dispatcher")
    @classmethod
    def _dispatcher(cls, value: str | None) -> str | None:
        if value is not None and value not in DISPATCHER_BACKENDS:
            raise ValueError(f"unknown dispatcher '{value}'; valid: {', '.join(DISPATCHER_BACKENDS)}")
        return value

    @field_validator("memory_margin")
    @classmethod
    def _memory_margin(cls, value: float) -> float:
        if not DEFAULT_MEMORY_MARGIN <= value < 1:
            raise ValueError(f"memory_margin {value:g} is not a fraction of HBM to keep free between "
                             f"{DEFAULT_MEMORY_MARGIN:g} and 1 (the memory check refuses a predicted peak above "
                             f"{1 - DEFAULT_MEMORY_MARGIN:.0%} of HBM); use e.g. 0.1 to keep 10% free")
        return value

    @model_validator(mode="after")
    def _dispatcher_needs_experts(self) -> "TrainingRequest":
        if self.dispatcher and not get_model(self.model).is_moe:
            raise ValueError(f"dispatcher {self.dispatcher!r} requested for {get_model(self.model).display}, a dense "
                             "model (no experts, no token dispatcher); drop --dispatcher")
        return self

    @model_validator(mode="after")
    def _whole_nodes(self) -> "TrainingRequest":
        per = get_hardware(self.hardware).gpus_per_node
        n = self.num_gpus
        if n % per and per % n:
            allowed = [d for d in range(1, per) if per % d == 0] + [per * k for k in range(1, n // per + 2)]
            lower, upper = max(a for a in allowed if a < n), min(a for a in allowed if a > n)
            raise ValueError(f"{n} GPUs do not fill whole {self.hardware} nodes of {per} (nor divide one); use "
                             f"{lower} or {upper}")
        return self

    @model_validator(mode="after")
    def _fixed_degrees_fit(self) -> "TrainingRequest":
        fixed = [v for v in (self.tp, self.pp, self.cp) if v]
        product = 1
        for v in fixed:
            product *= v
        if self.num_gpus % product:
            raise ValueError(f"fixed TP·PP·CP = {product} does not divide num_gpus {self.num_gpus}")
        return self
