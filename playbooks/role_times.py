"""Time per role of a playbook run, from the JUnit files of ansible-core's own `ansible.builtin.junit`
callback (`make provision` enables it; `python playbooks/role_times.py DIR`).

The junit callback times every task on every host (testcase `time`, from the task's start to that
host's result) and names the task's file (`classname="roles/slurm_common/tasks/main.yml:12"`). A task's wall
time is that of its slowest host; a role's is the sum over its tasks. Tasks outside a role (fact
gathering, play tasks) are summed as "(outside roles)". The per-role profile callbacks
(`profile_roles`, `profile_tasks`) live in the ansible.posix collection, which ansible-core lacks.
"""

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUTSIDE = "(outside roles)"
_ROLE = re.compile(r"(?:^|/)roles/([^/]+)/")
_HOST = re.compile(r"^\[([^\]]*)\] ")


def role_times(junit_files: list[Path]) -> dict[str, float]:
    """role -> seconds, in the order the roles first ran."""
    slowest: dict[tuple[str, str], float] = {}
    role_of: dict[tuple[str, str], str] = {}
    for path in junit_files:
        for case in ET.parse(path).iter("testcase"):
            name = case.get("name", "")
            host = _HOST.match(name)
            if host and host.group(1) == "include":
                continue  # the include itself, beside the hosts' own results: counted by its tasks
            task = (case.get("classname", ""), name[host.end():] if host else name)
            seconds = float(case.get("time") or 0)
            slowest[task] = max(seconds, slowest.get(task, 0.0))
            role = _ROLE.search(task[0])
            role_of[task] = role.group(1) if role else OUTSIDE
    totals: dict[str, float] = {}
    for task, seconds in slowest.items():
        totals[role_of[task]] = totals.get(role_of[task], 0.0) + seconds
    return totals


def render(totals: dict[str, float]) -> str:
    width = max([len(role) for role in totals] + [5])
    lines = ["== provision: time per role (ansible.builtin.junit, slowest host per task):"]
    lines += [f"   {role:{width}}  {seconds:7.1f} s" for role, seconds in sorted(totals.items(), key=lambda i: -i[1])]
    lines.append(f"   {'total':{width}}  {sum(totals.values()):7.1f} s")
    return "\n".join(lines)


def main(directory: str) -> int:
    files = sorted(Path(directory).glob("*.xml"))
    if not files:
        sys.stderr.write(f"== provision: no JUnit file in {directory}: no time per role\n")
        return 0
    sys.stdout.write(render(role_times(files)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
