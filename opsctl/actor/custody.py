"""Whether opsctl still holds the reason a node shows: the actor's record of what it set, against Slurm's record
of who set the reason and when.

Every change the actor makes writes a custody entry before scontrol runs (actor/state.py, `custody`):

    {"event": "reset", "reason": "opsctl:reset gpu3 xid-79 ...", "prior": "opsctl:xid-79 gpu3 ...",
     "user": "root", "at": 1796540637.2}

`prior` is the reason the node had when that reason was opsctl's own (what Slurm still shows if scontrol failed
or the run died after the intent), "" otherwise; a resume's `reason` is "" and its `prior` the words it lifted.
Slurm says who set the node's reason and when: `reason_set_by_user` and `reason_changed_at` in the JSON of
every release from 22.05 (its `sinfo --json`) to 26.05 (`scontrol show nodes --json`), `ReasonUser` and
`ReasonTime` in `scontrol show node`. Slurm's own acts leave its record as it shows:

- slurmctld's own drains (`drain_nodes()`: Epilog error, Prolog/Epilog failure, batch job complete failure,
  a bad registration) keep a reason the node has, its user and its time (`_drain_node()`,
  src/slurmctld/node_mgr.c); slurmstepd's "Kill task failed" is an update request that replaces the reason
  (`stepd_drain_node()`, src/slurmd/slurmstepd/mgr.c), so that one reads as someone else's by its words;
- a DOWN for a slurmd that stopped answering keeps the reason whole on 22.05 (`set_node_down_ptr()`), and from
  23.02 appends ` : Not responding` as SlurmUser, now (`set_node_reason()`);
- a resume keeps the last reason on 24.11 and earlier without accounting storage (`clusteracct_storage_g_node_up()`
  clears it only with an accounting plugin before 26.05: SchedMD/slurm cd41b6164d, "Resuming nodes clears
  reason without database").

So opsctl holds a node's reason (its words are opsctl's, judged by SlurmNode.opsctl_words) when:

- its last entry is a drain, reboot or re-wording and the node shows that reason, or the one before it (a
  reboot's notes appended by Slurm included), whatever Slurm did with the state since;
- its last entry is a resume: never the words that resume lifted, which are what Slurm kept; other opsctl words
  only when set after the resume, by the user opsctl runs as (the node's own actor, or the head's, set them);
- its last entry set other words: the other side's actor re-worded it since (the node answers the head's
  reset with `validated-*`, the head steps after the node's drain): set after the entry, by opsctl's user;
- there is no entry (a reason set before this version, or by the other side's actor, which keeps its own
  store): set by opsctl's user, and not before opsctl's last recorded resume of the node (resumed.json).

Where Slurm does not say who or when (a backend without the fields), that part is not judged.
"""

import os
import pwd
from typing import Any

from opsctl.slurm.base import SLURM_NOTE, SlurmNode

RESUME = "resume"
# The clocks of the actor's host and slurmctld's may differ this much (NTP keeps them far closer).
CLOCK_SKEW_S = 5.0


def effective_user() -> str:
    """The user Slurm records for opsctl's own scontrol calls (MUNGE sends the effective uid)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def entry(event: str, reason: str, prior: str, user: str, at: float) -> dict[str, Any]:
    """One custody entry (the store keeps the last one per node); the reasons without Slurm's notes."""
    return {"event": event, "reason": reason.split(SLURM_NOTE, 1)[0], "prior": prior.split(SLURM_NOTE, 1)[0],
            "user": user, "at": at}


def holds(node: SlurmNode, last: dict[str, Any] | None, resumed_at: float | None, users: set[str]) -> bool:
    """Whether opsctl holds `node`'s reason (opsctl's words assumed), from its last custody entry here (None
    when there is none), the time of opsctl's last recorded resume of it and the users opsctl runs as."""
    if last is None:
        return _by(node, users) and not _before(node, resumed_at)
    shown = node.reason.split(SLURM_NOTE, 1)[0]
    if last.get("event") == RESUME:
        if shown == str(last.get("prior") or ""):
            return False
    elif shown in (str(last.get("reason") or ""), str(last.get("prior") or "")):
        return True
    at = last.get("at")
    return _by(node, users | {str(last.get("user") or "")}) and \
        not _before(node, float(at) if isinstance(at, (int, float)) else None)


def _by(node: SlurmNode, users: set[str]) -> bool:
    return not node.reason_user or node.reason_user in users


def _before(node: SlurmNode, when: float | None) -> bool:
    """Slurm says the reason was set before `when` (False when either time is unknown)."""
    return when is not None and node.reason_time is not None and node.reason_time < when - CLOCK_SKEW_S
