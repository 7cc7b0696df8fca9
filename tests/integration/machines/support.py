"""What the modules of the machines tier share: their own lab (network OPSCTL_TEST_LAB_NET, default 1:
10.213.1.0/24, state and inventory in a temporary directory), so that a lab someone is provisioning
(network 0) is left alone; the cached image is shared, and the first run on a host builds it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from opsctl_lab.machines import keys
from opsctl_lab.machines.settings import Settings, machine_names

MACHINES_MARKS = [
    pytest.mark.machines,
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab machines need root"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("systemd-nspawn", "debootstrap", "apt-cacher-ng")),
                       reason="make deps-machines"),
]
ROOT = Path(__file__).resolve().parents[3]
LAB_DIR = Path(f"/tmp/opsctl-test-machines-{os.environ.get('OPSCTL_TEST_LAB_NET', '1')}")
ENV = dict(os.environ, OPSCTL_LAB_NET=os.environ.get("OPSCTL_TEST_LAB_NET", "1"), OPSCTL_LAB_DIR=str(LAB_DIR),
           OPSCTL_LAB_INVENTORY=str(LAB_DIR / "inventory"))
ENV.pop("OPSCTL_LAB_APT_CACHE", None)
NAMES = machine_names(3)  # head, the storage machine and gpu1..gpu3, as `up` starts them
GPUS = [n for n in NAMES if n.startswith("gpu")]
SETTINGS = Settings(net=int(ENV["OPSCTL_LAB_NET"]), state_dir=LAB_DIR / f"machines-{ENV['OPSCTL_LAB_NET']}",
                    inventory_dir=LAB_DIR / "inventory")


def opsctl(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "opsctl", "lab", "machines", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def on(machine, command, check=True, stdin=None, timeout=120):
    out = subprocess.run(keys.ssh_args(SETTINGS, machine) + [command], capture_output=True, text=True,
                         timeout=timeout, input=stdin or "")
    if check:
        assert out.returncode == 0, f"{machine}: {command}: {out.stderr}"
    return out
