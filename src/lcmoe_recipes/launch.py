"""``python -m lcmoe_recipes.launch``: the main job's command (:mod:`lcmoe_recipes.cli.launch`), and its Python API.

* :func:`submit` -- validate any ConfigContainer (or a YAML ``launch`` wrote) for its target and run it: torchrun here,
  a Slurm job or a Kubeflow Trainer job through NeMo-Run (:mod:`lcmoe_recipes.jobs.submit`);
* :class:`SlurmSettings`, :class:`KubeflowSettings` -- where and how such a job runs;
* :class:`LaunchResult` -- what a launch did (state, job id, log, first error).
"""

from .jobs.executors.common import LaunchResult
from .jobs.executors.kubeflow import KubeflowSettings
from .jobs.executors.slurm import SlurmSettings
from .jobs.submit import submit

__all__ = ["submit", "SlurmSettings", "KubeflowSettings", "LaunchResult"]

if __name__ == "__main__":
    import sys

    from .cli.launch import main

    sys.exit(main())
