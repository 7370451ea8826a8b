"""Executors: where a config runs -- torchrun on this node (:mod:`.local`), a Slurm batch job through NeMo-Run's
``SlurmExecutor`` (:mod:`.slurm`), a Kubeflow Trainer ``TrainJob`` through NeMo-Run's ``KubeflowExecutor``
(:mod:`.kubeflow`) -- and what they share (:mod:`.common`: the result of a launch, nodes per job, the ranks' command
line, the first error line of a log)."""
