"""The one Debian 12 image every machine boots from (each machine writes to its own overlay layer).

Built once with debootstrap through the lab's apt cache and reused while its recipe is unchanged: the
recipe's hash is stored in the image, so a changed recipe rebuilds it.
"""

import hashlib
import os
import shutil
from pathlib import Path

from opsctl.lab.machines.proc import run
from opsctl.lab.machines.settings import SUITE, Settings

PACKAGES = ["systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-apt", "iproute2",
            "ca-certificates", "procps", "iputils-ping"]
STAMP = ".opsctl-image-recipe"
RECIPE_VERSION = "1"

# Debian's ssh.service has no key generation step; sshd refuses to start without host keys. Each
# machine gets its own keys from the lab (so known_hosts is exact); this covers any key type missing.
SSH_KEYGEN_DROPIN = "[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n"


def recipe(settings: Settings) -> str:
    text = "\n".join([RECIPE_VERSION, SUITE, settings.mirror, settings.apt_proxy, *PACKAGES, SSH_KEYGEN_DROPIN])
    return hashlib.sha256(text.encode()).hexdigest()


def is_current(settings: Settings) -> bool:
    try:
        return (settings.image_dir / STAMP).read_text().strip() == recipe(settings)
    except OSError:
        return False


def build(settings: Settings) -> bool:
    """Build the image unless the cached one is current. True if it built."""
    if is_current(settings):
        return False
    target = settings.image_dir
    staging = target.with_name(target.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    # debootstrap fetches with wget, which honours http_proxy: the packages land in the apt cache too.
    env = dict(os.environ, http_proxy=settings.apt_proxy)
    run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(staging),
         settings.mirror], env=env, timeout=900)
    _configure(staging, settings)
    (staging / STAMP).write_text(recipe(settings) + "\n")
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return True


def _configure(root: Path, settings: Settings) -> None:
    mirror = settings.mirror.rstrip("/")
    security = mirror.rsplit("/", 1)[0] + "/debian-security"
    (root / "etc/apt/sources.list").write_text(
        f"deb {mirror} {SUITE} main\n"
        f"deb {mirror} {SUITE}-updates main\n"
        f"deb {security} {SUITE}-security main\n"
    )
    # Machines have no route off the lab subnet: apt goes through the cache on the bridge, as on a
    # cluster whose nodes use a site proxy.
    (root / "etc/apt/apt.conf.d/01opsctl-proxy").write_text(f'Acquire::http::Proxy "{settings.apt_proxy}";\n')
    # Host keys are per machine (written into each machine's layer); none may be shared via the image.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    dropin = root / "etc/systemd/system/ssh.service.d"
    dropin.mkdir(parents=True, exist_ok=True)
    (dropin / "opsctl-hostkeys.conf").write_text(SSH_KEYGEN_DROPIN)
    # nspawn gives each machine a machine-id; an empty file lets systemd take it.
    (root / "etc/machine-id").write_text("")
    # No console login on a pipe console; nothing for these units to do in a container.
    for unit in ["getty@tty1.service", "console-getty.service", "systemd-networkd-wait-online.service"]:
        mask = root / "etc/systemd/system" / unit
        mask.unlink(missing_ok=True)
        mask.symlink_to("/dev/null")
    (root / "etc/apt/apt.conf.d/99opsctl-no-recommends").write_text('APT::Install-Recommends "false";\n')
    run(["chroot", str(root), "apt-get", "clean"], check=False)
