"""tests/run.py, the script behind `make test`: its streams cover every tier once, its closing table, its one
exit code, and --tests. Running the streams themselves is `make test`'s own business."""

import signal
from pathlib import Path

import pytest

from tests.conftest import TIERS
from tests.run import STREAMS, StreamResult, parse_selections, run_exit_code, summary_table


def result(name: str, exit_code: int | None, counted: bool = True) -> StreamResult:
    return StreamResult(name, 61.4, 12.6, exit_code, Path(f"/tmp/logs/{name}.log"), counted)


def test_the_streams_are_named_after_their_tiers_and_run_each_tier_once():
    tiers = [tier for stream in STREAMS for tier in stream.name.split("+")]
    assert sorted(tiers) == sorted(["lint", *TIERS])
    assert [s.name for s in STREAMS if not s.yields_cpu] == ["provision"]


def test_the_run_passes_only_when_every_counted_stream_passed():
    passed = [result("provision", 0), result("lab", 0), result("slurm chroot build", 1, counted=False)]
    assert run_exit_code(passed) == 0
    assert run_exit_code([*passed, result("lint+component+machines+unit", 1)]) == 1
    assert run_exit_code([*passed, result("lint+component+machines+unit", None)]) == 1  # never started
    assert run_exit_code([*passed, result("lab", -signal.SIGKILL)]) == 1
    assert run_exit_code(passed, stopped_by=signal.SIGINT) == 130


def test_the_closing_table_has_each_streams_wall_time_exit_code_and_log():
    table = summary_table([result("provision", 0), result("lab", -signal.SIGKILL),
                           result("lint+component+machines+unit", None),
                           result("slurm chroot build", 1, counted=False)], 1770.2).splitlines()
    assert table[0] == "==== tests/run.py: 1770 s in all"
    assert table[1].split() == ["stream", "wall", "s", "CPU", "s", "exit", "log"]
    assert table[2].split() == ["provision", "61", "13", "0", "/tmp/logs/provision.log"]
    assert table[3].split()[-2] == "SIGKILL"
    assert table[4].split()[-3:-1] == ["not", "run"]
    assert table[5].startswith("slurm chroot build (not counted) ")
    assert len({line.index(" 61 ") for line in table[2:6]}) == 1  # the columns line up


def test_tests_replaces_a_streams_selection_split_as_a_shell_does():
    selections = parse_selections(["lab=tests/integration/lab/test_lab.py -k 'drain and not resume'"],
                                  ["lab", "provision"])
    assert selections == {"provision": ["-m", "provision", "tests/integration"],
                          "lab": ["tests/integration/lab/test_lab.py", "-k", "drain and not resume"]}


@pytest.mark.parametrize("override", ["lab", "nosuch=tests/unit", "lint+component+machines+unit=tests/unit"])
def test_tests_names_a_stream_that_runs(override):
    with pytest.raises(ValueError, match="expected NAME=ARGS"):
        parse_selections([override], ["lab", "provision"])


def test_the_quickstart_is_the_last_file_of_the_lab_tier():
    """It ends with `opsctl lab down` (tests/integration/lab/test_quickstart.py): a lab test file that sorts after
    it finds no lab."""
    lab = Path(__file__).parents[1] / "integration" / "lab"
    assert sorted(p.name for p in lab.glob("test_*.py"))[-1] == "test_quickstart.py"
