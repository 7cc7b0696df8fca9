"""The roles pass ansible-lint's production profile, and the code passes the project's linters.
These are the checks `make lint` runs; here they gate CI too."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            pytest.skip(f"{name} is not installed (make venv)")
        return found
    return str(path)


def test_ansible_lint_production_profile_passes():
    proc = subprocess.run([_tool("ansible-lint"), "--offline", "--profile", "production", "--nocolor"],
                          cwd=REPO / "playbooks", capture_output=True, text=True, timeout=600,
                          env={**os.environ, "ANSIBLE_CONFIG": "ansible.cfg"})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Profile 'production' was required, and it passed" in proc.stdout + proc.stderr


def test_yamllint_passes():
    proc = subprocess.run([_tool("yamllint"), "-s", "playbooks", "inventory", ".ansible-lint", ".yamllint"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_ruff_passes():
    proc = subprocess.run([_tool("ruff"), "check", "opsctl", "tests", "bench", "playbooks"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
