"""Kubernetes through NeMo-Run's own ``KubeflowExecutor``: the Kubeflow Trainer ``TrainJob`` NeMo-Run would submit.

NeMo-Run 0.11.1 (``core/execution/kubeflow.py``) writes a ``trainer.kubeflow.org/v1alpha1`` TrainJob for a
``ClusterTrainingRuntime`` (``torch-distributed``: the runtime starts one pod per node and sets torchrun's ``PET_*``
variables), with pod-level settings in ``spec.podTemplateOverrides``: the TrainJob API of Kubeflow Trainer
:data:`TRAINER_VERSION`. Trainer 2.2.0 replaced ``podTemplateOverrides`` by ``runtimePatches``, so on a cluster with a
newer Trainer the pod overrides (the shared volume, the topology hints) are not accepted (docs/launch.md).

What a job gets, the same as a Slurm job's (:mod:`lcmoe_recipes.jobs.executors.slurm`):

* nodes = planned GPUs / GPUs per node (the hardware catalogue), ``numProcPerNode`` = GPUs per node, one
  ``nvidia.com/gpu`` request per GPU, the image, the recipe's ``env_vars`` (the NVLink-domain variables included);
* the code: this package, the YAML (and an overlay of the pinned megatron wheels where the image needs one:
  :mod:`lcmoe_recipes.jobs.overlay`) staged into NeMo-Run's job folder, which NeMo-Run copies to the shared volume
  (``workdir_pvc``) before the job starts; ranks find them through ``/nemo_run``, which NeMo-Run's launch script links
  to that folder;
* one shared volume (a PersistentVolumeClaim) mounted in every pod: checkpoints and logs must be written inside it
  (:func:`pod_path_findings`), as a Slurm job's must be inside a container mount;
* on NVL72 systems, a pod affinity on the ``nvidia.com/gpu.clique`` node label (the NVLink partition a node belongs
  to, set by NVIDIA's GPU DRA driver: NVIDIA Topograph docs, DRA provider): required for a job inside one NVLink
  block (:attr:`lcmoe_recipes.catalog.Hardware.job_block`), preferred above it -- a hint; a topology-aware scheduler
  (KAI, Kueue) places multi-block jobs by block, as Slurm's ``--segment`` does;
* with a time limit (``time``, the cluster's or the queue's: Kubernetes sets none), the same exit before it
  (:data:`lcmoe_recipes.jobs.job_checks.FINAL_SAVE_MARGIN_MIN`).

No Kubernetes cluster is contacted for a dry run: NeMo-Run's executor loads a kube config when it is built, so a dry
run without one gets a config that names no cluster (:func:`_kubeconfig`). ``kubernetes`` (the Python client) is
needed, as NeMo-Run's executor imports it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ...catalog import get_hardware
from ...checks import Finding
from ...emit.paths import is_url, job_paths
from ...errors import LcmoeError
from .common import LaunchResult, PACKAGE_DIR, QUIET_ENV, _nemo_run_session, nodes_for

TRAINER_VERSION = "v2.1.0"
"""The Kubeflow Trainer release whose TrainJob schema NeMo-Run 0.11.1's KubeflowExecutor writes (its
``spec.podTemplateOverrides`` exists in v2.1.x only: v2.0 had ``podSpecOverrides``, v2.2.0 ``runtimePatches``)."""
CODE_DIR = "/nemo_run"   # NeMo-Run's launch script links this to the job's folder on the shared volume
CLIQUE_LABEL = "nvidia.com/gpu.clique"
JOB_LABEL = "lcmoe-recipes/job"
VOLUME = "lcmoe-shared"


@dataclass(frozen=True)
class KubeflowSettings:
    """Where and how a Kubernetes job runs (everything the recipe does not decide).

    Attributes:
        image: the container image (e.g. ``nvcr.io/nvidia/nemo:26.06``; an overlay is added where its megatron
            versions differ from the pinned ones).
        pvc: the PersistentVolumeClaim every pod mounts (ReadWriteMany): code, checkpoints, logs.
        mount: where the pods mount it; checkpoints and logs must be written under it.
        namespace: the Kubernetes namespace.
        runtime: the ``ClusterTrainingRuntime`` (Kubeflow Trainer's ``torch-distributed`` by default).
        time: the job's time limit, ``HH:MM:SS`` or ``D-HH:MM:SS`` (:func:`lcmoe_recipes.jobs.job_checks.slurm_minutes`),
            or None where the cluster sets none: training then stops 20 minutes before it and saves.
        env: extra environment variables; they win over the recipe's ``env_vars``.
        kubeconfig: the kube config file (default: ``$KUBECONFIG`` or ``~/.kube/config``).
        overlay: add an overlay of the pinned megatron wheels where the image needs one.
    """

    image: str
    pvc: str
    mount: str = "/shared"
    namespace: str = "default"
    runtime: str = "torch-distributed"
    time: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    kubeconfig: str | None = None
    overlay: bool = True


def check_kubeflow_settings(settings: KubeflowSettings) -> None:
    """Refuse settings Kubernetes would refuse or the job could not use.

    Raises:
        LcmoeError: no image, no volume, a relative mount, a time limit without its hours.
    """
    from ..job_checks import slurm_minutes

    if not settings.image:
        raise LcmoeError("a Kubernetes job needs its image", "e.g. --container-image nvcr.io/nvidia/nemo:26.06")
    if not settings.pvc:
        raise LcmoeError("a Kubernetes job needs a shared volume for its code and checkpoints",
                         "give the PersistentVolumeClaim every pod mounts, e.g. --pvc lcmoe-shared")
    if not settings.mount.startswith("/") or settings.mount.rstrip("/") == CODE_DIR:
        raise LcmoeError(f"`mount` {settings.mount!r} is not an absolute folder of the pods (or is {CODE_DIR}, "
                         "NeMo-Run's link to the job's code)", "e.g. mount=/shared", fields=("mount",))
    if settings.time:
        slurm_minutes(settings.time)


def _under(path: str, folder: str) -> bool:
    folder = folder.rstrip("/")
    return path == folder or path.startswith(folder + "/")


def pod_path_findings(cfg, settings: KubeflowSettings) -> list[Finding]:
    """The paths the config uses against the pods' shared volume: a path the job writes outside it is refused (it
    would be written into the pod, lost with it); a relative path it reads is refused (the pods start in the
    image's working folder); a path it reads outside the volume is warned about (it may be inside the image)."""
    out = []
    fix = f"put it under the shared volume's mount {settings.mount}, e.g. --save-dir {settings.mount.rstrip('/')}/RUN"
    for item in job_paths(cfg):
        if is_url(item.path) or _under(item.path, settings.mount):
            continue
        if item.writes:
            out.append(Finding("error", "kube/unshared-write", f"{item.what} is not on the shared volume "
                               f"{settings.pvc} (mounted at {settings.mount}): each pod would write it into its own "
                               "filesystem, lost when the pod ends", fix))
        elif not item.path.startswith("/"):
            out.append(Finding("error", "kube/relative-read", f"{item.what} is relative: the pods start in the "
                               "image's working folder, where it does not exist", fix.replace("--save-dir", "a path")))
        else:
            out.append(Finding("warning", "kube/unshared-read", f"{item.what} is not on the shared volume "
                               f"({settings.mount}): it must be inside the image {settings.image}",
                               f"if it is on the shared volume, give its path under {settings.mount}"))
    return out


def topology(hw, nodes: int, label_value: str) -> dict:
    """The pod affinity that keeps the job's pods in one NVLink partition (:data:`CLIQUE_LABEL`) on NVL72 systems:
    required for a job inside one job block, preferred (weight 100) above it; {} where the NVLink domain is the node
    (HGX: nothing to keep together)."""
    if hw.nvlink_domain <= hw.gpus_per_node or nodes <= 1:
        return {}
    term = {"labelSelector": {"matchLabels": {JOB_LABEL: label_value}}, "topologyKey": CLIQUE_LABEL}
    if nodes * hw.gpus_per_node <= hw.job_block:
        return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": term}]}}


@contextlib.contextmanager
def _kubeconfig(settings: KubeflowSettings, dry_run: bool):
    """The kube config NeMo-Run's executor loads when it is built: the settings' file, else the user's
    (``$KUBECONFIG``, ``~/.kube/config``); for a dry run with none, one whose only cluster is
    ``https://kubernetes.invalid`` (nothing is contacted). The Python client reads ``$KUBECONFIG`` once, when it is
    imported (``kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION``): both are set for the duration."""
    from kubernetes.config import kube_config

    saved, saved_default = os.environ.get("KUBECONFIG"), kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    path = settings.kubeconfig or saved or str(Path.home() / ".kube" / "config")
    with tempfile.TemporaryDirectory() as tmp:
        if not Path(path).is_file():
            if not dry_run:
                raise LcmoeError(f"no kube config at {path}: a Kubernetes job is submitted with your cluster's "
                                 "credentials", "give --kubeconfig FILE, or set KUBECONFIG")
            path = os.path.join(tmp, "kubeconfig")
            Path(path).write_text("apiVersion: v1\nkind: Config\nclusters:\n- {name: none, cluster: {server: "
                                  "'https://kubernetes.invalid'}}\ncontexts:\n- {name: none, context: {cluster: none, "
                                  "user: none}}\ncurrent-context: none\nusers:\n- {name: none, user: {}}\n")
        os.environ["KUBECONFIG"] = kube_config.KUBE_CONFIG_DEFAULT_LOCATION = path
        try:
            yield
        finally:
            kube_config.KUBE_CONFIG_DEFAULT_LOCATION = saved_default
            if saved is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = saved


@dataclass
class KubeflowJob:
    """What a Kubernetes launch built: the TrainJob ``manifest``, the ``launch_script`` NeMo-Run runs in each pod,
    the ``staged`` files that go to the shared volume (name -> size in bytes), and ``notes``."""

    manifest: dict
    launch_script: str
    staged: dict[str, int]
    notes: list[str]

    def manifest_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.manifest, sort_keys=False)


def _stage(yaml: Path, folder: Path, overlay_folder: Path | None) -> dict[str, int]:
    """Copy this package, the YAML (and the overlay) into ``folder``: what NeMo-Run syncs to the shared volume."""
    shutil.copytree(PACKAGE_DIR, folder / PACKAGE_DIR.name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(yaml, folder / yaml.name)
    if overlay_folder is not None:
        shutil.copytree(overlay_folder, folder / "lcmoe-overlay" / overlay_folder.name)
    return {p.name: sum(f.stat().st_size for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())
            for p in sorted(folder.iterdir())}


def run_kubeflow(yaml: Path, meta: dict, env_vars: dict[str, str], settings: KubeflowSettings, *,
                 smoke: bool = False, smoke_ranks: int = 2, dry_run: bool = True, train_args: list[str] = (),
                 notes: list[str] = ()) -> tuple[LaunchResult, KubeflowJob]:
    """Build the TrainJob NeMo-Run's ``KubeflowExecutor`` submits for the YAML's target, through NeMo-Run's own
    dry run (its scheduler's ``_submit_dryrun``); without ``dry_run``, submit it (NeMo-Run copies the staged code to
    the volume with a data-mover pod, then creates the TrainJob).

    Args:
        train_args: options of the entry script after ``--config`` (see :func:`lcmoe_recipes.jobs.executors.slurm.
            train_arguments`), the exit-duration override included where :func:`kube_job_overrides` gives one.

    Raises:
        LcmoeError: bad settings, a GPU count that does not fill whole nodes, an image that cannot take an overlay,
            no kube config for a real submission.
    """
    import nemo_run as run
    from nemo_run.core.execution.kubeflow import KubeflowExecutor

    check_kubeflow_settings(settings)
    hw = get_hardware(meta.get("hardware", "h100"))
    gpn = hw.gpus_per_node
    nodes = 1 if smoke else nodes_for(meta.get("world_size") or gpn, gpn)
    notes = list(notes)
    label = f"{meta.get('recipe', 'config')}-{hashlib.sha1(Path(yaml).read_bytes()).hexdigest()[:8]}"[:63]
    env = {**QUIET_ENV, **{k: str(v) for k, v in env_vars.items()}, **settings.env, "PYTHONPATH": CODE_DIR}
    overlay_folder = None
    step = _overlay(settings, hw, dry_run)
    if step is not None:
        plan, overlay_folder, size = step
        env["LCMOE_OVERLAY"] = f"{CODE_DIR}/lcmoe-overlay/{plan.key}"
        notes.append(f"overlay: {plan.stack.where} holds megatron-core {plan.stack.versions.get('megatron-core')} / "
                     f"megatron-bridge {plan.stack.versions.get('megatron-bridge')}; "
                     + ("built on this machine and staged" if overlay_folder else "to be built on this machine and "
                        "staged") + f" with the code ({size / 2**20:.0f} MiB: {plan.summary()}), first on the "
                     "job's import path ($LCMOE_OVERLAY)")
    pod_labels = {JOB_LABEL: label}
    affinity = {} if smoke else topology(hw, nodes, label)
    with tempfile.TemporaryDirectory() as tmp, _kubeconfig(settings, dry_run), _nemo_run_session():
        staging = Path(tmp) / "stage"
        staging.mkdir()
        staged = _stage(Path(yaml), staging, overlay_folder)
        executor = KubeflowExecutor(
            image=settings.image, namespace=settings.namespace, runtime_ref=settings.runtime, num_nodes=nodes,
            gpus_per_node=None if smoke else gpn, nprocs_per_node=smoke_ranks if smoke else gpn,
            env_vars={k: shlex.quote(v) for k, v in env.items()}, launcher="torchrun",
            volumes=[{"name": VOLUME, "persistentVolumeClaim": {"claimName": settings.pvc}}],
            volume_mounts=[{"name": VOLUME, "mountPath": settings.mount}], workdir_pvc=settings.pvc,
            workdir_pvc_path=settings.mount, workdir_local_path=str(staging), pod_labels=pod_labels,
            affinity=affinity, train_job_basename=f"lcmoe-{meta.get('recipe', 'config')}")
        args = ["--config", f"{CODE_DIR}/{Path(yaml).name}", *train_args]
        task = run.Script(path="lcmoe_recipes.train", args=args, entrypoint="python", m=True)
        name = "smoke" if smoke else "train"
        with run.Experiment(f"lcmoe-{meta.get('recipe', 'config')}", executor=executor, log_level="ERROR") as exp:
            exp.add(task, name=name)
            if dry_run:
                exp.dryrun(log=False)
                request = exp.jobs[0]._dryrun_info.request
                assigned = request.executor  # the experiment's copy, bound to its job (code folder on the volume)
                role = request.app.roles[0]
                macros = assigned.macro_values()
                role = macros.apply(role) if macros else role
                script_dir = Path(tmp) / "script"
                assigned.job_dir = str(script_dir)  # the dry run removed the experiment's folder
                assigned.materialize_launch_script([role.entrypoint, *role.args])
                job = KubeflowJob(assigned.get_job_body(assigned._trainjob_name(request.name), request.cmd),
                                  (script_dir / "launch.sh").read_text(), staged, notes)
                return LaunchResult("kubeflow", "DRY_RUN", " ".join(request.cmd), Path(yaml),
                                    script=job.manifest_yaml(), notes=notes), job
            exp.run(detach=True)
            exp_id = exp._id
    return LaunchResult("kubeflow", "SUBMITTED", "TrainJob", Path(yaml), experiment_id=exp_id, notes=notes), None


def _overlay(settings: KubeflowSettings, hw, dry_run: bool):
    """(plan, built folder or None, bytes) of the overlay the image needs, or None (see :mod:`lcmoe_recipes.jobs.overlay`)."""
    from .. import overlay as ov

    plan = ov.image_overlay(settings.image, hw.cpu_arch) if settings.overlay else None
    if plan is None:
        return None
    if dry_run:
        return plan, None, plan.estimated_bytes()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lcmoe_recipes" / "overlays"
    built = ov.install(plan, cache)
    return plan, built.path, built.bytes


def kube_job_overrides(cfg, settings: KubeflowSettings, smoke: bool = False):
    """The Kubernetes job's checks and overrides for the config the pods run: (overrides, findings, notes) --
    ``train.exit_duration_in_mins`` from ``time`` (as :func:`lcmoe_recipes.jobs.job_checks.slurm_job` sets it), the
    paths against the shared volume (:func:`pod_path_findings`).

    Raises:
        InfeasibleConfig: a path the job writes outside the shared volume, or a relative path it reads.
    """
    from ...checks import raise_for_errors
    from ..job_checks import FINAL_SAVE_MARGIN_MIN, exit_duration, slurm_minutes

    findings = pod_path_findings(cfg, settings)
    raise_for_errors(findings, "the Kubernetes job")
    notes = [f"shared volume {settings.pvc} at {settings.mount}: code (NeMo-Run copies it there before the job), "
             "checkpoints and logs"]
    if smoke or not settings.time:
        if not smoke:
            notes.append("no time limit given: training runs to its last step (give the cluster's limit to stop "
                         f"{FINAL_SAVE_MARGIN_MIN} min before it with a saved checkpoint)")
        return [], findings, notes
    minutes = exit_duration(slurm_minutes(settings.time))
    if minutes is None:
        return [], findings, notes + [f"time {settings.time} leaves no room for the {FINAL_SAVE_MARGIN_MIN}-minute "
                                      "final save: training runs until the limit stops it"]
    return ([f"train.exit_duration_in_mins={minutes}"], findings,
            notes + [f"train.exit_duration_in_mins={minutes}: megatron-bridge ends training and saves "
                     f"{FINAL_SAVE_MARGIN_MIN} min before the {settings.time} limit"])
