"""The lab's RebootProgram (opsctl_lab.slurm_reboot) as written for each cluster, and what a reboot does to a
node's emulated hardware. The component and lab tiers run it under Slurm 22.05, 24.11 and 26.05."""

import stat
from pathlib import Path

from opsctl_lab.hardware import NodeHardware
from opsctl_lab.paths import LabPaths
from opsctl_lab.slurm_chroot import ChrootCluster, SlurmChroot
from opsctl_lab.slurm_reboot import reboot_hardware, write_program


def test_the_program_knows_its_cluster_and_quotes_every_path(tmp_path):
    program = tmp_path / "reboot"
    write_program(program, cluster="the opsctl lab", run_dir=tmp_path / "run", log_dir="/lab dir/log",
                  slurm_conf="/lab/slurm.conf", hardware=["/venv/bin/python", "-m", "opsctl_lab.slurm_reboot",
                                                          "hardware", "/lab"])
    text = program.read_text()
    assert text.startswith("#!/bin/bash\n# RebootProgram of the opsctl lab (slurm.conf)")
    assert program.stat().st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH) == 0o111
    assert f"\nSELF={program}\nRUN_DIR={tmp_path / 'run'}\nLOG_DIR='/lab dir/log'\n" in text
    assert "\nSLURM_CONF=/lab/slurm.conf\nexport SLURM_CONF\nPAUSE=2\n" in text
    assert "\nHARDWARE=(/venv/bin/python -m opsctl_lab.slurm_reboot hardware /lab )\n" in text
    assert 'exec env --default-signal slurmd -D -b -N "$node" -f "$SLURM_CONF"\n' in text


def test_a_chroot_cluster_names_its_own_program_unless_told_another():
    chroot = SlurmChroot(suite="sid", root=Path("/nonexistent/sid"))
    own = ChrootCluster(chroot, "x", ["gpu1"], index=27).conf_text
    assert "\nRebootProgram=/var/lib/opsctl-x/opsctl-lab-reboot\n" in own
    assert "\nSlurmctldParameters=power_save_interval=1\n" in own
    other = ChrootCluster(chroot, "x", ["gpu1"], index=27, reboot_program="/bin/true")
    assert "\nRebootProgram=/bin/true\n" in other.conf_text and not other.own_reboot_program


def test_a_reboot_ends_the_volatile_faults_keeps_the_others_and_starts_the_kernel_log_again(tmp_path):
    paths = LabPaths(tmp_path)
    hw = NodeHardware(node="gpu014")
    hw.inject("xid-kernel:79", gpu=3, now=1000.0)
    hw.inject("gpu-hang", gpu=2, now=1000.0)
    hw.inject("persistence-off", gpu=5, now=1000.0)
    hw.save(paths.hardware("gpu014"))
    assert sorted(reboot_hardware(paths, "gpu014")) == ["gpu-hang gpu2", "xid-kernel:79 gpu3"]
    after = NodeHardware.load(paths.hardware("gpu014"), "gpu014")
    assert [(f.fault, f.gpu) for f in after.active] == [("persistence-off", 5)] and after.booted > 1000.0
    assert after.kernel_log == [] and paths.kernel_log("gpu014").read_text() == ""
