"""Storage health on the simulated cluster, end to end: a storage fault injected with `opsctl lab
inject`, `opsctl node check` of the node (its emulated mounts and Lustre tools) writing its textfile,
the real node_exporter and Prometheus carrying it, and `opsctl health --drain` / `--resume` acting on it
through real Slurm; a Lustre outage on every node, which the breaker stops naming storage; `opsctl
lab reset`, which removes node check results and Prometheus' record of them; and an unprivileged user's
FIFOs, directories and symlinks at every name the probe file ever had, which the probe walks past."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.lab.health_support import HealthLab

pytestmark = pytest.mark.lab
NODE = "gpu044"  # the health tests' range; their table module has cleared it by now
HUNG_NODE = "gpu045"
PLANTED_NODE = "gpu058"
NOBODY = 65534
PLAIN_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"  # one that nobody may run
# Run as nobody with the probe directory's descriptor (argv[1]): plants argv[2] (fifo, directory, symlink to
# argv[3], file) at each name after it. The descriptor reaches the directory whatever the modes of the lab's path.
PLANT = """
import os, sys
fd, kind, target, names = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
for name in names:
    if kind == "fifo":
        os.mkfifo(name, 0o666, dir_fd=fd)
    elif kind == "directory":
        os.mkdir(name, 0o777, dir_fd=fd)
    elif kind == "symlink":
        os.symlink(target, name, dir_fd=fd)
    else:
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd))
"""


@pytest.fixture
def h(lab, tmp_path):
    helper = HealthLab(lab, tmp_path, safety={"resume_after": "6s"})
    yield helper
    for result in lab.lab_dir.glob("nodes/*/textfile/*.prom"):
        result.unlink()
    helper.opsctl("lab", "clear", "all")
    helper.cleanup()
    # Gone from the textfiles, the results go stale at the next scrape: later tests must not see them.
    lab.wait_until(lambda: not prometheus_query(lab, "opsctl_node_check"), 60, "the node check results to go stale")


def prometheus_query(lab, expr: str) -> list:
    url = f"{lab.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)["data"]["result"]


def node_check(h, node):
    """`opsctl node check` of one lab node: its exit code and storage report."""
    code, data = h.node_check(node)
    return code, data["storage"]


def check_ids(h, node):
    _, nodes = h.health_json("--nodes", node)
    return {(c["id"], c.get("target") or c.get("mount")) for c in nodes[node]["checks"]}


def test_a_lustre_ost_down_is_found_drained_and_resumed_once_it_is_back(h):
    h.inject(NODE, "lustre-ost-down")
    code, storage = node_check(h, NODE)
    assert code == 1 and [(f["check"], f["device"]) for f in storage["findings"]] == [
        ("lustre-import-down", "lustre-OST0002")]
    assert "import DISCONN" in storage["findings"][0]["detail"]
    h.lab.wait_until(lambda: ("lustre-import-down", "lustre-OST0002") in check_ids(h, NODE), 60,
                     "Prometheus to show the import down", interval=1)
    _, nodes = h.health_json("--drain", "--nodes", NODE)
    assert nodes[NODE]["action"] == "drain"
    assert h.slurm()[NODE].reason.startswith("opsctl:lustre-import-down lustre-OST0002")

    h.opsctl("lab", "clear", NODE)
    assert node_check(h, NODE)[0] == 0
    resumed = h.lab.wait_until(lambda: h.health_json("--resume", "--nodes", NODE)[1][NODE]["action"] == "resume", 90,
                               "the resume", interval=3)
    assert resumed and not h.slurm()[NODE].drained


def test_a_hung_and_a_missing_mount_are_reported_within_the_timeout(h):
    h.inject(HUNG_NODE, "nfs-hung")
    h.inject(HUNG_NODE, "mount-missing")
    mnt = h.lab.lab_dir / "nodes" / HUNG_NODE / "storage" / "mnt"

    def failing():
        started = time.monotonic()
        code, storage = node_check(h, HUNG_NODE)
        found = {(f["check"], f["device"]) for f in storage["findings"]}
        return code == 1 and found == {("storage-mount-hung", str(mnt / "home")),
                                       ("storage-mount-missing", str(mnt / "shared"))} and time.monotonic() - started

    seconds = h.lab.wait_until(failing, 30, "the emulator to write the faults")
    assert seconds < 20  # storage.timeout_seconds is 6: the check gave up on the hung mount, never hung itself
    h.opsctl("lab", "clear", HUNG_NODE)
    h.lab.wait_until(lambda: node_check(h, HUNG_NODE)[0] == 0, 30, "the mounts to come back")


def test_a_lustre_outage_on_every_node_drains_none_and_names_storage(h):
    assert h.opsctl("lab", "inject", "all", "lustre-ost-down").returncode == 0
    nodes = [f"gpu{i:03d}" for i in range(1, h.lab.nodes + 1)]
    with ThreadPoolExecutor(4) as pool:  # the emulated Lustre tools are Python: more at once outruns 2 cores
        codes = list(pool.map(lambda n: node_check(h, n)[0], nodes))
    assert codes == [1] * len(nodes)

    def all_failing():
        _, result = h.health_json()
        return result["_summary"]["fail"] == len(nodes) and result

    h.lab.wait_until(all_failing, 60, "Prometheus to show every node failing", interval=2)
    before = h.slurm()
    code, result = h.health_json("--drain")
    summary = result["_summary"]
    assert code == 4 and summary["outage"] == "storage" and summary["drained"] == 0
    assert summary["safety_stop"].startswith("circuit breaker: storage (lustre-import-down lustre-OST0002)")
    assert {n: s.reason for n, s in h.slurm().items()} == {n: s.reason for n, s in before.items()}
    text = h.opsctl("health", "--drain")
    assert text.returncode == 4
    rows = text.stdout.splitlines()
    assert rows[1].split()[:3] == ["storage", "fail", "skip:circuit-breaker"]
    assert not any(row.startswith("gpu") for row in rows)


def test_lab_reset_removes_node_check_results_and_their_history(h):
    code, _ = node_check(h, "gpu046")
    assert code == 0  # a passing result is a result too: reset removes it all the same
    h.lab.wait_until(lambda: prometheus_query(h.lab, 'opsctl_node_check{node="gpu046"}'), 30,
                     "Prometheus to scrape the result")
    reset = h.opsctl("lab", "reset", timeout=300)
    assert reset.returncode == 0, reset.stderr
    assert "removed the node check results of 1 node(s): gpu046" in reset.stdout
    assert "emptied Prometheus' history of past faults" in reset.stdout and "gpu046" in reset.stdout.splitlines()[-1]
    assert not list(h.lab.lab_dir.glob("nodes/*/textfile/*.prom"))
    assert prometheus_query(h.lab, "opsctl_node_check") == []


def plant_as_nobody(probe_dir, kind: str, target, names: list[str]) -> None:
    fd = os.open(probe_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        subprocess.run([PLAIN_PYTHON, "-I", "-c", PLANT, str(fd), kind, str(target), *names], user=NOBODY,
                       group=NOBODY, extra_groups=[], pass_fds=(fd,), check=True, timeout=30)
    finally:
        os.close(fd)


def test_what_a_user_plants_in_the_probe_directory_neither_blocks_fails_nor_redirects_the_probe(h, tmp_path):
    """The probe directory is mode 1777, as on a real /home under root_squash: nobody plants a FIFO, a
    directory, a symlink to a file outside the mount and a file of its own at every name the probe file
    has had (`.opsctl-probe-<host>` until the random names; the lab named it after the lab node or the
    lab host), and at names of the new form."""
    probe_dir = h.lab.lab_dir / "nodes" / PLANTED_NODE / "storage" / "mnt" / "home" / ".opsctl-probe"
    assert probe_dir.stat().st_mode & 0o1777 == 0o1777
    victim = tmp_path / "outside" / "shadow"
    victim.parent.mkdir()
    victim.write_text("root:$6$notreally:19000:0:99999:7:::\n")
    victim.parent.chmod(0o755)
    before = hashlib.sha256(victim.read_bytes()).hexdigest(), victim.stat().st_mtime_ns
    old_names = sorted({f".opsctl-probe-{socket.gethostname()}", f".opsctl-probe-{PLANTED_NODE}"})
    new_form = [f".opsctl-probe-{socket.gethostname()}-{'0' * 16}", f".opsctl-probe-{socket.gethostname()}-{'f' * 16}"]
    try:
        for kind in ("fifo", "directory", "symlink", "file"):
            names = [f"{name}{suffix}" for name in old_names for suffix in ("", ".tmp")] + new_form
            plant_as_nobody(probe_dir, kind, victim, names)
            assert {(p.name, p.lstat().st_uid) for p in probe_dir.iterdir()} == {(n, NOBODY) for n in names}
            code, storage = node_check(h, PLANTED_NODE)
            # A probe that waited on a planted FIFO is abandoned at storage.timeout_seconds and reported as
            # storage-mount-hung, so no finding also means nothing waited on one (no wall clock here: a loaded
            # machine is slow to start the check, which says nothing about the probe).
            assert code == 0 and storage["findings"] == [], (kind, storage)
            assert sorted(p.name for p in probe_dir.iterdir()) == sorted(names)  # the probe's own file is gone
            assert (hashlib.sha256(victim.read_bytes()).hexdigest(), victim.stat().st_mtime_ns) == before, kind
            for planted in probe_dir.iterdir():
                os.rmdir(planted) if kind == "directory" else planted.unlink()
    finally:
        for planted in probe_dir.iterdir():
            os.rmdir(planted) if planted.is_dir() and not planted.is_symlink() else planted.unlink()


def test_an_xid_only_in_the_kernel_log_is_drained_by_its_catalog_action(h):
    """XID 62 reaches the node's kernel log and never DCGM (NVIDIA/DCGM issue 235): `opsctl node check` reads
    it, its textfile carries the windowed count through node_exporter and Prometheus, and the catalog's
    xid-62 rule (NVIDIA's catalog: reset the GPU) drains the node, saying where the XID came from."""
    from opsctl_lab.hardware import NodeHardware, write_kernel_log

    node_dir = h.lab.lab_dir / "nodes" / NODE
    h.inject(NODE, "xid-kernel:62", gpu=5)
    try:
        _, data = h.node_check(NODE)
        kernel = data["kernel_log"]
        assert kernel["read_ok"] and [(x["xid"], x["gpu"]) for x in kernel["xids"]] == [(62, 5)], data
        h.lab.wait_until(lambda: ("xid-62", None) in check_ids(h, NODE), 60, "Prometheus to show XID 62", interval=1)
        assert h.health_json("--nodes", NODE)[1][NODE]["status"] == "fail"
        assert not prometheus_query(h.lab, 'DCGM_EXP_XID_ERRORS_COUNT{xid="62"} > 0')  # DCGM never saw it
        _, nodes = h.health_json("--drain", "--nodes", NODE)
        assert nodes[NODE]["action"] == "drain"
        assert h.slurm()[NODE].reason == "opsctl:xid-62 gpu5 xid=62 count=1 (kernel log)"
    finally:
        # The kernel log keeps its lines after `lab clear`, as a real one does until the node reboots: reboot
        # the emulated node, so that no later node check reads this XID again.
        hw = NodeHardware.load(node_dir / "hardware.json", NODE)
        hw.reboot()
        hw.save(node_dir / "hardware.json")
        write_kernel_log(node_dir / "kmsg", hw)
