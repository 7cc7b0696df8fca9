"""Active validation: checks that move data and load the GPUs, run as Slurm jobs (docs/validate.md)."""
