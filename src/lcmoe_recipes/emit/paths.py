"""The files and folders a ConfigContainer reads and writes when it runs, read with megatron's own parsers, and the
checks on them that hold on any machine.

A config names paths on the cluster: dataset prefixes (``dataset.blend``, ``blend_per_split``, ``data_path``), the
tokenizer when it is a file or folder (``tokenizer.tokenizer_model``, ``vocab_file``, ``merge_file``), the checkpoints
it starts from (``checkpoint.load``, ``checkpoint.pretrained_checkpoint``) and where it writes (``checkpoint.save``,
``logger.tensorboard_dir``, ``logger.wandb_save_dir``). Three moments check them:

* where the config is built (:func:`path_findings`, part of every validation): what is wrong whatever the machine --
  a prefix ending in ``.bin``/``.idx``, real data with megatron's ``NullTokenizer``, and ``checkpoint.load`` naming a
  Hugging Face model folder (when that folder is on this machine);
* at submission (:mod:`lcmoe_recipes.jobs.job_checks`): against the container's mounts and the job folder;
* where the job runs (:func:`lcmoe_recipes.jobs.node.problems_here`: the entry script on every rank, and ``--smoke`` on every node): that
  every path it reads exists there. Existence is never required where the config is built: the paths are read on
  the cluster (a login node or laptop may not see ``/lustre``).

It lives under ``emit/`` because reading the paths takes megatron's own parsers (megatron-core
``datasets/utils.py`` ``get_blend_from_list`` for ``dataset.data_path``, megatron-bridge
``training/utils/checkpoint_utils.py`` ``is_hf_checkpoint_dir``); nothing here imports megatron at module level.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import Finding

_DATA_SUFFIXES = (".bin", ".idx")  # megatron-core IndexedDataset: get_bin_path / get_idx_path append them
FROM_HF_FIX = "use --from-hf {path} (converts the Hugging Face weights and starts training from them)"


@dataclass(frozen=True)
class JobPath:
    """One path a config uses.

    Attributes:
        field: the ConfigContainer field that names it (``dataset.blend``, ``checkpoint.save`` ...).
        path: the path as written (absolute, relative to the ranks' working folder, or a URL).
        writes: True for folders the job writes (checkpoints, logs), False for what it reads.
        files: for a dataset prefix, the files megatron-core opens (``PREFIX.bin``, ``PREFIX.idx``); else ().
    """

    field: str
    path: str
    writes: bool = False
    files: tuple[str, ...] = ()

    @property
    def what(self) -> str:
        """Human name: ``dataset prefix '/data/web'``, ``checkpoint.load '/ckpt'``."""
        return f"{'dataset prefix' if self.files else self.field} '{self.path}'"


def _prefixes(blend) -> list[str]:
    """Prefixes of a megatron-core blend ``[[prefix, ...], weights or None]`` (None -> [])."""
    if not blend:
        return []
    return [str(p) for p in (blend[0] or [])]


def data_prefixes(cfg) -> list[tuple[str, str]]:
    """(field, prefix) for every dataset prefix of ``cfg`` (``blend``, each split of ``blend_per_split``,
    ``data_path`` read as megatron-bridge's ``GPTDatasetConfig.finalize`` reads it)."""
    dataset = getattr(cfg, "dataset", None)
    out = [("dataset.blend", p) for p in _prefixes(getattr(dataset, "blend", None))]
    for split in getattr(dataset, "blend_per_split", None) or []:
        out += [("dataset.blend_per_split", p) for p in _prefixes(split)]
    data_path = getattr(dataset, "data_path", None)
    if data_path and not getattr(dataset, "blend", None):
        from megatron.core.datasets.utils import get_blend_from_list

        paths = data_path.split() if isinstance(data_path, str) else list(data_path)
        out += [("dataset.data_path", p) for p in _prefixes(get_blend_from_list(paths))]
    return out


def real_data(cfg) -> bool:
    """True when ``cfg`` reads a dataset (any prefix set), False for megatron's mock data."""
    return bool(data_prefixes(cfg))


def data_text(cfg) -> str:
    """The summary's ``data`` line: the dataset prefixes and tokenizer ``cfg`` trains on, or mock data."""
    tok = getattr(cfg, "tokenizer", None)
    tokenizer = getattr(tok, "tokenizer_type", None) or "no tokenizer"
    if getattr(tok, "tokenizer_model", None):
        tokenizer += f" {tok.tokenizer_model}"
    prefixes = [p for _, p in data_prefixes(cfg)]
    if not prefixes:
        return f"mock (synthetic tokens; {tokenizer}): --data-path PREFIX --tokenizer NAME for real data"
    shown = ", ".join(prefixes[:3]) + (f" and {len(prefixes) - 3} more" if len(prefixes) > 3 else "")
    return f"{len(prefixes)} prefix(es): {shown}; tokenizer {tokenizer}"


def _path_like(name: str | None) -> bool:
    """A tokenizer name that is a file or folder rather than a Hugging Face hub id (``org/name``)."""
    return bool(name) and str(name).startswith(("/", "./", "../", "~"))


def job_paths(cfg) -> list[JobPath]:
    """Every path ``cfg`` reads or writes when it runs (see the module doc), in the order above."""
    out = [JobPath(field, prefix, files=tuple(prefix + s for s in _DATA_SUFFIXES)) for field, prefix in data_prefixes(cfg)]
    tok = getattr(cfg, "tokenizer", None)
    if _path_like(getattr(tok, "tokenizer_model", None)):
        out.append(JobPath("tokenizer.tokenizer_model", str(tok.tokenizer_model)))
    for name in ("vocab_file", "merge_file"):
        if getattr(tok, name, None):
            out.append(JobPath(f"tokenizer.{name}", str(getattr(tok, name))))
    ckpt = getattr(cfg, "checkpoint", None)
    for name in ("load", "pretrained_checkpoint"):
        # checkpoint.load = checkpoint.save is this run's own resume folder: the save entry below covers it
        if getattr(ckpt, name, None) and not (name == "load" and str(ckpt.load) == str(getattr(ckpt, "save", None))):
            out.append(JobPath(f"checkpoint.{name}", str(getattr(ckpt, name))))
    if getattr(ckpt, "save", None):
        out.append(JobPath("checkpoint.save", str(ckpt.save), writes=True))
    logger = getattr(cfg, "logger", None)
    for name in ("tensorboard_dir", "wandb_save_dir"):
        if getattr(logger, name, None):
            out.append(JobPath(f"logger.{name}", str(getattr(logger, name)), writes=True))
    return out


def is_url(path: str) -> bool:
    """An object-store URL (``msc://``, ``s3://`` ...): not a path on any node's filesystem."""
    return "://" in path


def path_findings(cfg) -> list:
    """Errors in the paths of ``cfg`` that no machine can fix (rules ``data/prefix-suffix``, ``data/tokenizer``,
    ``checkpoint/load-hf``).

    * A dataset prefix ending in ``.bin`` or ``.idx``: megatron-core appends both itself (``IndexedDataset``), so
      ``docs_text_document.bin`` would open ``docs_text_document.bin.bin``.
    * Real data with megatron's ``NullTokenizer``: its end-of-document id is ``vocab_size - 1``
      (megatron-core ``tokenizers/text/libraries/null_tokenizer.py``), not the one the data was tokenized with.
    * ``checkpoint.load`` naming a Hugging Face model folder (``config.json`` + weights, megatron-bridge's
      ``is_hf_checkpoint_dir``) on this machine: megatron-bridge 0.6.2 resumes only from its own checkpoints
      (``checkpointing.py``, ``_load_checkpoint_from_path`` raises ``ValueError`` at run time). On the cluster the
      entry script checks the same (:func:`lcmoe_recipes.jobs.node.problems_here`).

    Returns:
        list of :class:`lcmoe_recipes.checks.Finding` (errors).
    """
    findings = []
    for field, prefix in data_prefixes(cfg):
        if prefix.endswith(_DATA_SUFFIXES):
            stem = prefix[: -len(".bin")]
            findings.append(Finding(
                "error", "data/prefix-suffix", f"{field} prefix '{prefix}' ends in {prefix[-4:]}: megatron-core appends "
                f".bin and .idx to every prefix itself, so it would open '{prefix}.bin'",
                f"drop the suffix: --data-path {stem} (the prefix of {stem}.bin and {stem}.idx)"))
    tok = getattr(cfg, "tokenizer", None)
    if real_data(cfg) and getattr(tok, "tokenizer_type", None) == "NullTokenizer":
        findings.append(Finding(
            "error", "data/tokenizer", "the config reads real data (dataset prefixes are set) with megatron's "
            "NullTokenizer, whose end-of-document id is the last vocabulary id, not your tokenizer's",
            "give the tokenizer the .bin/.idx files were made with: --tokenizer NAME_OR_DIR (a Hugging Face name or "
            "folder), or set tokenizer.tokenizer_type and tokenizer.tokenizer_model"))
    load = getattr(getattr(cfg, "checkpoint", None), "load", None)
    if load and not is_url(str(load)) and is_hf_folder(str(load)):
        findings.append(load_hf_finding(str(load)))
    return findings


def is_hf_folder(path: str) -> bool:
    from megatron.bridge.training.utils.checkpoint_utils import is_hf_checkpoint_dir

    return is_hf_checkpoint_dir(path)


def load_hf_finding(path: str) -> Finding:
    return Finding("error", "checkpoint/load-hf", f"checkpoint.load '{path}' is a Hugging Face model folder "
                   "(config.json + weights); megatron-bridge 0.6.2 resumes only from its own checkpoints",
                   FROM_HF_FIX.format(path=path) + ", and keep checkpoint.load for resuming this run")


