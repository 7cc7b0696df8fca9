"""`opsctl node check` end to end reading a kernel log: a file of /dev/kmsg records
(tests/fixtures/kmsg/kmsg_h200_node.txt, as the lab writes one), an nvidia-smi stand-in that names the GPUs
(one of them fell off the bus: rc 15), the textfile and --json over runs, and a state file that a user
planted as a symlink."""

import json
import socket

import yaml

from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree
from tests.conftest import FIXTURES, opsctl

NODE_LOG = (FIXTURES / "kmsg" / "kmsg_h200_node.txt").read_text()
GPU_55, GPU_91, GPU_97 = "00000000:55:00.0", "00000000:91:00.0", "00000000:97:00.0"
# What nvidia-smi prints when GPU 00000000:91:00.0 fell off the bus (tests/unit/test_hw_facts.py).
NVIDIA_SMI = """#!/bin/sh
echo 'Unable to determine the device handle for GPU0000:91:00.0: Unknown Error'
echo '0, 00000000:55:00.0'
echo '1, 00000000:97:00.0'
exit 15
"""


def node_check(tmp_path, *, check_log=None):
    """(exit code, --json, textfile) of one run, its state in tmp_path/state."""
    if not (tmp_path / "sys").exists():
        write_tree(tmp_path / "sys", NodeHardware(node=socket.gethostname()))
        (tmp_path / "nvidia-smi").write_text(NVIDIA_SMI)
        (tmp_path / "nvidia-smi").chmod(0o755)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"gpu": {"kernel_log_path": str(check_log or tmp_path / "kmsg"),
                                              "nvidia_smi": str(tmp_path / "nvidia-smi")}}))
    textfile = tmp_path / "node-check.prom"
    out = opsctl("node", "check", "--json", "--window", "0", "--sysfs-root", str(tmp_path / "sys"), "--config",
                 str(config), "--textfile", str(textfile), env={"OPSCTL_STATE_DIR": str(tmp_path / "state")},
                 check=False, timeout=60)
    return out.returncode, json.loads(out.stdout), textfile.read_text()


def test_each_xid_is_exported_once_and_counted_again_only_when_a_new_one_is_logged(tmp_path):
    (tmp_path / "kmsg").write_text(NODE_LOG)
    code, doc, metrics = node_check(tmp_path)
    assert code == 0  # XIDs are the health rules' to judge: node check passes, drains nothing
    log = doc["kernel_log"]
    assert log["read_ok"] and log["skipped"] == [] and log["gpu_index_note"] == f"nvidia-smi does not list {GPU_91}"
    assert [(x["seq"], x["gpu"], x["pci_bus_id"], x["xid"], x["pid"], x["process"]) for x in log["xids"]] == [
        (1202, None, GPU_91, 79, None, None), (1207, 0, GPU_55, 48, None, None),
        (1208, 0, GPU_55, 48, 2187734, "python"), (1209, 0, GPU_55, 154, None, None),
        (1210, 1, GPU_97, 119, 5220, "cache_mgr_main"), (1211, 1, GPU_97, 154, None, None)]
    assert [(s["nvswitch_pci"], s["sxid"], s["fatal"]) for s in log["sxids"]] == [("00000000:06:00.0", 20034, True)]
    assert log["recovery_actions"] == [{"gpu": 0, "pci_bus_id": GPU_55, "action": "drain_and_reset"},
                                       {"gpu": 1, "pci_bus_id": GPU_97, "action": "reset"}]
    expected = [f'opsctl_node_kernel_xid_total{{gpu="0",pci_bus_id="{GPU_55}",xid="48"}} 2',
                f'opsctl_node_kernel_xid_total{{gpu="",pci_bus_id="{GPU_91}",xid="79"}} 1',
                f'opsctl_node_kernel_xid_total{{gpu="1",pci_bus_id="{GPU_97}",xid="154"}} 1',
                'opsctl_node_kernel_sxid_total{nvswitch_pci="00000000:06:00.0",sxid="20034",fatal="true"} 1',
                f'opsctl_node_gpu_recovery_action{{gpu="0",pci_bus_id="{GPU_55}",action="drain_and_reset"}} 1',
                f'opsctl_node_gpu_recovery_action{{gpu="1",pci_bus_id="{GPU_97}",action="reset"}} 1',
                "opsctl_node_kernel_log_read_ok 1"]
    assert [line for line in expected if line not in metrics.splitlines()] == []
    first_seen = [line for line in metrics.splitlines() if line.startswith("opsctl_node_kernel_xid_last_timestamp")]
    assert len(first_seen) == 5

    code, doc, again = node_check(tmp_path)  # nothing new in the log
    assert code == 0 and doc["kernel_log"]["xids"] == [] and doc["kernel_log"]["sxids"] == []
    assert [line for line in again.splitlines() if "kernel" in line or "recovery" in line] == \
        [line for line in metrics.splitlines() if "kernel" in line or "recovery" in line]

    with open(tmp_path / "kmsg", "a") as log_file:  # the journalctl capture's next XID 48 on the same GPU
        log_file.write("3,1212,6781790000000,-;NVRM: Xid (PCI:0000:55:00): 48, pid=2187734, name=python, "
                       "channel 0x00000002\n SUBSYSTEM=pci\n DEVICE=+pci:0000:55:00.0\n")
    code, doc, more = node_check(tmp_path)
    assert code == 0 and [(x["seq"], x["xid"]) for x in doc["kernel_log"]["xids"]] == [(1212, 48)]
    assert f'opsctl_node_kernel_xid_total{{gpu="0",pci_bus_id="{GPU_55}",xid="48"}} 3' in more.splitlines()
    assert f'opsctl_node_kernel_xid_total{{gpu="",pci_bus_id="{GPU_91}",xid="79"}} 1' in more.splitlines()


def test_a_state_file_a_user_planted_as_a_symlink_is_never_followed(tmp_path):
    (tmp_path / "kmsg").write_text(NODE_LOG)
    victim = tmp_path / "shadow"
    victim.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "kernel_log.json").symlink_to(victim)
    code, doc, metrics = node_check(tmp_path)
    assert code == 0  # a check that could not run: neither a pass nor a failure
    assert doc["kernel_log"]["read_ok"] is False
    why = f"state file {tmp_path}/state/kernel_log.json: a symlink, refused; move it away to reset"
    assert doc["kernel_log"]["skipped"] == [{"check": "kernel-log", "why": why}]
    assert victim.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    assert (tmp_path / "state" / "kernel_log.json").is_symlink()
    assert "opsctl_node_kernel_log_read_ok 0" in metrics.splitlines() and "xid_total" not in metrics


def test_a_kernel_log_that_cannot_be_read_is_a_check_that_did_not_run(tmp_path):
    code, doc, metrics = node_check(tmp_path, check_log=tmp_path / "no-such-kmsg")
    assert code == 0
    assert doc["kernel_log"]["skipped"] == [{"check": "kernel-log",
                                             "why": f"cannot read {tmp_path}/no-such-kmsg: No such file or directory"}]
    assert "opsctl_node_kernel_log_read_ok 0" in metrics.splitlines()
