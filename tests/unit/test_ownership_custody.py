"""Whose is a reason? Slurm keeps the words opsctl set after opsctl lifted its drain (24.11 without accounting
storage keeps every node's last reason through a resume), and its own drains and DOWNs keep or extend the reason
a node has (`_drain_node()` keeps any reason, `set_node_reason()` appends ` : <note>`; src/slurmctld/node_mgr.c).
Such a node is not opsctl's: the ladder and `--drain-self` leave it alone. The actor knows what it set (its
custody store) and Slurm says who set the reason and when; the text alone decides nothing."""

import time
from dataclasses import replace

import pytest

from opsctl.actor.act import DRAIN, REBOOT, RESUME, Actor, Change
from opsctl.actor.custody import holds
from opsctl.config import parse_config
from opsctl.errors import SourceUnavailable
from opsctl.ladder.node_step import due
from opsctl.ladder.remediate import remediate
from opsctl.nodecheck import REASON_PREFIX, CheckResult, drain_self
from opsctl.slurm.base import RESUMED_REASON, SlurmNode
from tests.unit.fakes import FakeSlurm, World, gpu_nodes, node

XID = "opsctl:xid-79 gpu3 xid=79 count=1"
FAILING = [CheckResult("ib-port-state", "mlx5_2", True)]
PASSING = [CheckResult("ib-port-state", "node", False)]


class KeepsTheReason(FakeSlurm):
    """Slurm 24.11 without accounting storage, as the lab's chroot runs it: a resume lifts the drain and keeps
    the last reason; each reason set records who set it and when (reason_set_by_user, reason_changed_at).
    `refuse` makes scontrol refuse that reason. Slurm's own acts: `slurm_drains` (drain_nodes(): a reason the
    node has stays, unchanged) and `slurm_notes` (set_node_reason(): ` : <note>` appended, by SlurmUser)."""

    def __init__(self, nodes, refuse=None):
        super().__init__(nodes)
        self.refuse = refuse

    def _set(self, name, **fields):
        self.state[name] = replace(self.state[name], reason_user="root", reason_time=time.time(), **fields)

    def drain(self, names, reason):
        super().drain(names, reason)
        for name in names:
            self._set(name)

    def set_reason(self, names, reason):
        if reason == self.refuse:
            self.calls.append(("reason", tuple(names), reason))
            raise SourceUnavailable("Slurm: scontrol update failed: Invalid node name specified")
        super().set_reason(names, reason)
        for name in names:
            self._set(name)

    def reboot(self, names, reason):
        super().reboot(names, reason)
        for name in names:
            self._set(name)

    def resume(self, names):
        kept = {name: self.state[name] for name in names}
        super().resume(names)
        for name, before in kept.items():
            self.state[name] = replace(self.state[name], reason=before.reason, reason_user=before.reason_user,
                                       reason_time=before.reason_time)

    def slurm_drains(self, name, why):
        old = self.state[name]
        self.state[name] = replace(old, flags=tuple(dict.fromkeys((*old.flags, "DRAIN"))))
        if not old.reason:
            self._set(name, reason=why)

    def slurm_notes(self, name, note, state=None, flags=None):
        old = self.state[name]
        self._set(name, reason=f"{old.reason} : {note}" if old.reason else note, state=state or old.state,
                  flags=old.flags if flags is None else tuple(flags))


def config_for(tmp_path, name="state"):
    return parse_config({}, "t", env={"OPSCTL_STATE_DIR": str(tmp_path / name)})


def act(config, slurm, name, event, reason=""):
    with Actor(config, slurm, time.time()) as actor:
        seen = actor.nodes()[name]
        return actor.apply([Change(node=name, event=event, seen=seen, reason=reason, checks=("xid-79",))])


@pytest.mark.parametrize("refuse", [None, RESUMED_REASON], ids=["resume-words-replaced", "replacement-refused"])
def test_defect_4_a_slurm_drain_after_opsctls_resume_is_left_alone_by_the_ladder(tmp_path, refuse):
    config = config_for(tmp_path)
    slurm = KeepsTheReason(gpu_nodes(8), refuse=refuse)
    act(config, slurm, "gpu003", DRAIN, XID)
    act(config, slurm, "gpu003", RESUME)
    assert not slurm.state["gpu003"].drained
    slurm.slurm_drains("gpu003", "Epilog error")  # a job's epilog failed: Slurm drains, the reason stays
    before, calls = slurm.state["gpu003"], len(slurm.calls)
    result = remediate(config, slurm, dry_run=False)
    assert slurm.state["gpu003"] == before and slurm.calls[calls:] == []
    assert not [d for d in result.plan.decisions if d.node == "gpu003" and d.changes]


@pytest.mark.parametrize("refuse", [None, RESUMED_REASON], ids=["resume-words-replaced", "replacement-refused"])
def test_defect_4_a_slurm_drain_after_the_nodes_own_resume_is_left_alone_by_drain_self(tmp_path, refuse):
    config = config_for(tmp_path, "node-state")
    slurm = KeepsTheReason(gpu_nodes(8), refuse=refuse)
    drain_self(config, slurm, "gpu005", FAILING)
    assert slurm.state["gpu005"].reason == f"{REASON_PREFIX} ib-port-state mlx5_2"
    assert drain_self(config, slurm, "gpu005", PASSING).resumed == ["gpu005"]
    slurm.slurm_drains("gpu005", "batch job complete failure")
    before, calls = slurm.state["gpu005"], len(slurm.calls)
    outcome = drain_self(config, slurm, "gpu005", PASSING)
    assert outcome.resumed == [] and slurm.state["gpu005"] == before and slurm.calls[calls:] == []


def test_defect_4_a_reboot_that_slurm_timed_out_is_not_opsctls_reboot_coming_back(tmp_path):
    """The node may never have rebooted: it validates nothing. The head's ladder takes it on: with no BMC to
    power-cycle it, a person's (opsctl:unvalidated), in words that say so."""
    config = config_for(tmp_path)
    slurm = KeepsTheReason(gpu_nodes(8))
    act(config, slurm, "gpu002", DRAIN, XID)
    act(config, slurm, "gpu002", REBOOT, "opsctl:reboot gpu3 xid-79 xid=79 count=1")
    slurm.slurm_notes("gpu002", "reboot issued", state="down", flags=["DRAIN", "REBOOT_ISSUED"])
    slurm.slurm_notes("gpu002", "reboot timed out", flags=[])  # set_node_down_ptr(): DOWN, no reboot flag left
    timed_out = slurm.state["gpu002"]
    assert not timed_out.back_from_reboot and due(timed_out) is None  # the node validates nothing
    remediate(config, slurm, dry_run=False)
    assert slurm.state["gpu002"].reason.startswith(
        "opsctl:unvalidated gpu3 xid-79 the reboot did not come back and no BMC is configured (bmc.protocol)")


def test_opsctls_reboot_coming_back_stays_opsctls(tmp_path):
    """The same reboot, completed: Slurm's own reboot notes are part of opsctl's step."""
    config = config_for(tmp_path)
    slurm = KeepsTheReason(gpu_nodes(8))
    act(config, slurm, "gpu002", DRAIN, XID)
    act(config, slurm, "gpu002", REBOOT, "opsctl:reboot gpu3 xid-79 xid=79 count=1")
    slurm.slurm_notes("gpu002", "reboot issued", state="down", flags=["DRAIN", "REBOOT_ISSUED"])
    slurm.slurm_notes("gpu002", "reboot complete", flags=[])
    with Actor(config, slurm, time.time()) as actor:
        back = actor.nodes()["gpu002"]
    assert back.custody is True and back.back_from_reboot and due(back) is not None


ROOT_AT = {"reason_user": "root", "reason_time": 1000.0}


def record(event, reason, prior="", at=900.0, user="root"):
    return {"event": event, "reason": reason, "prior": prior, "user": user, "at": at}


@pytest.mark.parametrize("node_fields,entry,resumed_at,owned", [
    # what this actor set, as it set it (a later Slurm drain keeps it unchanged: still under opsctl's drain)
    ({"reason": XID, **ROOT_AT}, record(DRAIN, XID), None, True),
    # opsctl resumed it since: the same words are what Slurm kept
    ({"reason": XID, **ROOT_AT}, record(RESUME, "", prior=XID, at=1100.0), None, False),
    ({"reason": XID, "reason_user": "", "reason_time": None}, record(RESUME, "", prior=XID), None, False),
    # the node's own answer after the head's reset: later, by the user opsctl runs as
    ({"reason": "opsctl:validated-pass gpu3 xid-79 after-reset pass", **ROOT_AT},
     record("reset", "opsctl:reset gpu3 xid-79"), None, True),
    # opsctl's words, written by a person's own account
    ({"reason": "opsctl:validated-pass gpu3 xid-79 after-reset pass", "reason_user": "alice", "reason_time": 1000.0},
     record("reset", "opsctl:reset gpu3 xid-79"), None, False),
    # different words older than what this actor set: not what it set, nor anything after it
    ({"reason": "opsctl:validated-pass gpu3 xid-79 after-reset pass", **ROOT_AT},
     record("reset", "opsctl:reset gpu3 xid-79", at=1200.0), None, False),
    # a scontrol that failed after the intent: Slurm still shows what the node had, which was opsctl's
    ({"reason": XID, **ROOT_AT}, record("reset", "opsctl:reset gpu3 xid-79", prior=XID, at=1200.0), None, True),
    # no record here (set before this version, or by the other side's actor): Slurm's record decides
    ({"reason": XID, **ROOT_AT}, None, None, True),
    ({"reason": XID, **ROOT_AT}, None, 1100.0, False),  # older than opsctl's last resume of it: left over
    ({"reason": XID, "reason_user": "slurm", "reason_time": 1000.0}, None, None, False),
])
def test_defect_4_custody_holds_only_what_opsctl_set_and_slurm_says_so(node_fields, entry, resumed_at, owned):
    seen = replace(node("gpu001", flags=["DRAIN"]), **node_fields)
    assert holds(seen, entry, resumed_at, {"root"}) is owned


def test_a_resume_replaces_the_words_only_where_slurm_keeps_them(tmp_path):
    config = config_for(tmp_path)
    keeps, clears = KeepsTheReason(gpu_nodes(4)), FakeSlurm(gpu_nodes(4))
    for slurm in (keeps, clears):
        act(config, slurm, "gpu001", DRAIN, XID)
        act(config, slurm, "gpu001", RESUME)
    assert keeps.calls[-1] == ("reason", ("gpu001",), RESUMED_REASON) and keeps.state["gpu001"].reason == RESUMED_REASON
    assert clears.calls[-1] == ("resume", ("gpu001",)) and clears.state["gpu001"].reason == ""


def test_opsctls_words_left_on_a_node_in_service_are_nobodys_drain():
    """In service with the words a resume left (or kept), a node is neither opsctl's drain nor someone else's:
    a new fault may drain it; drained by Slurm with them, it is Slurm's."""
    for reason in (RESUMED_REASON, XID):
        left = replace(node("gpu001", reason=reason), custody=False if reason == XID else None)
        assert (left.owned, left.leftover, left.foreign_reason, left.owner) == (False, True, False, "opsctl")
        held = replace(left, flags=("DRAIN",))
        assert (held.owned, held.leftover, held.foreign_reason, held.resumable) == (False, False, True, False)
    assert SlurmNode("gpu001", "idle", reason=XID).owned  # not judged: the words decide, as before


@pytest.mark.parametrize("reason", [RESUMED_REASON, XID])
def test_a_new_fault_drains_a_node_in_service_with_the_words_a_resume_left(tmp_path, reason):
    world = World(tmp_path, n=16, gpu010=node("gpu010", reason=reason))
    world.prom.breach("xid-79", "gpu010", "3")
    assert world.run("health", "--drain") == 1
    assert world.slurm.state["gpu010"].drained and world.slurm.state["gpu010"].reason == XID


def test_a_person_drains_a_node_in_service_with_the_words_a_resume_left(tmp_path):
    world = World(tmp_path, n=4, gpu002=node("gpu002", reason=RESUMED_REASON))
    assert world.run("drain", "gpu002", "--reason", "bad dimm") == 0
    assert world.slurm.state["gpu002"].reason == "opsctl:manual bad dimm"
