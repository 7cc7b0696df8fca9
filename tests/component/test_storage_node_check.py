"""Storage health with real processes: the child-process stat and probe of opsctl.storage.probe, the Lustre
client's tools asked by opsctl.storage.check.ask_lustre and ask_lnet (lctl, lfs and lnetctl stand-ins that
print the real formats, tests/fixtures/lustre), and `opsctl node check` end to end: a hung mount is
reported within the timeout and the check itself never hangs."""

import json
import os
import socket
import stat
import sys
import time

import yaml

from opsctl.config import parse_config
from opsctl.storage.check import ask_lnet, ask_lustre
from opsctl.storage.mountinfo import parse_mountinfo
from opsctl.storage.probe import probe_mounts
from opsctl_lab import hung_mount
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree
from opsctl_lab.storage_view import MGS_NID, mount_dir, node_nid, write_storage
from tests.conftest import FIXTURES, opsctl

ROOT_FSTYPE = parse_mountinfo(open("/proc/self/mountinfo").read())["/"].fstype


def test_a_mount_that_answers_and_a_probe_that_writes_and_reads_back(tmp_path):
    results = probe_mounts({"/": None, str(tmp_path): str(tmp_path)}, timeout=10)
    assert {p: r.status for p, r in results.items()} == {"/": "ok", str(tmp_path): "ok"}
    assert list(tmp_path.iterdir()) == []  # the probe file is removed again


def test_a_probe_that_blocks_is_hung_within_the_timeout(tmp_path):
    # A FUSE mount that never answers blocks the child's stat, as a hung NFS mount does (opsctl_lab.hung_mount).
    hung_mount.hang(tmp_path, tmp_path.parent / "hang.pid")
    started = time.monotonic()
    try:
        results = probe_mounts({str(tmp_path): str(tmp_path), "/": None}, timeout=1.5)
    finally:
        hung_mount.release(tmp_path, tmp_path.parent / "hang.pid")
    assert time.monotonic() - started < 4
    assert results[str(tmp_path)].status == "hung" and results[str(tmp_path)].detail == "no answer within 1.5s"
    assert results["/"].status == "ok"


def test_a_probe_that_fails_says_why(tmp_path):
    results = probe_mounts({str(tmp_path): str(tmp_path / "missing")}, timeout=10)
    assert results[str(tmp_path)].status == "error"
    assert results[str(tmp_path)].detail.startswith("FileNotFoundError: [Errno 2] No such file or directory")


def _tool(path, text, rc=0, stream="out"):
    path.write_text(f"#!/bin/sh\ncat >&{1 if stream == 'out' else 2} <<'END'\n{text}END\nexit {rc}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_ask_lustre_reads_imports_and_servers_from_the_tools(tmp_path):
    lctl = _tool(tmp_path / "lctl", (FIXTURES / "lustre/lctl_get_param_imports_ost0002_disconn.txt").read_text())
    # lfs prints a failed server on stderr and exits non-zero; the active ones on stdout.
    lfs = _tool(tmp_path / "lfs", "lfs check: error: check 'lustre-OST0002-osc-ffff8c8e3a1b5000': Transport endpoint "
                "is not connected (107)\n", rc=107, stream="err")
    config = parse_config({"storage": {"lctl": lctl, "lfs": lfs}}, "t", {}).storage
    view = ask_lustre(config)
    assert [i.target for i in view.imports if not i.healthy] == ["lustre-OST0002"]
    assert [(s.target, s.active) for s in view.servers] == [("lustre-OST0002", False)]


def test_ask_lustre_without_the_tools_or_with_one_failing_is_not_asked(tmp_path):
    config = parse_config({"storage": {"lctl": str(tmp_path / "none")}}, "t", {}).storage
    assert ask_lustre(config).unavailable == f"{tmp_path / 'none'} not found"
    lctl = _tool(tmp_path / "lctl", "error: get_param: param_path 'osc/*/import': No such file or directory\n", rc=2,
                 stream="err")
    config = parse_config({"storage": {"lctl": lctl}}, "t", {}).storage
    assert ask_lustre(config).unavailable.startswith(f"{lctl} get_param osc.*.import mdc.*.import exited 2: error:")


def test_ask_lnet_reads_the_nis_and_pings_each_mgs_nid_with_half_the_timeout(tmp_path):
    lnetctl = _tool(tmp_path / "lnetctl", (FIXTURES / "lustre/lnetctl_net_show_o2ib_ni_down.txt").read_text())
    # lctl before 2.17 prints a failed ping on stderr and exits 1; the stand-in also logs its arguments.
    lctl = tmp_path / "lctl"
    lctl.write_text(f"#!/bin/sh\necho \"$@\" >>{tmp_path / 'argv'}\n"
                    "case $2 in 10.10.0.10@o2ib) printf '12345-0@lo\\n12345-10.10.0.10@o2ib\\n';;\n"
                    "*) echo \"failed to ping $2: Input/output error\" >&2; exit 1;; esac\n")
    lctl.chmod(0o755)
    config = parse_config({"storage": {"lnetctl": lnetctl, "lctl": str(lctl), "timeout_seconds": 5,
                                       "lustre_mgs_nids": ["10.10.0.10@o2ib", "10.10.0.11@o2ib"]}}, "t", {}).storage
    view = ask_lnet(config)
    assert [ni.nid for ni in view.nis if not ni.up] == ["172.16.0.24@o2ib"] and view.unavailable == {}
    assert [(p.nid, p.reachable, p.detail) for p in view.pings] == [
        ("10.10.0.10@o2ib", True, "12345-0@lo 12345-10.10.0.10@o2ib"),
        ("10.10.0.11@o2ib", False, "Input/output error")]
    assert (tmp_path / "argv").read_text() == "ping 10.10.0.10@o2ib 2\nping 10.10.0.11@o2ib 2\n"


def test_ask_lnet_without_lnetctl_or_mgs_nids_says_why_per_check(tmp_path):
    config = parse_config({"storage": {"lnetctl": str(tmp_path / "none")}}, "t", {}).storage
    assert ask_lnet(config).unavailable == {"lnet-ni-down": f"{tmp_path / 'none'} not found",
                                            "lustre-mgs-unreachable": "no storage.lustre_mgs_nids configured"}
    # lnetctl prints its error as YAML on stderr and exits non-zero when LNet is not configured.
    lnetctl = _tool(tmp_path / "lnetctl", 'show:\n    - net:\n          errno: -100\n          descr: "cannot get '
                    'networks: Network is down"\n', rc=1, stream="err")
    config = parse_config({"storage": {"lnetctl": lnetctl}}, "t", {}).storage
    assert ask_lnet(config).unavailable["lnet-ni-down"].startswith(f"{lnetctl} net show exited 1: show:")


def test_node_check_reports_a_missing_and_a_hung_mount_and_never_hangs(tmp_path):
    sysfs = tmp_path / "sys"
    write_tree(sysfs, NodeHardware(node=socket.gethostname()))
    hung = tmp_path / "hung"
    hung.mkdir()
    hung_mount.hang(hung, tmp_path / "hang.pid")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"storage": {"timeout_seconds": 2, "mounts": [
        {"path": "/", "fstype": ROOT_FSTYPE},
        {"path": "/srv/opsctl-not-mounted", "fstype": "nfs4"},
        {"path": str(hung), "fstype": ROOT_FSTYPE, "probe_dir": str(hung)}]}}))
    textfile = tmp_path / "node-check.prom"
    started = time.monotonic()
    try:
        out = opsctl("node", "check", "--json", "--window", "0", "--sysfs-root", str(sysfs), "--config",
                     str(config), "--textfile", str(textfile), env={"OPSCTL_STATE_DIR": str(tmp_path / "state")},
                     check=False, timeout=60)
    finally:
        hung_mount.release(hung, tmp_path / "hang.pid")
    assert time.monotonic() - started < 30
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    findings = {(f["check"], f["device"]) for f in doc["storage"]["findings"]}
    assert findings == {("storage-mount-missing", "/srv/opsctl-not-mounted"), ("storage-mount-missing", str(hung)),
                        ("storage-mount-hung", str(hung))}
    assert {"check": "lustre-import-down", "why": "no Lustre mount configured"} in doc["storage"]["skipped"]
    assert {"check": "lnet-ni-down", "why": "no Lustre mount configured"} in doc["storage"]["skipped"]
    metrics = textfile.read_text()
    assert f'opsctl_node_check{{check="storage-mount-hung",device="{hung}"}} 1' in metrics
    assert 'opsctl_node_check{check="ib-port-state",device="node"} 0' in metrics


def test_node_check_of_a_lab_node_with_lnet_down_reports_the_ni_and_the_mgs(tmp_path):
    """The simulated lab's Lustre tools (opsctl_lab.hwtools, run as the lab runs them) under `lnet-down`:
    the findings reach --json and the textfile, and the Lustre imports still pass."""
    node = socket.gethostname()
    hw = NodeHardware(node=node)
    hw.inject("lnet-down", now=time.time())
    hw.save(tmp_path / "hardware.json")
    write_tree(tmp_path / "sys", hw)
    write_storage(tmp_path / "storage", tmp_path / "mnt", hw)
    env = f"PYTHONPATH={os.pathsep.join(sys.path)} OPSCTL_HW_STATE={tmp_path / 'hardware.json'}"
    for tool in ("lctl", "lfs", "lnetctl"):
        (tmp_path / tool).write_text(f"#!/bin/sh\n{env} exec {sys.executable} -m opsctl_lab.hwtools.{tool} \"$@\"\n")
        (tmp_path / tool).chmod(0o755)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"storage": {
        "mounts": [{"path": str(mount_dir(tmp_path / "mnt", "/lustre")), "fstype": "lustre"}], "timeout_seconds": 5,
        "lctl": str(tmp_path / "lctl"), "lfs": str(tmp_path / "lfs"), "lnetctl": str(tmp_path / "lnetctl"),
        "lustre_mgs_nids": [MGS_NID], "mountinfo_path": str(tmp_path / "storage/mountinfo")}}))
    textfile = tmp_path / "node-check.prom"
    out = opsctl("node", "check", "--json", "--window", "0", "--sysfs-root", str(tmp_path / "sys"), "--config",
                 str(config), "--textfile", str(textfile), env={"OPSCTL_STATE_DIR": str(tmp_path / "state")},
                 check=False, timeout=60)
    assert out.returncode == 1, out.stderr
    storage = json.loads(out.stdout)["storage"]
    nid = node_nid(hw)
    assert storage["findings"] == [
        {"check": "lnet-ni-down", "device": nid, "detail": "o2ib NI down; interfaces bond0"},
        {"check": "lustre-mgs-unreachable", "device": MGS_NID, "detail": "lctl ping: Input/output error"}]
    assert storage["skipped"] == []
    metrics = textfile.read_text()
    assert f'opsctl_node_check{{check="lnet-ni-down",device="{nid}"}} 1' in metrics
    assert f'opsctl_node_check{{check="lustre-mgs-unreachable",device="{MGS_NID}"}} 1' in metrics
    assert 'opsctl_node_check{check="lustre-import-down",device="node"} 0' in metrics
