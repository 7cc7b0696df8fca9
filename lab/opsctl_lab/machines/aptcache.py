"""apt-cacher-ng on the bridge address: the machines' (and the image build's) only way to the Debian
mirror. It runs as a plain daemon with this tier's own config dir, so it does not touch a system
apt-cacher-ng, and its cache survives `down` (that is what makes a warm `up` fast)."""

import os
import subprocess
import time
from pathlib import Path

from opsctl_lab.errors import LabError
from opsctl_lab.machines.readiness import port_open
from opsctl_lab.machines.settings import APT_PORT, Settings
from opsctl_lab.processes import read_pidfile, stop_pids, write_pidfile

SUPPORT_DIR = Path("/usr/lib/apt-cacher-ng")


def _conf_dir(settings: Settings) -> Path:
    return settings.state_dir / "apt-cacher-ng"


def _pid_file(settings: Settings) -> Path:
    return _conf_dir(settings) / "pid"


def write_config(settings: Settings) -> Path:
    conf = _conf_dir(settings)
    (conf / "log").mkdir(parents=True, exist_ok=True)
    settings.apt_cache_dir.mkdir(parents=True, exist_ok=True)
    # The default Debian backends are public mirrors that do not resolve here: use the host's mirror.
    (conf / "backends_debian").write_text(settings.mirror.rstrip("/") + "/\n")
    (conf / "acng.conf").write_text(
        f"CacheDir: {settings.apt_cache_dir}\n"
        f"LogDir: {conf / 'log'}\n"
        f"SupportDir: {SUPPORT_DIR}\n"
        f"Port: {APT_PORT}\n"
        f"BindAddress: {settings.bridge_addr}\n"
        "Remap-debrep: file:deb_mirror*.gz /debian ; file:backends_debian\n"
        "Remap-secdeb: security.debian.org security.debian.org/debian-security deb.debian.org/debian-security "
        "/debian-security ; deb.debian.org/debian-security\n"
        "ExThreshold: 4\n"
        "ReportPage: acng-report.html\n"
    )
    return conf


def running_pid(settings: Settings) -> int | None:
    return read_pidfile(_pid_file(settings))


def _answers(settings: Settings) -> bool:
    return port_open(settings.bridge_addr, APT_PORT)


def ensure_running(settings: Settings) -> None:
    if running_pid(settings) and _answers(settings):
        return
    conf = write_config(settings)
    log = open(conf / "log" / "daemon.out", "ab")  # noqa: SIM115 - handed to the daemon
    proc = subprocess.Popen(["apt-cacher-ng", "-c", str(conf), "ForeGround=1"], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    write_pidfile(_pid_file(settings), proc.pid)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break  # e.g. the port is taken: fail now, do not let another daemon serve the machines
        if _answers(settings):
            return
        time.sleep(0.1)
    raise LabError(f"apt-cacher-ng did not answer on {settings.bridge_addr}:{APT_PORT}; see {conf / 'log'}")


def stop(settings: Settings) -> None:
    pid = running_pid(settings)
    if pid:
        stop_pids([pid], grace=10)
    try:
        os.unlink(_pid_file(settings))
    except FileNotFoundError:
        pass
