"""opsctl-lab: the whole opsctl stack on one machine with emulated H200 nodes.

Two tiers: the simulated cluster (`opsctl lab up`: real Slurm, node_exporter and Prometheus on
loopback, a dcgm-exporter emulator) and the lab machines (`opsctl lab machines up`: systemd-nspawn
machines for the provisioning playbooks). Not part of the product: the opsctl wheel that the opsctl
role installs on head nodes carries none of it.
"""
