"""Jobs: a request becomes checked, written configs (:mod:`.prepare`), and a config becomes a running job
(:mod:`.submit`) through an executor (:mod:`.executors`: torchrun here, Slurm or Kubeflow Trainer through NeMo-Run), with
the job's own checks (:mod:`.job_checks`), the overlay of the pinned megatron for an older image (:mod:`.overlay`), and
what each rank runs (:mod:`.node`). The command line is ``python -m lcmoe_recipes.launch`` (:mod:`lcmoe_recipes.cli.launch`);
nemo_run, torch and megatron are imported inside functions only."""
