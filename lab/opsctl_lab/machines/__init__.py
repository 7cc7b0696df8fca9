"""The lab machines tier: real Debian 12 machines (systemd-nspawn, real systemd and sshd) on a guarded
lab bridge, with emulated H200 GPUs and ConnectX-7 HCAs, for running the real playbooks over SSH.
See docs/lab-machines.md; `opsctl lab machines ...` is lifecycle.py.

Nothing is imported here: the machines' own programs (`opsctl-hw boot`, in a machine) import modules of this
package from the copy of the code in the machine, whose python3 has none of the host's libraries."""
