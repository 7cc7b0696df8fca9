"""What GPU tools print: the parser of `nvidia-smi --query-gpu ... --format=csv`."""
