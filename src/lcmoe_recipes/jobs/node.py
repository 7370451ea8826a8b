"""What each rank of a job runs (:func:`run_rank`; the command line is ``python -m lcmoe_recipes.train``,
:mod:`lcmoe_recipes.cli.train`): the overlay put first on the import path (:func:`activate`), the refusals that need
no megatron (versions, world size, GPU: :func:`check_versions`, :func:`check_target`), the paths checked on this node
(:func:`problems_here`, :func:`weights_problems`), the weights converted once (:func:`prepare_weights`), then
megatron-bridge's ``pretrain``; or the CPU-only smoke check (:func:`smoke`), or one rank alone on this GPU
(:func:`as_rank`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from ..catalog import HARDWARE, get_hardware
from ..emit.paths import is_hf_folder, load_hf_finding, is_url, job_paths
from ..emit.stack import installed_stack
from ..errors import LcmoeError
from .overlay import ENV_VAR, MANIFEST

RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def detected_world_size() -> int | None:
    """World size from torchrun (``WORLD_SIZE``) or Slurm (``SLURM_NTASKS``), None when neither is set."""
    for var in ("WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def hardware_of_device(device_name: str | None) -> str | None:
    """Catalogue key of the GPU ``torch.cuda.get_device_properties(0).name`` reports (None: unknown or no GPU)."""
    if not device_name:
        return None
    return next((hw.key for hw in HARDWARE.values() if device_name.startswith(hw.device_name)), None)


def check_target(meta: dict, world_size: int | None, device_name: str | None) -> None:
    """Refuse a run whose world size or GPU differs from the one the YAML was planned for.

    Args:
        meta: the YAML's header (:func:`lcmoe_recipes.emit.target_meta`): ``world_size``, ``hardware``.
        world_size: ranks found (:func:`detected_world_size`); None skips that check.
        device_name: the local GPU's name; None (no GPU) skips that check.

    Raises:
        LcmoeError: with the planned and the found values, and the two ways out.
    """
    planned = meta.get("world_size")
    if planned is not None and world_size is not None and world_size != planned:
        raise LcmoeError(f"this job has {world_size} ranks but the config was planned and validated for {planned}",
                         f"launch {planned} ranks, or pass --replan to plan again for {world_size}")
    hardware = meta.get("hardware")
    if hardware and device_name is not None:
        expected = get_hardware(hardware).device_name
        if not device_name.startswith(expected):
            raise LcmoeError(f"this job runs on '{device_name}' but the config was planned for {hardware} ('{expected}')",
                             "run on the planned GPUs, or pass --replan to plan again for these")


def check_versions(meta: dict, installed: dict[str, str | None]) -> str | None:
    """Refuse to run a YAML built with other megatron-core / megatron-bridge versions than ``installed``.

    Config fields, their defaults and upstream validation change between versions (a field renamed or added, a
    default flipped), so a config validated with one version is not validated for another.

    Args:
        meta: the YAML's header (:func:`lcmoe_recipes.emit.target_meta`: ``megatron_core``, ``megatron_bridge``).
        installed: :func:`lcmoe_recipes.emit.stack.installed_stack` where the job runs.

    Returns:
        None when they match; a warning line when the header records no versions (a YAML written before they were
        recorded, or one without our header).

    Raises:
        LcmoeError: a version differs (or is not installed), naming both sides and the two ways out.
    """
    recorded = {key: meta.get(key) for key in installed}
    if not any(recorded.values()):
        return ("warning: this YAML's header does not record the megatron-core / megatron-bridge versions it was "
                "built with, so they are not compared with the installed ones")
    if recorded == installed:
        return None

    def names(versions: dict) -> str:
        return " and ".join(f"{key.replace('_', '-')} {versions.get(key) or '(not installed)'}" for key in installed)

    raise LcmoeError(f"this config was built and validated with {names(recorded)}, but this job runs {names(installed)}",
                     f"run it where {names(recorded)} are installed (e.g. the --container-image the config was built "
                     "for), or build the config again with the installed versions: python -m lcmoe_recipes.launch ... "
                     "--dry-run where the job runs")


def replan(meta: dict, world_size: int, hardware: str, overrides: list[str]):
    """Plan again for the world size and GPU type found (:func:`lcmoe_recipes.planner.resolve.resolve`: the named recipe for it, else
    the planner's best layout), then re-apply ``overrides``.

    Returns:
        (ConfigContainer, meta) for the new target.

    Raises:
        LcmoeError: the YAML's header lacks the model (written before re-planning existed), or no layout fits.
    """
    if not meta.get("model") or not meta.get("seq_length"):
        raise LcmoeError("this YAML's header does not name its model and seq_length, so it cannot be re-planned",
                         "write it again with the current `python -m lcmoe_recipes.launch ... --dry-run`")
    from .. import emit
    from ..core.request import TrainingRequest
    from ..planner.resolve import resolve

    best = resolve(TrainingRequest(model=meta["model"], seq_length=meta["seq_length"], hardware=hardware,
                                   num_gpus=world_size)).plan
    cfg = emit.config_from_plan(best, validate=False, quiet=True)
    emit.apply_overrides(cfg, overrides)
    return cfg, emit.target_meta(best, overrides)


def _require_gpu(device: str | None) -> None:
    if device is None:
        raise LcmoeError("no GPU on this rank: megatron-bridge's pretrain needs CUDA",
                         "run on GPU nodes (launch --executor slurm), or use --smoke for a CPU-only check")


def require_te(cfg) -> None:
    """Refuse a config that builds Transformer Engine layers (``model.transformer_impl="transformer_engine"``, every
    recipe's) on a node where TE cannot be imported: megatron-core would fail deep in the layer specs.

    Raises:
        LcmoeError: TE is absent here, with the ways to run (an image that has it, or TE installed).
    """
    from ..emit.stack import te_installed

    if getattr(cfg.model, "transformer_impl", None) == "transformer_engine" and not te_installed():
        raise LcmoeError("this config builds Transformer Engine layers (model.transformer_impl=transformer_engine), "
                         "but transformer_engine cannot be imported on this node",
                         "run in an image that has it (NVIDIA's NeMo containers do; launch --container-image), or "
                         "install it there (pip install --no-build-isolation transformer_engine[pytorch])")


def _rendezvous() -> dict[str, str]:
    missing = [var for var in RENDEZVOUS_VARS if var not in os.environ]
    if missing:
        raise LcmoeError(f"not started by torchrun: {', '.join(missing)} not set",
                         "start it through `python -m lcmoe_recipes.launch ... --executor local|slurm`, or torchrun")
    return {var: os.environ[var] for var in RENDEZVOUS_VARS}


def config_digest(cfg) -> str:
    """SHA-1 of the ConfigContainer's YAML (megatron-bridge's ``to_yaml``): equal on ranks that built the same config."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cfg.yaml"
        cfg.to_yaml(str(path))
        return hashlib.sha1(path.read_bytes()).hexdigest()


def _line(text: str) -> None:
    """One line in one write, so the ranks' lines never run together in a shared log."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def smoke(cfg, meta: dict, problems: list[str] = ()) -> int:
    """The CPU-only proof: gloo process group from torchrun's variables, one all-reduce, one all-gather of the config
    digest and of each rank's ``problems`` (paths missing on its node, :func:`lcmoe_recipes.jobs.node.problems_here`).

    Returns:
        0 when every rank answered correctly and found every path; 2 when a node lacks a path (rank 0 prints one
        ``error: on node N: ...`` line per node and problem); 1 when a collective gave a wrong answer.
    """
    import torch
    import torch.distributed as dist

    rdv = _rendezvous()
    digest = config_digest(cfg)
    if rdv["RANK"] == "0":
        world = int(rdv["WORLD_SIZE"])
        try:
            check_target(meta, world, None)
            verdict = "matches the plan"
        except LcmoeError as exc:
            verdict = f"a training run would be refused ({exc.message})"
        _line(f"smoke: {meta.get('recipe', 'config')} validated for {meta.get('world_size')} x {meta.get('hardware')}; "
              f"this job has {world} rank(s): {verdict}")
    dist.init_process_group(backend="gloo")  # env:// -- the variables above, as megatron-bridge's NCCL init uses
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)
        answers: list = [None] * world
        dist.all_gather_object(answers, (digest, os.uname().nodename, list(problems)))
        expected = world * (world + 1) / 2
        same = len({answer[0] for answer in answers}) == 1
        missing = sorted({(node, problem) for _, node, found in answers for problem in found})
        _line(f"smoke rank {rank}/{world} on {os.uname().nodename} (master {rdv['MASTER_ADDR']}:{rdv['MASTER_PORT']}): "
              f"all_reduce {total.item():g} (expected {expected:g}), config {digest[:12]} "
              f"{'identical on every rank' if same else 'DIFFERS between ranks'}")
        if total.item() != expected or not same:
            print(f"error: smoke check failed on rank {rank}", file=sys.stderr, flush=True)
        elif missing and rank == 0:
            lines = [f"error: on node {node}: {problem}" for node, problem in missing]
            nodes = sorted({node for node, _ in missing})
            print("\n".join(lines) + f"\n  fix: make these paths exist on {', '.join(nodes)} (a filesystem every node "
                  "mounts at the same path; in a container, --container-mounts)", file=sys.stderr, flush=True)
        dist.barrier()  # every line is out before any rank exits (torchrun stops the others when one fails)
    finally:
        dist.destroy_process_group()
    if total.item() != expected or not same:
        return 1
    return 2 if missing else 0


CONVERT_POLL_SECONDS = 15
CONVERT_TIMEOUT_SECONDS = float(os.environ.get("LCMOE_CONVERT_TIMEOUT", 6 * 3600))


def weights_problems(weights: dict, model: str) -> list[str]:
    """What is wrong on THIS node with the weights the YAML header says the run starts from (``launch --from-hf /
    --from-checkpoint``): the folder is missing, incomplete or holds another model. A ``convert_to`` folder not yet
    converted is fine (rank 0 converts it at the start)."""
    from ..catalog import get_model
    from ..checks.weights import CheckpointError, check_hf_folder, check_megatron_checkpoint

    spec = get_model(model)
    try:
        if weights.get("from_hf"):
            check_hf_folder(weights["from_hf"], spec)
        elif weights.get("from_checkpoint") and Path(weights["from_checkpoint"]).exists():
            check_megatron_checkpoint(weights["from_checkpoint"], spec)  # a previous phase's: absent until it ran
    except CheckpointError as exc:
        return [f"{exc.message} ({exc.fix})"]
    return []


def _converted(folder: str) -> bool:
    from ..checks.weights import CheckpointError, read_megatron_checkpoint

    try:
        read_megatron_checkpoint(folder)
    except CheckpointError:
        return False
    return True


def prepare_weights(weights: dict, model: str, rank0: bool) -> None:
    """``--from-hf DIR --convert-to OUT``: rank 0 converts DIR into OUT with megatron-bridge's converter
    (``python -m lcmoe_recipes.convert``, a process of its own, before torch.distributed starts) unless OUT already
    holds a complete conversion; the other ranks wait for OUT's tracker file (at most ``LCMOE_CONVERT_TIMEOUT``
    seconds, 6 h by default).

    Raises:
        LcmoeError: the conversion failed, or the wait timed out.
    """
    import subprocess
    import time

    out = weights.get("convert_to")
    if not out or _converted(out):
        return
    if rank0:
        _line(f"converting {weights['from_hf']} -> {out} (megatron-bridge AutoBridge; once, reused afterwards)")
        done = subprocess.run([sys.executable, "-m", "lcmoe_recipes.convert", "--hf", weights["from_hf"], "--out", out,
                               "--model", model])
        if done.returncode != 0:
            raise LcmoeError(f"converting {weights['from_hf']} into {out} failed (exit {done.returncode})",
                             "see the convert step's message above; or convert beforehand with python -m "
                             "lcmoe_recipes.convert and launch with --from-checkpoint")
        return
    deadline = time.monotonic() + CONVERT_TIMEOUT_SECONDS
    while not _converted(out):
        if time.monotonic() > deadline:
            raise LcmoeError(f"rank {os.environ.get('RANK')} waited {CONVERT_TIMEOUT_SECONDS:.0f} s for rank 0 to "
                             f"convert {weights['from_hf']} into {out}", "convert beforehand with python -m "
                             "lcmoe_recipes.convert, or raise LCMOE_CONVERT_TIMEOUT")
        time.sleep(CONVERT_POLL_SECONDS)


def as_rank(rank: int, config: str | None = None, recipe: str | None = None, *, steps: int = 3,
            out: str | Path = "out/as_rank", data_path=None, tokenizer: str | None = None,
            overrides: list[str] = ()) -> int:
    """``--as-rank R``: global rank ``rank`` of the job in ``config`` (a YAML ``launch`` wrote) or of the named
    ``recipe``, alone on this GPU for ``steps`` training steps (:mod:`lcmoe_recipes.emit.probe.rank_run`); its peak
    memory beside our prediction and a memory snapshot go under ``out``. Returns the exit code (0).

    Raises:
        LcmoeError: ``steps`` < 1, a YAML built with other megatron versions, a bad override.
    """
    from .. import emit
    from ..emit.probe import rank_run

    if steps < 1:
        raise LcmoeError(f"{steps} steps is not a positive number of steps", "e.g. 3 steps (--steps 3)")
    if config:
        meta = emit.read_meta(config)
        if note := check_versions(meta, installed_stack()):
            _line(note)
        cfg, meta = emit.read_yaml(config)
    else:
        from ..planner.recipes import recipe_plan

        plan = recipe_plan(recipe)
        meta = emit.target_meta(plan)
        cfg = emit.config_from_plan(plan, validate=False, quiet=True)
    emit.apply_overrides(cfg, emit.data_overrides(data_path, tokenizer) + list(overrides))
    run = rank_run.prepare(cfg, meta, rank, steps)
    for line in run.changes:
        _line(f"as-rank: {line}")
    _line(rank_run.table(rank_run.measure(run, Path(out))))
    return 0


def problems_here(cfg) -> list[str]:
    """What is missing or wrong on THIS node among the paths ``cfg`` reads (run by the entry script on every rank,
    and by ``--smoke``, which gathers every node's answer). Object-store URLs are not checked.

    * every dataset prefix: ``PREFIX.bin`` and ``PREFIX.idx`` exist;
    * the tokenizer file/folder (when a path) exists, and its vocabulary fits the model's (:func:`vocabulary_problems`);
    * ``checkpoint.pretrained_checkpoint`` exists and holds a Megatron checkpoint or a Hugging Face model
      (megatron-bridge's ``checkpoint_exists`` / ``is_hf_checkpoint_dir``; anything else is skipped by
      ``pretrain``, which would then start from random weights);
    * ``checkpoint.load`` is not a Hugging Face folder; when it differs from ``checkpoint.save`` it must hold a
      checkpoint (megatron-bridge only warns and starts from random weights). ``load == save`` is the resume
      pattern: absent on the first run, and fine.

    Returns:
        one sentence per problem, naming the field, the path and the fix ([] when all is there).
    """
    from megatron.bridge.training.utils.checkpoint_utils import checkpoint_exists, file_exists

    problems = []
    for item in job_paths(cfg):
        if item.writes or is_url(item.path):
            continue
        if item.files:
            missing = [f for f in item.files if not file_exists(f)]
            if missing:
                problems.append(f"{item.what}: {' and '.join(missing)} not found (give the prefix of an existing "
                                ".bin/.idx pair)")
        elif item.field.startswith("tokenizer.") and not file_exists(item.path):
            problems.append(f"{item.what} not found (copy the tokenizer there, or give a Hugging Face name)")
    problems += vocabulary_problems(cfg)
    ckpt = cfg.checkpoint
    if ckpt.pretrained_checkpoint and not is_url(str(ckpt.pretrained_checkpoint)):
        path = str(ckpt.pretrained_checkpoint)
        if not file_exists(path):
            problems.append(f"checkpoint.pretrained_checkpoint '{path}' not found (the weights training starts from)")
        elif not (checkpoint_exists(path) or is_hf_folder(path)):
            problems.append(f"checkpoint.pretrained_checkpoint '{path}' holds no Megatron checkpoint (no "
                            "latest_train_state.pt, latest_checkpointed_iteration.txt or iteration-folder markers) "
                            "and no Hugging Face model; pretrain would start from random weights")
    if ckpt.load and not is_url(str(ckpt.load)):
        path = str(ckpt.load)
        if file_exists(path) and is_hf_folder(path):
            finding = load_hf_finding(path)
            problems.append(f"{finding.message}: {finding.fix}")
        elif path != str(ckpt.save or "") and not checkpoint_exists(path):
            problems.append(f"checkpoint.load '{path}' holds no checkpoint (megatron-bridge would warn and start "
                            "from random weights): fix the path, or set checkpoint.load to checkpoint.save to resume "
                            "a run when a checkpoint exists")
    return problems


def vocabulary_problems(cfg) -> list[str]:
    """Whether the tokenizer of ``cfg`` (a local Hugging Face folder or file; a hub name is not loaded here) fits the
    model and the data, judged as the run would: the tokenizer built by megatron-bridge's own ``build_tokenizer``, its
    ``vocab_size`` against the model's by megatron-bridge 0.6.2's ``training/setup.py``
    ``_validate_and_set_vocab_size`` (which refuses a model vocabulary smaller than the tokenizer's at start-up, and
    with ``use_tokenizer_vocab_size`` resizes the model to the tokenizer: pretrained weights of another size then do not
    load); and every dataset ``.idx`` read with megatron-core 0.19.2's own ``_IndexReader``: token ids stored as uint16
    (megatron-core's ``DType.optimal_dtype`` picks it for vocabularies under 65,500) cannot come from a tokenizer of
    65,500 tokens or more, so the data was tokenized with another tokenizer.

    Returns:
        one sentence per problem, naming the tokenizer, the sizes and the fix ([] when it fits, or nothing to load).
    """
    tok = cfg.tokenizer
    path = getattr(tok, "tokenizer_model", None)
    if tok.tokenizer_type != "HuggingFaceTokenizer" or not path or is_url(str(path)) or not Path(str(path)).exists():
        return []  # NullTokenizer (mock data; the start gate refuses it with real data), a hub name, or reported missing
    from megatron.bridge.training.setup import _validate_and_set_vocab_size
    from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

    try:
        size = int(build_tokenizer(tok).vocab_size)
    except Exception as exc:  # noqa: BLE001 -- any failure to load is the problem to report, on this node
        return [f"tokenizer.tokenizer_model '{path}' does not load as a Hugging Face tokenizer "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): give the model's own "
                "tokenizer folder (the Hugging Face folder of the weights holds it)"]
    problems = []
    model_vocab = cfg.model.vocab_size
    use_tokenizer = bool(getattr(tok, "use_tokenizer_vocab_size", False))
    try:
        _validate_and_set_vocab_size(model_vocab, size, use_tokenizer_vocab_size=use_tokenizer)
    except ValueError as exc:
        problems.append(f"tokenizer '{path}' has {size:,} tokens but the model's vocabulary is {model_vocab:,} "
                        f"(megatron-bridge: {exc}): give the model's own tokenizer")
    if use_tokenizer and model_vocab and size != model_vocab and cfg.checkpoint.pretrained_checkpoint:
        problems.append(f"tokenizer.use_tokenizer_vocab_size=true resizes the model's embedding from {model_vocab:,} to "
                        f"the tokenizer's {size:,} rows, and the pretrained weights "
                        f"'{cfg.checkpoint.pretrained_checkpoint}' hold {model_vocab:,}: set "
                        "tokenizer.use_tokenizer_vocab_size=false, or give the model's own tokenizer")
    if size >= 65500:
        import numpy
        from megatron.core.datasets.indexed_dataset import _IndexReader

        for item in job_paths(cfg):
            index = next((f for f in item.files if f.endswith(".idx")), None) if item.files else None
            if index is None or not Path(index).is_file():
                continue
            try:
                dtype = _IndexReader(index, multimodal=False).dtype
            except Exception:  # noqa: BLE001 -- not an index megatron-core reads: megatron reports it at start-up
                continue
            if dtype == numpy.uint16:
                problems.append(f"{index} stores token ids as uint16 (megatron-core writes uint16 only for "
                                f"vocabularies under 65,500), but the tokenizer '{path}' has {size:,} tokens: the data "
                                "was tokenized with another tokenizer; tokenize it again with this one "
                                "(Megatron-LM's preprocess_data script, --tokenizer-model)")
    return problems


def activate(environ=os.environ) -> str | None:
    """Put the overlay named by ``$LCMOE_OVERLAY`` first on the import path (and on ``PYTHONPATH`` for child
    processes), after checking that this interpreter is the one its wheels were built for; the entry script calls it
    before its version check. Returns the folder, or None without an overlay.

    Raises:
        LcmoeError: the folder or its manifest is missing, the Python differs, or megatron-core / megatron-bridge
            still import from elsewhere (an image whose ``megatron`` is a regular package shadows the overlay's).
    """
    folder = environ.get(ENV_VAR)
    if not folder:
        return None
    manifest_path = Path(folder) / MANIFEST
    if not manifest_path.is_file():
        raise LcmoeError(f"${ENV_VAR}={folder} holds no overlay ({MANIFEST} missing)",
                         "the job folder must be on storage every node sees, and mounted into the container")
    manifest = json.loads(manifest_path.read_text())
    here = "%d.%d" % sys.version_info[:2]
    if manifest["python"] != here:
        raise LcmoeError(f"the overlay in {folder} was built for Python {manifest['python']}, this job runs {here}",
                         f"use an image with Python {manifest['python']}")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    previous = environ.get("PYTHONPATH")
    environ["PYTHONPATH"] = folder + (os.pathsep + previous if previous else "")
    import importlib.util

    for module in ("megatron.core", "megatron.bridge"):
        spec = importlib.util.find_spec(module)
        origin = (spec.origin or "") if spec else ""
        if not origin.startswith(folder.rstrip("/") + "/"):
            raise LcmoeError(f"{module} imports from {origin or '(nowhere)'}, not from the overlay in {folder}: "
                             "the image's 'megatron' is a regular package on its import path, which wins over the "
                             "overlay's namespace package", "use an image whose megatron-core is installed as a "
                             "distribution (every listed NeMo image), or remove that folder from PYTHONPATH")
    return folder


def run_rank(config: str | None = None, recipe: str | None = None, *, data_path=None, tokenizer: str | None = None,
             save_dir: str | None = None, replan_here: bool = False, smoke_only: bool = False,
             metrics: str | None = None, overrides: list[str] = ()) -> int:
    """What every rank of a job runs: the overlay first on the import path, the cheap refusals (the versions the YAML
    was built with, torchrun's variables, the GPU) before megatron-bridge loads, then the config rebuilt from
    ``config`` (or the named ``recipe``) with the run's folders, data and ``overrides``, validated for its target,
    the paths checked on this node, and megatron-bridge's ``pretrain`` -- or, with ``smoke_only``, the CPU-only
    smoke check (:func:`smoke`). ``replan_here``: plan again for the world size and GPU found instead of refusing.
    ``metrics``: a JSON file of each step's loss, time and peak memory (rank 0; :mod:`lcmoe_recipes.jobs.metrics`).

    Returns:
        the exit code: 0 done; 2 a node lacks a path (smoke); 1 a smoke collective gave a wrong answer.

    Raises:
        LcmoeError: refused (versions, world size, GPU, bad config or input, a path missing on this node).
    """
    rank0 = os.environ.get("RANK", "0") == "0"
    if (folder := activate()) and rank0:  # the pinned wheels first on the import path, before any import
        _line(f"overlay {folder}: megatron-core and megatron-bridge import from it")
    from .. import emit

    # The cheap refusals first, before megatron-bridge loads (15-40 s) and before torch.distributed or any GPU
    # work: the YAML's header (the versions it was built with), torchrun, the GPU.
    if config:
        meta = emit.read_meta(config)
    else:
        from ..planner.recipes import recipe_plan

        plan = recipe_plan(recipe)
        meta = emit.target_meta(plan)
    if (note := check_versions(meta, installed_stack())) and rank0:
        _line(note)
    world = detected_world_size()
    device = None
    if smoke_only:
        _rendezvous()
    else:
        import torch

        device = torch.cuda.get_device_properties(0).name if torch.cuda.is_available() else None
        if not replan_here:
            check_target(meta, world, device)
            _require_gpu(device)

    extra = emit.save_overrides(save_dir) + emit.data_overrides(data_path, tokenizer) + list(overrides)
    if config:
        cfg, meta = emit.read_yaml(config)
    else:
        cfg = emit.config_from_plan(plan, validate=False, quiet=True)
    emit.apply_overrides(cfg, extra)
    weights = meta.get("weights") or {}
    paths_cfg = cfg
    if weights.get("convert_to") and not _converted(weights["convert_to"]):  # converted at the start: check DIR
        paths_cfg = copy.deepcopy(cfg)
        paths_cfg.checkpoint.pretrained_checkpoint = None
    if smoke_only:
        emit.validate_config(cfg, meta.get("hardware", "h100"), meta.get("world_size") or world or 1,
                             meta.get("recipe", "config"))
        return smoke(cfg, meta, problems_here(paths_cfg) + weights_problems(weights, meta.get("model", "")))

    if replan_here and world is not None:
        found_hw = hardware_of_device(device) or meta.get("hardware")
        if (world, found_hw) != (meta.get("world_size"), meta.get("hardware")):
            cfg, meta = replan(meta, world, found_hw, list(meta.get("overrides", [])) + extra)
            if rank0:
                _line(f"re-planned {meta['model']} seq_length {meta['seq_length']} for {world} x {found_hw}")
    check_target(meta, world, device)
    _require_gpu(device)
    require_te(cfg)
    emit.validate_config(cfg, meta.get("hardware", "h100"), world or meta.get("world_size", 1),
                         meta.get("recipe", "config"))
    if problems := problems_here(paths_cfg) + weights_problems(weights, meta.get("model", "")):
        raise LcmoeError(f"on node {os.uname().nodename}: " + "; ".join(problems),
                         "make the paths exist on every node (a shared filesystem; in a container, "
                         "--container-mounts), or check the job first with --smoke")
    prepare_weights(weights, meta.get("model", ""), rank0)
    from .resilience import missing_package, needs_package

    if (parts := needs_package(cfg)) and (missing := missing_package()):
        raise LcmoeError(f"the config turns on {', '.join(parts)}, but {missing}",
                         "run an image that has it (NVIDIA's NeMo images do), install it there, or launch with "
                         "--no-resiliency")
    from .resume import pin_resume

    pin_resume(cfg, log=_line if rank0 else (lambda _text: None))  # the newest complete checkpoint, or refused
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain

    from ..emit.stack import use_prebuilt_dataset_helpers

    if (line := use_prebuilt_dataset_helpers()) and rank0:
        _line(line)
    callbacks = None
    if metrics:
        from .metrics import metrics_callback

        callbacks = [metrics_callback(metrics)]
    pretrain(cfg, forward_step, callbacks=callbacks)
    return 0
