"""The provision tests' ansible-playbook runs, started while this process's stdin is non-blocking.

ssh makes its stdin non-blocking while it runs, and that flag belongs to the open file, shared by every
program that inherited it: the provision tests watch Slurm over ssh (a sampler thread) while a playbook
starts, and ansible-playbook refuses to start on a non-blocking stdin ("Ansible requires blocking IO").
Each run must therefore get a stdin of its own.
"""

import fcntl
import os

import pytest

from tests.integration.provision.support import BackgroundPlaybook, playbook


@pytest.fixture
def non_blocking_stdin():
    """fd 0 of this process: /dev/null opened non-blocking, as an ssh beside it leaves it; put back after."""
    saved = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY | os.O_NONBLOCK)
    os.dup2(null, 0)
    os.close(null)
    assert fcntl.fcntl(0, fcntl.F_GETFL) & os.O_NONBLOCK
    try:
        yield
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_a_playbook_run_starts_whatever_this_processs_stdin(non_blocking_stdin, tmp_path):
    assert playbook("--list-tasks", timeout=300).returncode == 0
    run = BackgroundPlaybook("--list-tasks", log=tmp_path / "run.log")
    try:
        done = run.finish(300)
    finally:
        run.stop()
    assert done.returncode == 0, done.stdout[-3000:]
    assert "Ansible requires blocking IO" not in done.stdout
