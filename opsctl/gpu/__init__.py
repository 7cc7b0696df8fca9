"""What GPU tools print: `nvidia-smi --query-gpu ... --format=csv` (nvidia_smi), and the NVIDIA driver's XID
and SXid lines in the kernel log (kmsg)."""
