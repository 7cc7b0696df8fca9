"""The vendors' APT repositories in their real shape, for the lab machines: NVIDIA's CUDA and DOCA
repositories, Whamcloud's Lustre client, Grafana's repository and a SchedMD-built Slurm. Every package
carries its vendor's real name, version scheme and relations (data/<repository>.yml, each field with
its source); its maintainer scripts install the lab's emulated tools instead of binaries and behave
like the real ones where provisioning depends on it (behaviours.py). The repositories are indexed and
signed with a key of the lab's (build.py) and cached like the machine image; the machines tier serves them
on the lab's bridge (opsctl_lab.machines.vendor_server)."""
