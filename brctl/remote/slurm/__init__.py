"""The Slurm transport: ``transport`` fans out with one srun per command, ``frame`` the framing
that keeps each task's output its own."""
