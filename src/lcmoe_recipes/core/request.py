"""TrainingRequest: everything a user can ask ("train model M at seq_length S on N GPUs of type H", with wishes and
run options), validated once; every command builds one from its flags and the Python API takes one.

What it does not decide: which named recipe or layout answers it (:func:`lcmoe_recipes.planner.resolve.resolve`), and how
its job is run (executor settings live with the executors).
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..catalog import get_hardware, get_model
from ..catalog.config_fields import unknown_override
from ..errors import LcmoeError, OverrideError
from .plan import HBM_MARGIN, PRECISIONS

DISPATCHER_BACKENDS = ("deepep", "hybridep", "alltoall")
ROPE_CHOICES = ("auto", "yarn", "abf", "keep")  # :func:`lcmoe_recipes.rules.positions.choose_positions`
# the least HBM fraction a plan keeps free: the memory check (lcmoe_recipes.checks.memory.memory_findings) refuses a predicted
# peak above HBM_MARGIN (95%) of HBM, for the allocator's fragmentation and NCCL buffers
DEFAULT_MEMORY_MARGIN = round(1 - HBM_MARGIN, 6)
# wishes that ask for another layout or other knobs than a named recipe pins: with any of them, the recipe's target is
# planned instead (:func:`lcmoe_recipes.planner.resolve.resolve`)
LAYOUT_WISHES = ("tp", "pp", "cp", "ep", "dispatcher", "micro_batch_size", "variable_length", "allow_cpu_offload")


# The run options every plan takes, named recipe or planned (the named recipes' factories take them as keywords, with
# precision): the fields of TrainingRequest that :func:`lcmoe_recipes.rules.extension.extension_fields` reads.
RUN_OPTIONS = ("rope", "tokens_per_step", "global_batch_size", "micro_batch_size", "lr", "train_iters",
               "pretrained_checkpoint")


class TrainingRequest(BaseModel):
    """What the user asks for. Only the model is required (or a named ``recipe``, or ``from_config``); the target
    (``hardware``, ``num_gpus``) defaults to the named recipe's that matches, and everything else is an optional wish
    or run option.

    Raises:
        pydantic.ValidationError: one line per bad field, naming the valid values (:meth:`parse` raises
            :class:`~lcmoe_recipes.errors.LcmoeError` instead).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, protected_namespaces=())

    # --- what to train ---------------------------------------------------------------------------------------
    model: str | None = Field(default=None, description="catalogue model or alias (dsv3, qwen3_235b, qwen3_next, ...), "
                              "or the path of a config.json; with model_config, the catalogue key of that file")
    model_config_path: str | None = Field(default=None, alias="model_config",
                                          description="a model's Hugging Face config.json (or a folder holding one): "
                                          "any architecture megatron-bridge builds (lcmoe_recipes.catalog.user)")
    recipe: str | None = Field(default=None, description="a named recipe (lcmoe_recipes.NAMED_RECIPES); seq_length, "
                               "hardware and num_gpus default to its own")
    seq_length: int | None = Field(default=None, description="tokens per sample")
    phases: tuple[int, ...] | None = Field(default=None, description="context-extension phases: increasing "
                                           "seq_lengths, one config each, each starting from the previous one's "
                                           "checkpoints (instead of seq_length)")
    # --- where -------------------------------------------------------------------------------------------------
    hardware: str | None = Field(default=None, description="h100, h200, b200, gb200 or gb300")
    num_gpus: int | None = Field(default=None, description="world size")
    # --- wishes --------------------------------------------------------------------------------------------------
    precision: str | None = Field(default=None, description=f"one of {', '.join(PRECISIONS)} (default: the base "
                                  "model's training precision on this GPU, else BF16; a named recipe's own)")
    global_batch_size: int | None = Field(default=None, description="a fixed GBS in samples instead of the token "
                                          "budget (default: tokens_per_step / seq_length)")
    micro_batch_size: int = Field(default=1, description="MBS in samples")
    dispatcher: str | None = Field(default=None, description=f"one of {', '.join(DISPATCHER_BACKENDS)}")
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    ep: int | None = None
    allow_cpu_offload: bool = True
    variable_length: bool = Field(default=False, description="packed / variable-length batches (no CUDA graphs)")
    memory_margin: float = Field(default=DEFAULT_MEMORY_MARGIN, description="fraction of HBM the plan keeps free "
                                 "(default 0.05: the predicted HBM use, allocator peak and buffers outside it, may "
                                 "reach 95% of HBM)")
    # --- run options ---------------------------------------------------------------------------------------------
    rope: str = Field(default="auto", description="positions: auto (YaRN where seq_length exceeds the trained range), "
                      "yarn, abf or keep (lcmoe_recipes.rules.positions)")
    tokens_per_step: int | None = Field(default=None, description="tokens per optimizer step (default: the base "
                                        "model's published pre-training batch, else ~8M above 100B parameters, ~4M "
                                        "below)")
    lr: float | None = Field(default=None, description="learning rate of the phase (default: the base model's final "
                             "pre-training LR, constant after a short warm-up)")
    train_iters: int | None = Field(default=None, description="optimizer steps of the phase (default: the base "
                                    "model's published extension length where known, else 1000)")
    from_hf: str | None = Field(default=None, description="start from a local Hugging Face checkpoint folder")
    from_checkpoint: str | None = Field(default=None, description="start from a Megatron checkpoint folder")
    convert_to: str | None = Field(default=None, description="with from_hf: convert it once into this Megatron "
                                   "checkpoint folder at the job's start and start from that")
    pretrained_checkpoint: str | None = Field(default=None, description="a Megatron checkpoint whose weights the run "
                                              "starts from, unchecked (default: random initialisation; a later phase: "
                                              "the previous phase's checkpoint.save)")
    from_config: str | None = Field(default=None, description="retarget this ConfigContainer YAML, or a "
                                    "megatron-bridge recipe by function name, to seq_length")
    overrides: tuple[str, ...] = Field(default=(), description="Hydra overrides on megatron-bridge field names, "
                                       "applied to the built ConfigContainer and checked again")
    save_dir: str | None = Field(default=None, description="absolute folder on shared storage for checkpoints and "
                                 "logs (each phase in DIR/phaseN_<len>k)")
    data_path: tuple[str, ...] = Field(default=(), description="Megatron dataset prefixes, optionally weighted")
    tokenizer: str | None = Field(default=None, description="Hugging Face tokenizer for real data (default with "
                                  "from_hf and data_path: the tokenizer of the from_hf folder)")
    calibration: str | None = Field(default=None, description="a calibration profile (lcmoe-calibrate): the search "
                                    "ranks and fits with its constants in place of the published fit")
    calibration_run: bool = Field(default=False, description="plan the one-node run that measures what calibration "
                                  "needs (the target's per-GPU shapes, fewer layers, PP 1) instead of the target")
    fs_gbps: float | None = Field(default=None, description="write bandwidth of the checkpoint filesystem, GB/s: sets "
                                  "the save cadence (default: lcmoe_recipes.cost.wallclock.DEFAULT_FS_GBPS)")
    mtbf_hours: float | None = Field(default=None, description="the job's mean time between failures, hours: sets the "
                                     "recovery saves' interval (default: Llama 3's per-GPU failure rate over the "
                                     "job's GPUs, lcmoe_recipes.cost.wallclock.job_mtbf_hours)")
    phase: int | None = Field(default=None, description="1-based phase of a phased run (set by the resolver)")

    # --- construction ----------------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, **fields) -> "TrainingRequest":
        """A request from keyword fields, with pydantic's errors as one :class:`LcmoeError` naming every bad field
        and, where the validator names one, the fix.

        Raises:
            LcmoeError: the message lists each bad field; UnknownName: an unknown model or hardware name (with the
                closest one), as the catalogue says it; ModelConfigError: a bad model_config file; OverrideError: an
                override naming no megatron-bridge section or field (:mod:`lcmoe_recipes.catalog.config_fields`).
        """
        for key, lookup in (("model", get_model), ("hardware", get_hardware)):
            if isinstance(fields.get(key), str):
                lookup(fields[key])
        overrides = list(fields.get("overrides") or ())
        for i, text in enumerate(overrides):  # a key no config has: refused before megatron-bridge loads
            following = overrides[i + 1] if i + 1 < len(overrides) and isinstance(overrides[i + 1], str) else None
            wrong = unknown_override(text, following) if isinstance(text, str) else None
            if wrong:
                raise OverrideError(*wrong)
        try:
            return cls(**fields)
        except ValidationError as exc:
            parts, fixes = [], []
            for e in exc.errors():
                text = e["msg"].removeprefix("Value error, ")
                if "; use " in text:  # the validator names the fix: say it once, as the fix
                    text, _, fix = text.rpartition("; ")
                    fixes.append(fix)
                elif "; valid: " in text:  # the valid values are the fix
                    text, _, valid = text.rpartition("; valid: ")
                    fixes.append(f"use one of {valid}")
                where = ".".join(str(x) for x in e["loc"])
                parts.append(f"{where}: {text}" if where else text)
            raise LcmoeError(f"invalid request: {'; '.join(parts)}", "; ".join(fixes) or
                             "see the field descriptions of lcmoe_recipes.TrainingRequest",
                             fields=tuple(cls.model_fields)) from None

    def replace(self, **changes) -> "TrainingRequest":
        """A copy with ``changes`` applied and validated again (:meth:`parse`'s errors)."""
        return type(self).parse(**{**self.fields(), **changes})

    def fields(self) -> dict:
        """The fields that were given, by name (``model_config`` under its alias): what :meth:`replace` keeps, so a
        wish given at its default value (``micro_batch_size=1``: MBS fixed, not searched) stays given."""
        return self.model_dump(by_alias=True, exclude_unset=True)

    def layout_wishes(self) -> list[str]:
        """The wishes (of :data:`LAYOUT_WISHES`) given: with any, a named recipe's target is planned instead."""
        defaults = type(self).model_fields
        return [name for name in LAYOUT_WISHES if getattr(self, name) != defaults[name].default]

    def __init__(self, **data) -> None:
        path = data.get("model_config", data.get("model_config_path"))
        if path is not None:
            get_model(str(path))  # a bad file raises ModelConfigError itself (exit 2 on the command line), not wrapped
        super().__init__(**data)

    # --- validation ----------------------------------------------------------------------------------------------
    @model_validator(mode="before")
    @classmethod
    def _model_from_config(cls, data):
        """``model_config=PATH``: load and register the file; ``model`` becomes its catalogue key (a ``model`` given
        as well must name the same entry). A config.json path given as ``model`` is loaded the same way."""
        if isinstance(data, dict):
            path = data.get("model_config", data.get("model_config_path"))
            if path is not None:
                key = get_model(str(path)).key  # loads and registers; raises ModelConfigError (a ValueError)
                if data.get("model") not in (None, key) and get_model(str(data["model"])).key != key:
                    raise ValueError(f"model {data['model']!r} and model_config {str(path)!r} name different models; "
                                     "use one of them")
                data = {**data, "model": key}
        return data

    @field_validator("model")
    @classmethod
    def _model(cls, value: str | None) -> str | None:
        return None if value is None else get_model(value).key  # UnknownName (a ValueError) lists the valid models

    @field_validator("from_hf", "from_checkpoint", "convert_to")
    @classmethod
    def _absolute_folder(cls, value: str | None) -> str | None:
        """A weights folder given relative to where the command runs, made absolute: the config is read by ranks
        that start elsewhere (a Slurm job's ranks run in its code folder; torchrun's on other nodes)."""
        return os.path.abspath(os.path.expanduser(value)) if value else value

    @field_validator("hardware")
    @classmethod
    def _hardware(cls, value: str | None) -> str | None:
        return None if value is None else get_hardware(value).key

    @field_validator("seq_length")
    @classmethod
    def _seq_length(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError(f"seq_length {value} must be greater than 0 (tokens per sample); use e.g. 131072 (128K)")
        return value

    @field_validator("phases")
    @classmethod
    def _phases(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and (not value or min(value) <= 0 or list(value) != sorted(set(value))):
            raise ValueError(f"phases {','.join(map(str, value))}: give increasing positive lengths; use e.g. "
                             "32768,131072")
        return value

    @field_validator("num_gpus")
    @classmethod
    def _num_gpus(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError(f"num_gpus {value} must be greater than 0; use e.g. 256")
        return value

    @field_validator("global_batch_size", "micro_batch_size", "tp", "pp", "cp", "ep", "tokens_per_step",
                     "train_iters")
    @classmethod
    def _positive(cls, value: int | None, info) -> int | None:
        examples = {"global_batch_size": "64", "micro_batch_size": "1", "tokens_per_step": "8388608 (8M)",
                    "train_iters": "1000"}
        if value is not None and value <= 0:
            raise ValueError(f"{info.field_name} {value} must be greater than 0; use e.g. "
                             f"{examples.get(info.field_name, '1, 2, 4 or 8')}")
        return value

    @field_validator("lr")
    @classmethod
    def _lr(cls, value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise ValueError(f"lr {value:g} must be greater than 0 (a learning rate); use e.g. 1e-05")
        return value

    @field_validator("fs_gbps")
    @classmethod
    def _fs_gbps(cls, value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise ValueError(f"fs_gbps {value:g} must be greater than 0 (GB/s the checkpoint filesystem writes); use "
                             "e.g. 20")
        return value

    @field_validator("mtbf_hours")
    @classmethod
    def _mtbf_hours(cls, value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise ValueError(f"mtbf_hours {value:g} must be greater than 0 (hours between failures of the job); use "
                             "e.g. 100")
        return value

    @field_validator("rope")
    @classmethod
    def _rope(cls, value: str) -> str:
        if value not in ROPE_CHOICES:
            raise ValueError(f"unknown rope '{value}'; valid: {', '.join(ROPE_CHOICES)}")
        return value

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
    def _something_to_train(self) -> "TrainingRequest":
        if not (self.model or self.recipe or self.from_config):
            raise ValueError("no model given; use a catalogue model (dsv3, qwen3_235b, qwen3_next, ...), a named "
                             "recipe, or model_config=PATH")
        if self.phases is not None and self.seq_length is not None:
            raise ValueError("seq_length and phases both given; use one of them (phases=32768,131072 plans one "
                             "config per length)")
        if self.from_config and self.seq_length is None:
            raise ValueError("from_config needs seq_length (the length to retarget the config to); use e.g. "
                             "seq_length=131072")
        return self

    @model_validator(mode="after")
    def _weights(self) -> "TrainingRequest":
        if self.from_hf and self.from_checkpoint:
            raise ValueError("`from_hf` and `from_checkpoint` both given; use one of them")
        if self.from_config and (self.from_hf or self.from_checkpoint):
            raise ValueError("`from_config` keeps the checkpoint settings of the config it retargets; use the override "
                             "checkpoint.pretrained_checkpoint=DIR (a Megatron checkpoint) instead of `from_hf` / "
                             "`from_checkpoint`")
        if self.convert_to and not self.from_hf:
            raise ValueError("convert_to converts a Hugging Face folder and needs from_hf; use from_hf=DIR, or drop "
                             "convert_to")
        return self

    @model_validator(mode="after")
    def _dispatcher_needs_experts(self) -> "TrainingRequest":
        if self.dispatcher and self.model and not get_model(self.model).is_moe:
            raise ValueError(f"dispatcher {self.dispatcher!r} requested for {get_model(self.model).display}, a dense "
                             "model (no experts, no token dispatcher); use no dispatcher")
        if self.dispatcher in ("deepep", "hybridep") and self.hardware:  # asked of a GPU that cannot run it
            hw = get_hardware(self.hardware)
            runs = {"deepep": hw.supports_deepep, "hybridep": hw.supports_hybridep}
            if not runs[self.dispatcher]:
                ok = [name for name in DISPATCHER_BACKENDS if runs.get(name, True)]
                raise ValueError(f"dispatcher {self.dispatcher!r} does not run on {hw.display}; use "
                                 + " or ".join(f"dispatcher={name}" for name in ok))
        return self

    @model_validator(mode="after")
    def _whole_nodes(self) -> "TrainingRequest":
        if self.hardware is None or self.num_gpus is None:
            return self
        hw = get_hardware(self.hardware)
        if (near := hw.whole_node_counts(self.num_gpus)) is not None:
            raise ValueError(f"{self.num_gpus} GPUs do not fill whole {self.hardware} nodes of {hw.gpus_per_node} "
                             f"(nor divide one); use {near[0]} or {near[1]}")
        return self

    @model_validator(mode="after")
    def _fixed_degrees_fit(self) -> "TrainingRequest":
        product = 1
        for v in (self.tp, self.pp, self.cp):
            product *= v or 1
        if self.num_gpus is not None and self.num_gpus % product:
            fits = []
            for name in ("tp", "pp", "cp"):
                value = getattr(self, name)
                if value and value > 1:
                    rest = product // value
                    near = [d for d in range(1, self.num_gpus + 1) if self.num_gpus % (d * rest) == 0
                            and d & (d - 1) == 0]  # powers of two: what megatron's layouts use
                    below, above = [d for d in near if d < value], [d for d in near if d > value]
                    named = " or ".join(f"{name}={d}" for d in ([below[-1]] if below else []) + above[:1])
                    if named:
                        fits.append(named)
            raise ValueError(f"fixed TP·PP·CP = {product} does not divide the {self.num_gpus} GPUs (`num_gpus`)"
                             + (f"; use {'; or '.join(fits)}" if fits else ""))
        return self


def seq_tag(seq_length: int) -> str:
    """``seq_length`` as plan and folder names write it: ``128k`` for a whole number of 1,024 tokens, else the number
    itself (``100000``: a name must not round a length it does not train at)."""
    return f"{seq_length // 1024}k" if seq_length % 1024 == 0 else str(seq_length)


# override key -> the TrainingRequest field that asks for the same quantity (a launch warns when both are given and
# the override wins with another value: lcmoe_recipes.jobs.prepare.configure)
SAME_QUANTITY = {"model.seq_length": "seq_length", "model.tensor_model_parallel_size": "tp",
                 "model.pipeline_model_parallel_size": "pp", "model.context_parallel_size": "cp",
                 "model.expert_model_parallel_size": "ep", "train.global_batch_size": "global_batch_size",
                 "train.micro_batch_size": "micro_batch_size", "optimizer.lr": "lr", "train.train_iters": "train_iters"}

