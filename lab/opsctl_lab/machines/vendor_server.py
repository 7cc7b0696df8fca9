"""The built vendor repositories (opsctl_lab.vendor_repos) over HTTP on the bridge address, as a vendor's
server or a site mirror serves them: a plain static file server (Python's http.server) as a daemon of this
tier, beside apt-cacher-ng (aptcache.py), with its own PID file.
The machines reach it directly (their apt proxy setting exempts the bridge address); vendor_vars says
where each repository is and which key signs it, in the roles' variables."""

import sys
import time
from pathlib import Path

from opsctl_lab import processes
from opsctl_lab.errors import LabError
from opsctl_lab.machines.readiness import port_open
from opsctl_lab.machines.settings import VENDOR_PORT, Settings
from opsctl_lab.vendor_repos import build

NAME = "vendor-repos"  # its PID file and log in the tier's state directory


def _pid_file(settings: Settings) -> Path:
    return settings.state_dir / f"{NAME}.pid"  # where processes.start writes it


def running_pid(settings: Settings) -> int | None:
    return processes.read_pidfile(_pid_file(settings))


def ensure_serving(settings: Settings, built: build.Built) -> None:
    """Serve `built.root`; a server of an older build is replaced."""
    served = settings.state_dir / f"{NAME}.root"
    if (running_pid(settings) and port_open(settings.bridge_addr, VENDOR_PORT) and served.exists()
            and served.read_text() == str(built.root)):
        return
    stop(settings)
    pid = processes.start(NAME, [sys.executable, "-m", "http.server", "--bind", settings.bridge_addr,
                                 "--directory", str(built.root), str(VENDOR_PORT)],
                          settings.state_dir, settings.state_dir)
    served.write_text(str(built.root))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and processes.alive(pid):
        if port_open(settings.bridge_addr, VENDOR_PORT):
            return
        time.sleep(0.1)
    raise LabError(f"the vendor repositories did not answer on {settings.bridge_addr}:{VENDOR_PORT}; "
                   f"see {settings.state_dir / (NAME + '.log')}")


def stop(settings: Settings) -> None:
    processes.stop(NAME, settings.state_dir, timeout=5)


def vendor_vars(settings: Settings, built: build.Built) -> dict[str, str]:
    """The roles' repository variables for the lab: URLs on the bridge, the lab key's fingerprint. The
    only difference from a production inventory's repositories (there: the vendors' URLs and keys)."""
    url = settings.vendor_url
    return {
        "nvidia_cuda_repo_url": f"{url}/cuda/",
        "nvidia_cuda_repo_key_fingerprint": built.fingerprint,
        # DOCA's directories name the release, as NVIDIA's do: the inventory's nvidia_doca_version chooses.
        "nvidia_doca_repo_url": f"{url}/doca/{{{{ nvidia_doca_version }}}}/",
        "nvidia_doca_repo_key_url": f"{url}/doca/{build.KEY_FILES['doca']}",
        "nvidia_doca_repo_key_fingerprint": built.fingerprint,
        # Whamcloud-style: a directory of .deb files with their file names (the lab's is also indexed).
        "lustre_client_repo_url": f"{url}/lustre/",
        "grafana_apt_repository": f"{url}/grafana",
        "grafana_apt_key_url": f"{url}/grafana/{build.KEY_FILES['grafana']}",
        "grafana_apt_key_fingerprint": built.fingerprint,
    }
