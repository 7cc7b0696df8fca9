"""The product wheel (what the opsctl role installs on head nodes) carries no lab code; the lab is its
own distribution that joins `opsctl` through an entry point."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


def build_wheel(source: Path, out: Path) -> zipfile.ZipFile:
    """pip builds the wheel as the opsctl role does (pip wheel --no-deps)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "--wheel-dir", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [wheel] = list(out.glob("*.whl"))
    return zipfile.ZipFile(wheel)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, zipfile.ZipFile]:
    """Both wheels, built from a copy of the tree: setuptools stages a build in <source>/build, which `make
    provision` (the opsctl role, on the control host) clears and fills while another stream of `make test`
    may run this test on the same checkout."""
    tmp = tmp_path_factory.mktemp("wheels")
    source = tmp / "source"
    caches = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".ssh", ".facts")
    shutil.copytree(REPO, source, ignore=caches)
    return {"opsctl": build_wheel(source, tmp / "opsctl"), "opsctl-lab": build_wheel(source / "lab", tmp / "lab")}


@pytest.fixture(scope="module")
def wheels(built) -> dict[str, list[str]]:
    return {name: archive.namelist() for name, archive in built.items()}


def test_the_product_wheel_holds_opsctl_and_nothing_of_the_lab(wheels):
    files = wheels["opsctl"]
    packages = {name.split("/")[0] for name in files if not name.startswith("opsctl-")}
    assert packages == {"opsctl"}
    assert "opsctl/health/catalog.yaml" in files and "opsctl/cli.py" in files
    lab_words = ("emulator", "hwtools", "nvidia_smi_q", "nspawn", "lab", "templates")
    assert [name for name in files if any(word in name for word in lab_words)] == []
    metadata = next(name for name in files if name.endswith(".dist-info/METADATA"))
    assert metadata.startswith("opsctl-")


def test_the_product_needs_no_lab_dependency(built):
    archive = built["opsctl"]
    metadata = archive.read(next(n for n in archive.namelist() if n.endswith("METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    always = [r.split(";")[0].strip() for r in requires if "extra ==" not in r]
    assert sorted(r.split(">")[0].split("=")[0] for r in always) == ["PyYAML", "click", "paramiko",
                                                                      "prometheus-client", "requests", "rich"]
    assert any(r.startswith("opsctl-lab") and 'extra == "lab"' in r for r in requires)
    # The dashboards' SDK is only ever an extra: head nodes run opsctl without it.
    sdk = [r for r in requires if r.startswith("grafana-foundation-sdk")]
    assert sdk and all('extra == "dashboards"' in r for r in sdk)


def test_the_lab_wheel_holds_the_emulators_and_registers_the_lab_command(wheels):
    files = wheels["opsctl-lab"]
    assert {name.split("/")[0] for name in files if not name.startswith("opsctl_lab-")} == {"opsctl_lab"}
    for needed in ("opsctl_lab/dcgm_emulator.py", "opsctl_lab/hwtools/nvidia_smi.py",
                   "opsctl_lab/hwtools/nvidia_smi_fields.json", "opsctl_lab/templates/slurm.conf.j2"):
        assert needed in files
    entry_points = next(name for name in files if name.endswith("entry_points.txt"))
    assert entry_points.startswith("opsctl_lab-")
