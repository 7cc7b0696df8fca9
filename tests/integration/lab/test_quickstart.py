"""The README's quickstart, pasted as written into one shell, on the session's lab: a lab that earlier
tests ran and left with faults, drains and audit entries, as on a machine where a previous lab ran.
Every command exits as the README implies and prints what its comments say.

The last file of the lab tier (file order): the quickstart ends with `opsctl lab down`. The README's
URLs name slot 0's Prometheus port; a lab in another slot ($OPSCTL_LAB_SLOT) gets its own port put in.
"""

import json
import os
import re
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.lab
COMMENT = re.compile(r"\s{2,}#\s?(.*)$")
README_PROMETHEUS = "http://127.0.0.1:19090"


def quickstart() -> list[tuple[str, str]]:
    """(command, comment) for each line of the README's quickstart block."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Quickstart", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = []
    for line in block.splitlines():
        comment = COMMENT.search(line)
        lines.append((line[:comment.start()] if comment else line, comment[1] if comment else ""))
    return [(command.strip(), comment) for command, comment in lines if command.strip()]


def run_as_pasted(commands: list[str], env: dict) -> list[tuple[str, int]]:
    """Runs the commands in one bash, as a terminal would (no `set -e`), and returns each one's output
    and exit status."""
    script = "".join(f"echo '@@@ {i}'\n{command}\necho \"@@@ rc $?\"\n" for i, command in enumerate(commands))
    proc = subprocess.run(["bash"], input=script, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=env)
    parts = re.split(r"^@@@ \d+\n", proc.stdout + proc.stderr, flags=re.M)[1:]
    results = []
    for part in parts:
        body, _, rc = part.rpartition("@@@ rc ")
        results.append((body, int(rc.split()[0])))
    assert len(results) == len(commands), proc.stdout[-3000:] + proc.stderr[-3000:]
    return results


def test_the_readme_quickstart_gives_the_outputs_it_shows(lab):
    lines = quickstart()
    commands = [command.replace(README_PROMETHEUS, lab.prometheus_url) for command, _ in lines]
    env = {**os.environ, "OPSCTL_LAB_DIR": str(lab.lab_dir),
           "OPSCTL_LAB_SLOT": lab.env.get("OPSCTL_LAB_SLOT", "0")}
    out = dict(zip([command for command, _ in lines], run_as_pasted(commands, env), strict=True))

    def output(command: str, rc: int = 0) -> str:
        body, status = out[command]
        assert status == rc, f"{command}: exit {status}\n{body}"
        return body

    for command in ("make deps-lab venv", ". .venv/bin/activate", 'eval "$(opsctl lab env)"', "sleep 25"):
        output(command)
    assert re.search(r"^lab ready: 64 nodes \(", output("opsctl lab up"), re.M)
    reset = output("opsctl lab reset")
    assert reset.strip() == "the lab was clean" or reset.startswith(("cleared ", "removed ", "resumed ", "emptied ")), \
        reset
    sinfo = [line.split() for line in output("sinfo").splitlines()[1:]]
    # The gpu partition, and the validation jobs' one (Hidden=YES hides it from users, not from root).
    assert [(row[0], row[3], row[4]) for row in sinfo] == [("gpu*", "64", "idle"), ("validate", "64", "idle")], sinfo
    curl = next(command for command in out if command.startswith("curl "))
    series = json.loads(output(curl))["data"]["result"]
    assert {(s["metric"]["node"], s["metric"]["gpu"], s["metric"]["xid"]) for s in series
            if float(s["value"][1]) > 0} == {("gpu007", "3", "79")}, series
    health = output("opsctl health --drain", rc=1)  # exit 1: failing nodes found (README, exit codes)
    rows = [line.split() for line in health.splitlines()[1:] if line.startswith("gpu")]
    assert [row[0] for row in rows if row[2] == "drain"] == ["gpu007"], health
    assert "; 1 drained" in health.splitlines()[-1], health  # the opsctl: reason shows in `sinfo -R`
    reasons = output("sinfo -R").splitlines()
    assert reasons[0].split()[0] == "REASON" and len(reasons) == 2, reasons
    assert reasons[1].startswith("opsctl:xid-79 gpu3") and "gpu007" in reasons[1], reasons
    assert output("opsctl lab clear gpu007").strip() == "cleared gpu007: xid:79 gpu3"
    assert "gpu007" in output("opsctl resume gpu007")
    # A training job on 4 nodes, killed by the XID on one of them: `opsctl why` names that node and GPU.
    why = output("opsctl why $job --wait 60")
    assert re.search(r"^job \d+ \(wrap, user \w+\): FAILED on gpu\[010-013\]", why, re.M), why
    assert "likely culprit: gpu012" in why and "  gpu012: xid-79 gpu3 xid=79" in why, why
    assert output("opsctl lab clear gpu012").strip() == "cleared gpu012: xid:79 gpu3"
    output("opsctl lab down")
