"""Storage health with real processes: the child-process stat and probe of opsctl.storage.probe, the Lustre
client's tools asked by opsctl.storage.check.ask_lustre (lctl and lfs stand-ins that print the real
formats, tests/fixtures/lustre), and `opsctl node check` end to end: a hung mount is reported within the
timeout and the check itself never hangs."""

import json
import os
import socket
import stat
import time

import yaml

from opsctl.config import parse_config
from opsctl.storage.check import ask_lustre
from opsctl.storage.mountinfo import parse_mountinfo
from opsctl.storage.probe import probe_file, probe_mounts
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree
from tests.conftest import FIXTURES, opsctl

ROOT_FSTYPE = parse_mountinfo(open("/proc/self/mountinfo").read())["/"].fstype


def test_a_mount_that_answers_and_a_probe_that_writes_and_reads_back(tmp_path):
    results = probe_mounts({"/": None, str(tmp_path): str(tmp_path)}, timeout=10)
    assert {p: r.status for p, r in results.items()} == {"/": "ok", str(tmp_path): "ok"}
    assert list(tmp_path.iterdir()) == []  # the probe file is removed again


def test_a_probe_that_blocks_is_hung_within_the_timeout(tmp_path):
    # A FIFO without a reader blocks the child's open for writing, as a hung mount blocks a stat.
    os.mkfifo(probe_file(str(tmp_path)))
    started = time.monotonic()
    results = probe_mounts({str(tmp_path): str(tmp_path), "/": None}, timeout=1.5)
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


def test_node_check_reports_a_missing_and_a_hung_mount_and_never_hangs(tmp_path):
    sysfs = tmp_path / "sys"
    write_tree(sysfs, NodeHardware(node=socket.gethostname()))
    hung = tmp_path / "hung"
    hung.mkdir()
    os.mkfifo(probe_file(str(hung)))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"storage": {"timeout_seconds": 2, "mounts": [
        {"path": "/", "fstype": ROOT_FSTYPE},
        {"path": "/srv/opsctl-not-mounted", "fstype": "nfs4"},
        {"path": str(hung), "fstype": ROOT_FSTYPE, "probe_dir": str(hung)}]}}))
    textfile = tmp_path / "node-check.prom"
    started = time.monotonic()
    out = opsctl("node", "check", "--json", "--window", "0", "--sysfs-root", str(sysfs), "--config", str(config),
                 "--textfile", str(textfile), check=False, timeout=60)
    assert time.monotonic() - started < 30
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    findings = {(f["check"], f["device"]) for f in doc["storage"]["findings"]}
    assert findings == {("storage-mount-missing", "/srv/opsctl-not-mounted"), ("storage-mount-missing", str(hung)),
                        ("storage-mount-hung", str(hung))}
    assert {"check": "lustre-import-down", "why": "no Lustre mount configured"} in doc["storage"]["skipped"]
    metrics = textfile.read_text()
    assert f'opsctl_node_check{{check="storage-mount-hung",device="{hung}"}} 1' in metrics
    assert 'opsctl_node_check{check="ib-port-state",device="node"} 0' in metrics
