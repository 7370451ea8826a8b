"""Checkpoint folders on disk -- a Hugging Face model folder or a Megatron checkpoint -- read and checked against the
model being planned. Imports neither torch nor megatron: it reads ``config.json`` and ``run_config.yaml`` as text.

* :func:`check_hf_folder`: a local Hugging Face folder (``--from-hf``) must hold a ``config.json`` whose architecture
  numbers are the planned model's, and every weight file that config's index names.
* :func:`read_megatron_checkpoint` / :func:`check_megatron_checkpoint`: a Megatron distributed checkpoint
  (``--from-checkpoint``, or a folder converted earlier) must be complete (megatron-bridge writes the tracker file
  ``latest_train_state.pt`` / ``latest_checkpointed_iteration.txt`` after the iteration folder is saved) and its saved
  run config (``iter_NNNNNNN/run_config.yaml``, megatron-bridge 0.6.2 ``training/utils/checkpoint_utils.py``,
  ``get_checkpoint_run_config_filename``) must describe the planned model. The Hugging Face folder a converted
  checkpoint came from is its ``model.hf_model_id`` (``AutoBridge.to_megatron_provider`` records it;
  ``checkpoint_utils.get_hf_model_id_from_checkpoint`` reads it back).

Every refusal is a :class:`CheckpointError` naming the folder, each mismatching number with both values, and the fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..catalog import MODELS, ModelSpec, get_model
from ..core.plan import Reason
from ..core.request import TrainingRequest
from ..errors import Finding, LcmoeError

# Architecture fields of config.json compared with the catalogue (those the folder's model and the planned model both
# have). Not compared: positions (rope_theta, rope_scaling, max_position_embeddings: an extension phase changes them),
# dtype, token ids, dropout and other training-time settings.
HF_ARCHITECTURE_KEYS = (
    "model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "moe_intermediate_size",
    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "n_routed_experts", "num_experts", "num_experts_per_tok", "n_shared_experts", "shared_expert_intermediate_size",
    "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step",
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_nextn_predict_layers",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim", "full_attention_interval",
)
_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# what transformers' AutoTokenizer reads from a checkpoint folder: one of these is there when a tokenizer is
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
TRACKER_FILES = ("latest_train_state.pt", "latest_checkpointed_iteration.txt")
RUN_CONFIG = "run_config.yaml"


class CheckpointError(LcmoeError):
    """A checkpoint folder that is missing, incomplete, or holds another model than the one planned."""


def read_hf_config(folder: str | Path) -> dict[str, Any]:
    """``folder/config.json`` as a dict.

    Raises:
        CheckpointError: the folder or its config.json is missing, or config.json is not a JSON object.
    """
    path = Path(folder)
    if not path.is_dir():
        raise CheckpointError(f"Hugging Face folder '{folder}' does not exist (or is not a folder)",
                              "give the local folder of a Hugging Face checkpoint (config.json + *.safetensors); "
                              "nothing is downloaded from a hub")
    config = path / "config.json"
    if not config.is_file():
        raise CheckpointError(f"'{folder}' has no config.json, so it is not a Hugging Face model folder",
                              "point at the folder that holds config.json and the *.safetensors files (for a hub "
                              "snapshot: .../snapshots/<revision>/)")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"'{config}' is not valid JSON ({exc})", "restore the file from the model's "
                              "published checkpoint") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"'{config}' is not a JSON object", "restore the file from the model's published checkpoint")
    return data


def hf_weight_files(folder: str | Path) -> list[Path]:
    """The weight files of a Hugging Face folder (every shard its index names, else every ``*.safetensors`` /
    ``pytorch_model*.bin``).

    Raises:
        CheckpointError: no weight file, or shards named by the index are missing (a partial download).
    """
    path = Path(folder)
    for index_name in _INDEX_FILES:
        index = path / index_name
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values()))
            missing = [name for name in shards if not (path / name).is_file()]
            if missing:
                more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
                raise CheckpointError(f"'{folder}' is incomplete: {index_name} names {len(shards)} weight files but "
                                      f"{len(missing)} are missing: {', '.join(missing[:3])}{more}",
                                      "finish copying the checkpoint (every shard the index names)")
            return [path / name for name in shards]
    files = sorted(f for pattern in _WEIGHT_PATTERNS for f in path.glob(pattern) if f.is_file())
    if not files:
        raise CheckpointError(f"'{folder}' has a config.json but no weights (*.safetensors or pytorch_model*.bin)",
                              "copy the weight files into the folder too; a config alone trains from random weights "
                              "(leave out --from-hf for that)")
    return files


def _number_mismatches(found: dict[str, Any], expected: dict[str, Any], keys) -> list[tuple[str, Any, Any]]:
    return [(key, found[key], expected[key]) for key in keys
            if key in found and key in expected and found[key] != expected[key]]


def matching_models(config: dict[str, Any]) -> list[str]:
    """Catalogue keys whose architecture numbers equal ``config``'s (every compared key that both have)."""
    return [spec.key for spec in MODELS.values()
            if spec.config.get("model_type") == config.get("model_type")
            and not _number_mismatches(config, spec.config, HF_ARCHITECTURE_KEYS)]


def _mismatch_error(what: str, spec: ModelSpec, mismatches: list[tuple[str, Any, Any]], others: list[str],
                    fix: str) -> CheckpointError:
    listed = "; ".join(f"{key} is {found!r} there but {expected!r} for {spec.key}" for key, found, expected in mismatches)
    other = f" It matches catalogue model {', '.join(repr(k) for k in others)}: plan that model instead, or" if others \
        else ""
    return CheckpointError(f"{what} is not {spec.display}: {listed}", f"{other} {fix}".strip())


def check_hf_folder(folder: str | Path, spec: ModelSpec) -> dict[str, Any]:
    """Check that a local Hugging Face folder holds ``spec``'s model, with its weights; returns its config.json.

    Args:
        folder: the folder given to ``--from-hf`` (config.json + weights; never a hub id).
        spec: the catalogue entry of the model being planned.

    Raises:
        CheckpointError: folder or config.json missing; no (or missing) weight files; any architecture number of
            :data:`HF_ARCHITECTURE_KEYS` differs from the catalogue's (each one named with both values).
    """
    config = read_hf_config(folder)
    mismatches = _number_mismatches(config, spec.config, HF_ARCHITECTURE_KEYS)
    if mismatches:
        raise _mismatch_error(f"the Hugging Face checkpoint in '{folder}'", spec, mismatches, matching_models(config),
                              f"point --from-hf at a {spec.display} checkpoint")
    hf_weight_files(folder)
    return config


@dataclass(frozen=True)
class MegatronCheckpoint:
    """A complete Megatron distributed checkpoint on disk.

    Attributes:
        root: the checkpoint folder (holds the tracker file and ``iter_*`` folders).
        iteration_dir: the newest complete iteration folder.
        iteration: its iteration number (0 for a converted Hugging Face checkpoint).
        run_config: its ``run_config.yaml`` as a dict (megatron-bridge's ConfigContainer, ``model`` section first).
    """

    root: Path
    iteration_dir: Path
    iteration: int
    run_config: dict[str, Any]

    @property
    def model(self) -> dict[str, Any]:
        """The saved ``model`` section (Megatron field names)."""
        return self.run_config.get("model") or {}

    @property
    def hf_source(self) -> str | None:
        """The Hugging Face folder this checkpoint was converted from (``model.hf_model_id``), if recorded."""
        value = self.model.get("hf_model_id")
        return str(value) if value else None


_ITER = re.compile(r"^iter_(\d{7})$")


def read_megatron_checkpoint(folder: str | Path) -> MegatronCheckpoint:
    """The newest complete iteration of the Megatron checkpoint in ``folder`` (the root, or one ``iter_*`` folder).

    Raises:
        CheckpointError: not a folder; no tracker file (the save never finished); no ``iter_*`` folder with
            ``run_config.yaml`` and torch_dist's ``.metadata``; an unreadable run config.
    """
    path = Path(folder)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint folder '{folder}' does not exist (or is not a folder)",
                              "give the folder a previous run saved to (checkpoint.save), or convert a Hugging Face "
                              "checkpoint with `python -m lcmoe_recipes.convert --hf DIR --out DIR`")
    if _ITER.match(path.name) and not any((path / t).is_file() for t in TRACKER_FILES):
        path = path.parent
    if not any((path / t).is_file() for t in TRACKER_FILES):
        hint = " (it looks like a Hugging Face folder: use --from-hf)" if (path / "config.json").is_file() else ""
        raise CheckpointError(f"'{folder}' is not a complete Megatron checkpoint: no {' or '.join(TRACKER_FILES)}"
                              f"{hint}", "give the folder a finished save wrote (Megatron writes the tracker file last)")
    iterations = sorted(((int(m.group(1)), d) for d in path.iterdir()
                         if d.is_dir() and (m := _ITER.match(d.name))
                         and (d / RUN_CONFIG).is_file() and (d / ".metadata").is_file()), reverse=True)
    if not iterations:
        raise CheckpointError(f"'{folder}' has a tracker file but no complete iteration folder (iter_NNNNNNN with "
                              f"{RUN_CONFIG} and .metadata)", "give a checkpoint saved by megatron-bridge (torch_dist)")
    iteration, iteration_dir = iterations[0]
    try:
        run_config = yaml.safe_load((iteration_dir / RUN_CONFIG).read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise CheckpointError(f"'{iteration_dir / RUN_CONFIG}' is not readable YAML ({exc})",
                              "restore the checkpoint's run_config.yaml") from None
    return MegatronCheckpoint(path, iteration_dir, iteration, run_config)


def megatron_architecture(spec: ModelSpec) -> dict[str, Any]:
    """The planned model's numbers under megatron-core's field names (what ``run_config.yaml`` records)."""
    c = spec.config
    numbers = {"num_layers": spec.num_layers, "hidden_size": spec.hidden_size,
               "num_attention_heads": spec.num_attention_heads, "num_moe_experts": spec.num_moe_experts,
               "moe_router_topk": spec.moe_router_topk, "vocab_size": spec.vocab_size,
               "moe_ffn_hidden_size": c.get("moe_intermediate_size")}
    if spec.multi_latent_attention:
        numbers.update(kv_lora_rank=c["kv_lora_rank"], q_lora_rank=c.get("q_lora_rank"))
    else:
        numbers["num_query_groups"] = spec.num_query_groups
    if spec.gated_delta_net:
        numbers.update(linear_num_key_heads=c["linear_num_key_heads"], linear_num_value_heads=c["linear_num_value_heads"])
    return numbers


def check_megatron_checkpoint(folder: str | Path, spec: ModelSpec) -> MegatronCheckpoint:
    """Check that ``folder`` is a complete Megatron checkpoint of ``spec``'s model (``--from-checkpoint``).

    Raises:
        CheckpointError: incomplete or unreadable (see :func:`read_megatron_checkpoint`), no saved run config
            ``model`` section, or any number of :func:`megatron_architecture` that differs (each named).
    """
    ckpt = read_megatron_checkpoint(folder)
    if not ckpt.model:
        raise CheckpointError(f"'{ckpt.iteration_dir / RUN_CONFIG}' has no model section, so the checkpoint's model "
                              "cannot be checked", "give a checkpoint saved by megatron-bridge")
    expected = megatron_architecture(spec)
    mismatches = _number_mismatches(ckpt.model, expected, expected)
    if mismatches:
        raise _mismatch_error(f"the Megatron checkpoint in '{folder}' (iteration {ckpt.iteration})", spec, mismatches,
                              [], f"point --from-checkpoint at a checkpoint of {spec.display}")
    return ckpt


CHECKPOINTING = "megatron-bridge 0.6.2 training/checkpointing.py"
PRETRAINED = "checkpoint.pretrained_checkpoint"


def not_here(named: str) -> Finding:
    """The warning (rule ``weights/not-here``) for weights this machine does not see: ``named`` is the flag or field
    that names them, with the folder (``--from-hf DIR``, ``checkpoint.pretrained_checkpoint=DIR``)."""
    return Finding("warning", "weights/not-here", f"{named} is not on this machine: it is checked against the "
                   "planned model where the job starts", "build on a machine that sees it to have it checked now")


def pretrained_findings(path: str | None, spec: ModelSpec) -> list[Finding]:
    """The weights a config starts from (``checkpoint.pretrained_checkpoint``, however it was set: ``--from-hf``, an
    override, a hand-edited YAML), checked against the planned model where this machine sees the folder (rule
    ``weights/pretrained-model``).

    A Hugging Face folder (``config.json``) is checked as ``--from-hf``'s (:func:`check_hf_folder`); a folder with a
    Megatron tracker file as ``--from-checkpoint``'s (:func:`check_megatron_checkpoint`). Existence is not required:
    a path this machine does not see, or a URL, is read where the job starts (the entry script refuses a missing
    one, :func:`lcmoe_recipes.jobs.node.problems_here`), and so is a folder that holds no finished save yet (a later
    phase's, while the phase before it runs).

    Returns:
        [] or one error :class:`lcmoe_recipes.errors.Finding` naming each mismatching number with both values, or the
        missing weight files.
    """
    if not path or "://" in str(path):
        return []
    folder = Path(path)
    if (folder / "config.json").is_file():
        check = check_hf_folder
    elif any((folder / t).is_file() for t in TRACKER_FILES) or (
            _ITER.match(folder.name) and any((folder.parent / t).is_file() for t in TRACKER_FILES)):
        check = check_megatron_checkpoint
    else:
        return []
    try:
        check(folder, spec)
    except CheckpointError as exc:
        fix = exc.fix.replace("point --from-hf at", f"set {PRETRAINED} to").replace(
            "point --from-checkpoint at", f"set {PRETRAINED} to")
        return [Finding("error", "weights/pretrained-model", f"{PRETRAINED}: {exc.message}", fix)]
    return []


@dataclass(frozen=True)
class Weights:
    """Where a run's weights come from.

    Attributes:
        pretrained: ``checkpoint.pretrained_checkpoint`` (None: random initialisation).
        entry: the YAML header's ``weights`` entry (``from_hf`` [+ ``convert_to``] or ``from_checkpoint``), which the
            entry script checks on every node and converts from at the job's start.
        notes: warnings (a folder this machine does not see is checked where the job starts).
        reason: why, for the plan's ``pretrained_checkpoint`` decision (None: nothing given).
    """

    pretrained: str | None = None
    entry: dict = field(default_factory=dict)
    notes: tuple[Finding, ...] = ()
    reason: Reason | None = None


def weights_of(request: TrainingRequest, model: str) -> Weights:
    """The weights ``request`` starts from, checked against ``model`` (a catalogue key) where this machine sees them
    (:mod:`lcmoe_recipes.checks.weights`); a phase after the first starts from the previous phase's checkpoints.

    Raises:
        LcmoeError: a folder that is not the planned model, or is incomplete.
    """

    if request.phase and request.phase > 1:
        folder = request.pretrained_checkpoint
        return Weights(folder, {"from_checkpoint": folder}, (), Reason(
            f"model weights from phase {request.phase - 1}'s checkpoints ({folder}); optimizer state fresh, "
            "iteration reset", f"{CHECKPOINTING} (pretrained checkpoint loaded with finetune=True)"))
    folder = request.from_hf or request.from_checkpoint
    if not folder:
        return Weights(request.pretrained_checkpoint)
    spec = get_model(model)
    flag = "--from-hf" if request.from_hf else "--from-checkpoint"
    notes: tuple[Finding, ...] = ()
    if Path(folder).exists():
        (check_hf_folder if request.from_hf else check_megatron_checkpoint)(folder, spec)
        if request.from_hf and request.data_path and not request.tokenizer and not any(
                (Path(folder) / name).is_file() for name in HF_TOKENIZER_FILES):
            notes = (Finding("warning", "weights/no-tokenizer", f"--from-hf {folder} holds no tokenizer file "
                             f"({', '.join(HF_TOKENIZER_FILES)}), yet the run takes its tokenizer from there",
                             "copy the checkpoint's tokenizer files into the folder, or name one with --tokenizer"),)
    else:
        notes = (not_here(f"{flag} {folder}"),)
    if request.from_checkpoint:
        return Weights(folder, {"from_checkpoint": folder}, notes, Reason(
            f"model weights from the Megatron checkpoint {folder} (optimizer state fresh, iteration reset)",
            f"{CHECKPOINTING} (pretrained checkpoint loaded with finetune=True when checkpoint.load holds none)"))
    entry = {"from_hf": folder, **({"convert_to": request.convert_to} if request.convert_to else {})}
    how = (f"converted once into {request.convert_to} at the job's start (megatron-bridge AutoBridge, "
           "lcmoe_recipes.convert), then loaded" if request.convert_to else
           "read by megatron-bridge at the first start (a Hugging Face folder as checkpoint.pretrained_checkpoint)")
    return Weights(request.convert_to or folder, entry, notes, Reason(
        f"{spec.display} weights from the Hugging Face checkpoint {folder}, {how}; optimizer state fresh; later "
        "restarts resume from this run's own checkpoints",
        f"{CHECKPOINTING} (_load_hf_pretrained_checkpoint, finetune on the first start)"))
