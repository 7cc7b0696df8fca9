"""slurm."""
