"""The job as Slurm sees it: ``job`` resolves ``job.slurm`` to machines and state (squeue /
scontrol, every answer checked), ``hooks`` the built-in drain / resume / requeue hooks."""
