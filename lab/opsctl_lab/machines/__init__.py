"""The lab machines tier: real Debian 12 machines (systemd-nspawn, real systemd and sshd) on a guarded
lab bridge, with emulated H200 GPUs and ConnectX-7 HCAs, for running the real playbooks over SSH.
See docs/lab-machines.md."""

from opsctl_lab.machines.lifecycle import clear, down, inject, reset, status, up

__all__ = ["clear", "down", "inject", "reset", "status", "up"]
