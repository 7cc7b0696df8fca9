"""The NVSwitch fabric on the simulated cluster: Fabric Manager down on every node at once (as after a
rollout of a driver that the installed Fabric Manager does not match) is one fabric fault, which the
circuit breaker stops and names, not 64 node faults to drain. A fault on one node is drained with its
rule's reason by the verdict table of test_health_lab.py.

The breaker names a shared cause only when every failing node fails the fabric's rules alone, so the test
starts from a lab where no node fails anything. It runs after test_lab_lifecycle.py, whose `lab reset`
empties Prometheus' history of the earlier modules' faults (a DBE's step counts for 10 minutes); it
removes what node checks wrote (a failed InfiniBand check fails until a node check passes), and waits out
any XID still in its 5-minute windowed count."""

import pytest

from tests.integration.lab.health_support import HealthLab

pytestmark = pytest.mark.lab


def test_fabric_manager_down_on_every_node_drains_none_and_names_the_fabric(lab, tmp_path):
    h = HealthLab(lab, tmp_path)
    for result in lab.lab_dir.glob("nodes/*/textfile/*.prom"):
        result.unlink()
    failing = {"before": None}

    def calm():
        failing["before"] = _failing(h)
        return not failing["before"]
    try:
        lab.wait_until(calm, 330, "no node failing before the fault", interval=5)
    except AssertionError as err:
        raise AssertionError(f"{err}; still failing: {failing['before']}") from None
    try:
        assert h.opsctl("lab", "inject", "all", "fabricmanager-down").returncode == 0

        def all_failing():
            _, result = h.health_json()
            return result["_summary"]["fail"] == lab.nodes and result

        result = lab.wait_until(all_failing, 90, "every node failing fabric-manager-down", interval=2)
        assert all("fabric-manager-down" in _fabric_checks(v) for n, v in result.items() if n != "_summary")
        before = h.slurm()
        code, result = h.health_json("--drain")
        summary = result["_summary"]
        assert code == 4 and summary["outage"] == "fabric" and summary["drained"] == 0, (summary, {
            n: sorted(c["id"] for c in v["checks"]) for n, v in result.items() if n != "_summary" and v["checks"]})
        assert summary["safety_stop"].startswith("circuit breaker: fabric (fabric-manager-down), a fleet-wide "
                                                 "NVSwitch fabric fault")
        assert {n: s.reason for n, s in h.slurm().items()} == {n: s.reason for n, s in before.items()}
        text = h.opsctl("health", "--drain")
        assert text.returncode == 4 and text.stdout.splitlines()[1].split()[:3] == [
            "fabric", "fail", "skip:circuit-breaker"]
    finally:
        h.opsctl("lab", "clear", "all")
        h.cleanup()
    # Trained again, the fabric reads ok once the hold has passed: later tests meet a calm lab.
    lab.wait_until(lambda: not any(_fabric_checks(v) for n, v in h.health_json()[1].items() if n != "_summary"), 90,
                   "the fabric to read ok again", interval=2)


def _failing(h: HealthLab) -> dict[str, list[str]]:
    """node -> the checks it fails, for every failing node."""
    _, result = h.health_json()
    return {n: sorted(c["id"] for c in v["checks"] if c["status"] == "fail") for n, v in result.items()
            if n != "_summary" and v["status"] == "fail"}


def _fabric_checks(verdict: dict) -> set[str]:
    return {c["id"] for c in verdict["checks"] if c["id"].startswith("fabric-")}
