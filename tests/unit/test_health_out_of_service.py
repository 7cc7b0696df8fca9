"""What is out of service shows in plain `opsctl health`: the summary line counts drained and down nodes
by whose they are (opsctl's automatic drains, `opsctl drain`, others), and a `--resume` plan says when
each node that waits out its healthy period becomes eligible."""

import json
import re
from datetime import datetime

from tests.unit.fakes import IB_REASON, World, node


def cluster(tmp_path, **raw):
    return World(tmp_path, raw=raw or None,
                 gpu040=node("gpu040", flags=("DRAIN",), reason=IB_REASON),
                 gpu041=node("gpu041", "idle", flags=("DRAIN",), reason="opsctl:manual bad fan"),
                 gpu042=node("gpu042", "idle", flags=("DRAIN",), reason="ticket-123 bad dimm"),
                 gpu043=node("gpu043", "down", flags=("NOT_RESPONDING",), reason="Not responding"))


def test_the_summary_line_counts_drained_and_down_nodes_by_whose_they_are(tmp_path):
    w = cluster(tmp_path)
    assert w.run("health") == 0
    assert w.stdout.splitlines()[-1].startswith(
        "64 nodes: 64 ok, 0 warn, 0 fail, 0 unknown; out of service: 3 drained, 1 down "
        "(1 by opsctl, 1 by opsctl drain, 2 by others); ")
    _, _, summary = w.json()
    assert summary["out_of_service"] == {"drained": 3, "down": 1, "opsctl_auto": 1, "opsctl_manual": 1, "others": 2}


def test_a_cluster_in_service_says_nothing_more(tmp_path):
    w = World(tmp_path)
    assert w.run("health") == 0 and "out of service" not in w.stdout
    assert w.json()[2]["out_of_service"] == {"drained": 0, "down": 0, "opsctl_auto": 0, "opsctl_manual": 0,
                                             "others": 0}


def test_a_resume_plan_says_when_a_waiting_node_becomes_eligible(tmp_path):
    w = cluster(tmp_path, safety={"resume_after": "10m"})
    assert w.run("health", "--resume", "--dry-run") == 0
    [line] = [line for line in w.stdout.splitlines() if line.startswith("gpu040")]
    assert "skip:healthy-period" in line
    match = re.search(r"resume eligible at (\S+Z) \(in (\d+)m(\d\d)s\)", line)
    assert match and 9 * 60 <= int(match.group(2)) * 60 + int(match.group(3)) <= 600
    doc = json.loads(w.run("health", "--resume", "--dry-run", "--json") == 0 and w.stdout)
    [gpu040] = [n for n in doc["nodes"] if n["node"] == "gpu040"]
    assert gpu040["action"] == "skip:healthy-period"
    seconds = (datetime.fromisoformat(gpu040["eligible_at"]) - datetime.fromisoformat(match.group(1))).total_seconds()
    assert 0 <= seconds <= 5  # the second run's clock, a moment later
    assert all("eligible_at" not in n for n in doc["nodes"] if n["node"] != "gpu040")


def test_a_node_slurm_powers_down_asap_is_neither_drained_nor_resumed(tmp_path):
    # POWER_DRAIN: `scontrol power down asap` (Slurm 23.02+); the node powers off once its jobs end.
    w = World(tmp_path, raw={"safety": {"resume_after": "0s"}},
              gpu050=node("gpu050", "mixed", flags=("POWER_DRAIN",)),
              gpu051=node("gpu051", "idle", flags=("DRAIN", "POWER_DRAIN"), reason=IB_REASON))
    w.prom.breach("xid-79", "gpu050", "3")
    code, nodes, summary = w.json("--drain", "--resume")
    assert (nodes["gpu050"]["status"], nodes["gpu050"]["action"]) == ("fail", "skip:slurm-state")
    assert nodes["gpu051"]["action"] == "skip:slurm-state"
    assert w.slurm.calls == [] and summary["out_of_service"]["down"] == 1 and summary["drained"] == 0
