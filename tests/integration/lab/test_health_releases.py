"""`opsctl health` against real Slurm daemons of three releases: Debian 12's 22.05 (the lab's own
slurmctld), Debian 13's 24.11 and Debian unstable's 26.05 (from the lab's debootstrap chroots, with
GPU gres). Each chroot cluster carries the names of lab nodes, so opsctl reads their metrics from the
lab's Prometheus and their state from that release's Slurm.

A node fails or heals at once through a catalog rule of the test's own (`lab-flag`, over the real
`up` series of chosen nodes): these tests are about what each Slurm release does with a drain, a
resume, a person's drain, and FAIL, DOWN and MAINT, not about how long a fault takes to show."""

import functools
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from opsctl.config import parse_config
from opsctl.health.catalog import load_catalog
from opsctl.slurm import SlurmCliImpl

pytestmark = pytest.mark.lab

RELEASES = {"22.05": None, "24.11": "trixie", "26.05": "sid"}
NODES = ["gpu033", "gpu034", "gpu035", "gpu036", "gpu037"]
SCOPE = "gpu[033-037]"
FLAG_RULE = {"id": "lab-flag", "source": "node", "device_label": "", "op": ">", "threshold": 0, "severity": "fail",
             "action": "drain", "auto_resume": True, "evidence": "flag=${value}",
             "description": "A node the test flags.", "remediation": "Unflag it."}


class Release:
    """One Slurm release: how to reach it (env, sinfo/scontrol) and the cluster state to restore."""

    def __init__(self, name, env, sinfo="sinfo", scontrol="scontrol"):
        self.name, self.env, self.sinfo, self.scontrol_path = name, env, sinfo, scontrol
        self.reader = SlurmCliImpl(sinfo, scontrol, run=functools.partial(subprocess.run, env=env),
                                   environ=env)

    def scontrol(self, *args, check=True):
        proc = subprocess.run([self.scontrol_path, *args], capture_output=True, text=True, env=self.env, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{self.name}: scontrol {' '.join(args)}: {proc.stderr}")
        return proc

    def nodes(self):
        return self.reader.nodes()

    def wait(self, check, what, timeout=90):
        deadline = time.monotonic() + timeout
        while not check(self.nodes()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: timed out waiting for {what}")
            time.sleep(0.5)

    def restore(self):
        """No reservation, every test node idle and undrained again. (24.11 keeps a node's last reason
        after a resume, 22.05 and 26.05 clear it: each test uses nodes of its own.)"""
        self.scontrol("delete", "reservation=opsctl-maint", check=False)
        self.scontrol("update", f"nodename={SCOPE}", "state=resume", check=False)
        self.wait(lambda nodes: all(nodes[n].state == "idle" and not nodes[n].flags for n in NODES),
                  "the test nodes idle")


@pytest.fixture(scope="module", params=list(RELEASES))
def release(request, lab):
    suite = RELEASES[request.param]
    if suite is None:
        rel = Release("22.05", {**os.environ, **lab.env})
        rel.restore()
        yield rel
        rel.restore()
        return
    from opsctl_lab.slurm_chroot import ChrootCluster, SlurmChroot

    slot = int(lab.env.get("OPSCTL_LAB_SLOT", 0))
    cluster = ChrootCluster(SlurmChroot.ensure(suite), f"health-{suite}-{slot}", NODES,
                            index=10 * slot + 7 + list(RELEASES).index(request.param), gres="gpu:h200:8")
    cluster.up(fresh=True)
    try:
        yield Release(request.param, dict(os.environ), cluster.sinfo, cluster.scontrol)
    finally:
        cluster.down()


class Health:
    def __init__(self, lab, release, tmp):
        self.lab, self.release, self.tmp = lab, release, tmp
        self.catalog = tmp / "flag.yaml"
        self.config = tmp / "opsctl.yaml"
        self.flag()
        slurm = {"sinfo": release.sinfo, "scontrol": release.scontrol_path}
        # Only the test's rule: the shipped ones are proven on the lab elsewhere, and 37 rules per run
        # would only make these tests slower.
        shipped = [rule.id for rule in load_catalog(parse_config({}, "t", {}))]
        self.config.write_text(yaml.safe_dump({
            "prometheus": {"url": lab.prometheus_url, "scrape_interval": f"{lab.scrape_interval}s"},
            "slurm": slurm, "catalog": {"files": [str(self.catalog)], "disable": shipped},
            "safety": {"resume_after": "1s", "max_out_of_service_fraction": 1.0},
            "state_dir": str(tmp / "state"), "audit_log": str(tmp / "state" / "audit.jsonl")}))

    def flag(self, *nodes):
        """lab-flag fails on these nodes (and reads ok, with positive evidence, on every other)."""
        pattern = "|".join(nodes) or "none"
        expr = (f'max by (${{by}}) (up{{job="${{node}}", node=~"{pattern}"}}) '
                f'or max by (${{by}}) (up{{job="${{node}}"}}) * 0')
        rule = {**FLAG_RULE, "expr": expr}
        self.catalog.write_text(yaml.safe_dump({"rules": [rule]}))

    def health(self, *args):
        env = {**self.release.env, "OPSCTL_CONFIG": str(self.config), "OPSCTL_STATE_DIR": str(self.tmp / "state"),
               **({"SLURM_CONF": self.lab.env["SLURM_CONF"]} if self.release.name == "22.05" else {})}
        proc = subprocess.run([sys.executable, "-m", "opsctl", "health", "--json", "--nodes", SCOPE, *args],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode in (0, 1, 4), f"{self.release.name}: exit {proc.returncode}: {proc.stderr}"
        return {n["node"]: n for n in json.loads(proc.stdout)["nodes"]}


@pytest.fixture
def h(lab, release, tmp_path):
    health = Health(lab, release, tmp_path)
    yield health
    release.restore()


def test_drain_then_resume(h, release):
    h.flag("gpu033")
    assert h.health("--drain")["gpu033"]["action"] == "drain"
    node = release.nodes()["gpu033"]
    assert node.drained and node.reason == "opsctl:lab-flag flag=1"
    h.flag()
    assert h.health("--resume")["gpu033"]["action"] == "skip:healthy-period"
    time.sleep(1.2)
    assert h.health("--resume")["gpu033"]["action"] == "resume"
    assert not release.nodes()["gpu033"].drained


def test_a_persons_drain_is_kept(h, release):
    release.scontrol("update", "nodename=gpu034", "state=drain", "reason=maintenance")
    h.flag("gpu034")
    assert h.health("--drain", "--resume")["gpu034"]["action"] == "skip:not-owned"
    h.flag()
    for _ in range(2):
        h.health("--drain", "--resume")
        time.sleep(1.2)
    node = release.nodes()["gpu034"]
    assert node.drained and node.reason == "maintenance"


def test_fail_down_and_maint_are_left_alone(h, release):
    release.scontrol("create", "reservation", "reservationname=opsctl-maint", "starttime=now", "duration=10",
                     "nodes=gpu037", "flags=maint", "users=root")
    release.scontrol("update", "nodename=gpu035", "state=fail", "reason=failing dimm")
    release.scontrol("update", "nodename=gpu036", "state=down", "reason=bad psu")
    release.wait(lambda nodes: "MAINTENANCE" in nodes["gpu037"].flags or "MAINT" in nodes["gpu037"].flags,
                 "the MAINT reservation to show")
    before = release.nodes()
    h.flag("gpu035", "gpu036", "gpu037")
    nodes = h.health("--drain", "--resume")
    assert {n: nodes[n]["action"] for n in ("gpu035", "gpu036", "gpu037")} == {
        "gpu035": "skip:not-owned", "gpu036": "skip:not-owned", "gpu037": "skip:slurm-state"}
    after = release.nodes()
    assert all(after[n].same_as(before[n]) for n in ("gpu035", "gpu036", "gpu037"))
    assert not after["gpu037"].drained


def test_a_preflights_reservation_is_made_handed_over_and_deleted_alike(release):
    """opsctl validate --preflight's three scontrol calls (opsctl.slurm.cli) on each release's slurmctld."""
    name = "opsctl-preflight-releases"

    def shown():
        out = release.scontrol("-o", "show", "reservation", name).stdout
        return dict(field.split("=", 1) for field in out.split() if "=" in field)
    release.reader.reserve(name, NODES[:3], 60)
    try:
        first = shown()
        assert "MAINT" in first["Flags"].split(",") and first["Users"] == "root"
        # slurmctld flags the nodes at its next reservation pass, within a few seconds
        release.wait(lambda nodes: all("MAINTENANCE" in nodes[n].held_by_slurm for n in NODES[:3]),
                     "the reserved nodes in maintenance", timeout=15)
        release.reader.hand_over(name, NODES[:2], ["slurm"], 30)  # an account every chroot has
        release.wait(lambda nodes: not nodes[NODES[2]].held_by_slurm, "the node left out free again", timeout=15)
        after = shown()
        assert release.reader.expand(after["Nodes"]) == NODES[:2] and after["Users"] == "slurm"
        assert "MAINT" not in after["Flags"].split(",") and after["Duration"] == "00:30:00"
    finally:
        release.reader.release(name)
    assert release.scontrol("show", "reservation", name, check=False).returncode != 0 or \
        "not found" in release.scontrol("show", "reservation", name, check=False).stdout
