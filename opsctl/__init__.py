"""opsctl: provision and keep healthy NVIDIA H200 GPU clusters."""

__version__ = "0.1.0"
