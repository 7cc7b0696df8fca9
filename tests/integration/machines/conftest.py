"""The machines, once for every module of this directory: test_machines.py checks the machines
themselves (it stops and starts them once, and leaves them up), test_vendor_repos.py then installs
vendor packages into its GPU machines. The modules run in the order of their file names."""

import sys

import pytest

from tests.integration.machines.support import opsctl


@pytest.fixture(scope="package", autouse=True)
def machines():
    out = opsctl("up")
    assert out.returncode == 0, out.stderr
    sys.stderr.write(out.stdout)  # the phase times, for the CI log
    yield
    opsctl("down", "--purge")
