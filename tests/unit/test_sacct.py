"""Slurm's accounting as `opsctl why` and `opsctl suspects` read it (opsctl/slurm/accounting.py): real
`sacct --json` of 22.05, 24.11 and 26.05 (tests/fixtures/slurm/sacct-*, captured with each release's
slurmdbd and MariaDB: tools/capture_sacct.py), one job for each way a job ends."""

import json
from pathlib import Path

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.slurm.accounting import parse_sacct

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
RELEASES = ["22.05.8", "24.11.5", "26.05.5"]
# The captured jobs (the same script on every release): id, state, nodes.
ENDS = {
    "failed": ("1", "FAILED", ("gpu001", "gpu002", "gpu003", "gpu004")),
    "completed": ("2", "COMPLETED", ("gpu005",)),
    "timeout": ("3", "TIMEOUT", ("gpu001",)),
    "cancelled": ("4", "CANCELLED", ("gpu002", "gpu003")),
    "node-fail": ("5", "NODE_FAIL", ("gpu004", "gpu005")),
}


def capture(release: str, what: str) -> str:
    return (FIXTURES / f"sacct-{release}-{what}.json").read_text()


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("what", sorted(ENDS))
def test_each_way_a_job_ends_reads_alike_on_every_release(release, what):
    [job] = parse_sacct(capture(release, what))
    assert (job.id, job.state, job.nodes) == ENDS[what]
    assert job.start is not None and job.end is not None and job.end >= job.start and job.ended
    assert job.failed == (what != "completed")
    # 23.02+ state lists and {"set", "number"} objects become the same values as 22.05's plain ones.
    raw = json.loads(capture(release, what))["jobs"][0]
    assert job.start == float(raw["time"]["start"]) and job.end == float(raw["time"]["end"])


@pytest.mark.parametrize("release", RELEASES)
def test_a_listing_and_a_node_filter_give_every_job_once(release):
    every = parse_sacct(capture(release, "all-X"))
    assert [(j.id, j.state) for j in every] == [(v[0], v[1]) for v in ENDS.values()]
    assert {j.id for j in parse_sacct(capture(release, "N-gpu002"))} == {"1", "4"}  # the jobs gpu002 was in


def test_a_node_fail_names_its_node_from_24_11_on():
    assert [parse_sacct(capture(r, "node-fail"))[0].failed_node for r in RELEASES] == ["", "gpu005", "gpu005"]


def test_the_exit_code_is_read_where_the_release_gives_it():
    # 24.11 and later give the failed batch script's return code; 22.05's JSON says 0 (its text says 1).
    assert parse_sacct(capture("24.11.5", "failed"))[0].exit == "exit 1"
    assert parse_sacct(capture("22.05.8", "failed"))[0].exit == ""


def test_nothing_found_is_no_job_and_other_errors_are_the_source_failing():
    # 22.05 answers a query that matches nothing with an error entry (captured in the lab, `-j 99999`).
    empty = {"jobs": [], "errors": [{"description": "Nothing found", "error_number": 9003,
                                     "error": "Nothing found with query", "source": "slurmdb_jobs_get"}]}
    assert parse_sacct(json.dumps(empty)) == []
    with pytest.raises(SourceUnavailable, match="Slurm reported an error: Unable to connect"):
        parse_sacct(json.dumps({"jobs": [], "errors": [{"error": "Unable to connect to database"}]}))
    for text in ("not json", "[]", '{"jobs": [{"name": "x"}]}', '{"jobs": [{"job_id": 7, "state": {}}]}'):
        with pytest.raises(SourceUnavailable):
            parse_sacct(text)


def test_a_requeued_job_counts_once_its_last_run():
    raw = json.loads(capture("26.05.5", "failed"))
    first = json.loads(json.dumps(raw["jobs"][0]))
    first["state"]["current"] = ["REQUEUED"]
    raw["jobs"].insert(0, first)
    [job] = parse_sacct(json.dumps(raw))
    assert job.state == "FAILED"
