"""Emulated hardware tools of a lab machine: nvidia-smi, dcgmi, ibstat, ibv_devinfo, ib_write_bw and the
`opsctl-hw` admin tool. They speak the real tools' formats and render from the machine's one
hardware state file, so they agree with each other and with the dcgm-exporter emulator."""
