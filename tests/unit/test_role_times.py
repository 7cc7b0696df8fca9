"""`make provision` ends with the time per role, from the JUnit file of ansible-core's own junit
callback (a real one: tests/fixtures/ansible/junit-two-roles.xml). The provision tier checks the
summary at the end of a real `make provision`."""

import importlib.util

from tests.conftest import FIXTURES, REPO

spec = importlib.util.spec_from_file_location("role_times", REPO / "playbooks" / "role_times.py")
role_times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(role_times)
JUNIT = FIXTURES / "ansible" / "junit-two-roles.xml"


def test_a_role_is_the_sum_of_its_tasks_each_at_its_slowest_host():
    totals = role_times.role_times([JUNIT])
    assert list(totals) == ["(outside roles)", "alpha", "beta"]
    # alpha: one task, slowest host 7.379 s; beta: 0.430 + 0.674 (the include on its slowest host, not the
    # [include] pseudo-host) + 6.546 s; outside: facts 18.770 + play task 0.302 s.
    assert round(totals["alpha"], 2) == 7.38
    assert round(totals["beta"], 2) == round(0.4297945 + 0.6742568 + 6.5458584, 2)
    assert round(totals["(outside roles)"], 2) == round(18.7699833 + 0.3015354, 2)


def test_the_summary_lists_roles_slowest_first_with_a_total():
    lines = role_times.render(role_times.role_times([JUNIT])).splitlines()
    assert lines[0].startswith("== provision: time per role")
    assert [line.split()[0] for line in lines[1:]] == ["(outside", "beta", "alpha", "total"]
    assert lines[-1].split()[-2:] == [f"{18.7699833 + 0.3015354 + 7.3788073 + 0.4297945 + 0.6742568 + 6.5458584:.1f}",
                                      "s"]


def test_no_junit_file_says_so_and_fails_nothing(tmp_path, capsys):
    assert role_times.main(str(tmp_path)) == 0
    assert "no JUnit file" in capsys.readouterr().err
