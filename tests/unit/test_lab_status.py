"""`opsctl lab machines status` exits 0 only when everything the tier runs is running (every machine
and its apt cache), 1 otherwise, as `opsctl lab status` does (its lab tier test: test_lab_lifecycle.py).
The pid files are the tier's own record of what runs; this process stands in for a running one."""

import os

from click.testing import CliRunner

from opsctl.cli import main
from opsctl_lab.machines import aptcache, nspawn
from opsctl_lab.machines import vendor_server as vendor_serve
from opsctl_lab.machines.lifecycle import status
from opsctl_lab.machines.settings import Settings


def machines(tmp_path, names=("head", "gpu1")) -> Settings:
    settings = Settings(net=7, state_dir=tmp_path / "machines", inventory_dir=tmp_path / "inv",
                        apt_cache_dir=tmp_path / "apt")
    for name in names:
        (settings.machine_dir(name) / "upper").mkdir(parents=True)
    return settings


def run(settings, name=None, cache=False) -> tuple[int, list[str]]:
    lines: list[str] = []
    if name:
        nspawn._pid_file(settings, name).write_text(f"{os.getpid()}\n")
    if cache:
        aptcache._pid_file(settings).parent.mkdir(parents=True, exist_ok=True)
        aptcache._pid_file(settings).write_text(f"{os.getpid()}\n")
        vendor_serve._pid_file(settings).write_text(f"{os.getpid()}\n")
    return int(status(lines.append, settings)), lines


def test_no_machines_is_1(tmp_path):
    assert run(Settings(net=7, state_dir=tmp_path / "none", inventory_dir=tmp_path / "inv"))[0] == 1


def test_stopped_machines_are_1_and_all_running_is_0(tmp_path):
    settings = machines(tmp_path)
    code, lines = run(settings)
    assert code == 1 and [line.split()[-1] for line in lines] == ["stopped"] * 4
    assert run(settings, "head", cache=True)[0] == 1  # gpu1 still stopped
    code, lines = run(settings, "gpu1")
    assert code == 0 and all(f"running pid {os.getpid()}" in line for line in lines)


def test_a_stopped_apt_cache_is_1(tmp_path):
    settings = machines(tmp_path, names=("head",))
    assert run(settings, "head")[0] == 1


def test_the_command_exits_with_it(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCTL_LAB_DIR", str(tmp_path))
    monkeypatch.setenv("OPSCTL_LAB_NET", "7")
    monkeypatch.setenv("OPSCTL_LAB_INVENTORY", str(tmp_path / "inv"))
    result = CliRunner().invoke(main, ["lab", "machines", "status"])
    assert result.exit_code == 1 and "no lab machines" in result.stdout


def test_lab_up_reports_nodes_as_they_are_and_the_faults_it_finds():
    from opsctl_lab.cluster import ready_report

    states = {f"gpu{i:03d}": "idle" for i in range(1, 65)} | {"gpu010": "drain", "gpu020": "down*"}
    lines = ready_report(states, {"gpu007": ["xid:79 gpu3"], "gpu001": []}, 124, 12.34)
    assert lines == ["lab ready: 64 nodes (62 idle, 1 down*, 1 drain), 124 targets up, in 12.3 s",
                     "  down*    gpu020", "  drain    gpu010", "  faults gpu007: xid:79 gpu3"]
    clean = ready_report({"gpu001": "idle", "gpu002": "idle"}, {}, 4, 1.0)
    assert clean == ["lab ready: 2 nodes (2 idle), 4 targets up, in 1.0 s"]


def test_lab_reset_clears_faults_lifts_drains_and_empties_opsctls_state(tmp_path, monkeypatch):
    import json

    from opsctl_lab import cluster, prometheus_lab, slurm_lab
    from opsctl_lab.hardware import NodeHardware
    from opsctl_lab.paths import LabPaths

    monkeypatch.setenv("OPSCTL_LAB_DIR", str(tmp_path))
    paths = cluster._paths()
    assert isinstance(paths, LabPaths)
    paths.state_file.write_text(json.dumps({"nodes": 3, "scrape_interval": 5, "slot": 0}))
    hw = NodeHardware(node="gpu002")
    hw.inject("xid:79", gpu=3)
    hw.save(paths.hardware("gpu002"))
    paths.opsctl_state.mkdir(parents=True)
    (paths.opsctl_state / "audit.jsonl").write_text('{"event": "drain"}\n')
    resumed, restarted = [], []
    monkeypatch.setattr(slurm_lab, "node_states", lambda p: {"gpu001": "drain", "gpu002": "idle", "gpu003": "down*"})
    monkeypatch.setattr(slurm_lab, "resume", lambda p, nodes: resumed.append(nodes))
    # A preflight that stopped halfway left its maintenance reservation, and a test its held job.
    reservations, jobs = {"opsctl-preflight": "gpu[002-003]"}, ["17"]
    monkeypatch.setattr(slurm_lab, "reservations", lambda p: dict(reservations))
    monkeypatch.setattr(slurm_lab, "delete_reservation", lambda p, name: reservations.pop(name))
    monkeypatch.setattr(slurm_lab, "jobs", lambda p: list(jobs))
    monkeypatch.setattr(slurm_lab, "cancel", lambda p, ids: [jobs.remove(i) for i in ids])
    monkeypatch.setattr(prometheus_lab, "start_node_exporter", lambda p, index: restarted.append(index))
    # gpu003 had a fault that was cleared by hand: its counters keep what the fault added.
    worn = NodeHardware(node="gpu003")
    worn.inject("dbe", gpu=1)
    worn.clear()
    worn.save(paths.hardware("gpu003"))
    forgotten, waited, watching = [], [], []
    monkeypatch.setattr(prometheus_lab, "forget_history", lambda p: forgotten.append(p))
    monkeypatch.setattr(prometheus_lab, "start_opsctl_watch", lambda p, interval: watching.append(interval))
    monkeypatch.setattr(cluster, "wait_ready", lambda p, nodes, *args: waited.append((nodes, *args[1:])))
    # gpu001 has a node check result in its textfile directory, which Prometheus holds too.
    paths.textfile("gpu001").mkdir(parents=True)
    (paths.textfile("gpu001") / "node-check.prom").write_text('opsctl_node_check{check="x",device="node"} 0\n')
    monkeypatch.setattr(prometheus_lab, "nodes_with", lambda expr: {"gpu001"} if expr == "opsctl_node_check" else set())
    result = CliRunner().invoke(main, ["lab", "reset"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "cleared gpu002: xid:79 gpu3", "removed the node check results of 1 node(s): gpu001",
        "resumed gpu001 (drain), gpu003 (down*)", "cancelled 1 job(s): 17",
        "deleted reservation opsctl-preflight (gpu[002-003])",
        f"emptied the opsctl state and audit log in {paths.opsctl_state}: audit.jsonl",
        "emptied Prometheus' history of past faults on 3 node(s): gpu001, gpu002, gpu003"]
    assert list(paths.textfile("gpu001").iterdir()) == []
    assert resumed == [["gpu001", "gpu003"]] and restarted == [1] and reservations == {} and jobs == []
    # The new Prometheus scrapes every target, then opsctl's --watch starts again and is scraped too.
    assert forgotten == [paths] and waited == [(3, False), (3,)] and watching == [cluster.WATCH_INTERVAL_S]
    for node in ("gpu002", "gpu003"):
        hw = NodeHardware.load(paths.hardware(node), node)
        assert (hw.active, hw.accum, hw.last_xid) == ([], {}, {}), node
        # As new: running DCGM's host engine and dcgm-exporter, which hold its GPUs (the emulated nvidia-smi -r).
        assert hw.monitoring == {"nvidia-dcgm": True, "dcgm-exporter": True}, node
    assert list(paths.opsctl_state.iterdir()) == []
    monkeypatch.setattr(slurm_lab, "node_states", lambda p: {"gpu001": "idle", "gpu002": "idle", "gpu003": "idle"})
    monkeypatch.setattr(prometheus_lab, "nodes_with", lambda expr: set())  # the new Prometheus has no history
    assert CliRunner().invoke(main, ["lab", "reset"]).stdout == "the lab was clean\n"


def test_a_node_the_remediation_ladder_left_down_is_settled_any_other_down_node_is_not():
    """`opsctl lab up` waits for every node to settle: a node that opsctl's ladder rebooted with nextstate=DOWN (or
    left to a person: unvalidated, RMA) is where it belongs, and must not keep `lab up` waiting for ever."""
    from opsctl_lab.slurm_lab import unsettled

    states = {"gpu001": "idle", "gpu002": "down", "gpu003": "down", "gpu004": "down*", "gpu005": "drain",
              "gpu006": "boot"}
    assert unsettled(states, ladder={"gpu002", "gpu004"}) == ["gpu003", "gpu004", "gpu006"]
    assert unsettled(states, ladder=set()) == ["gpu002", "gpu003", "gpu004", "gpu006"]
