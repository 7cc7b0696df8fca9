"""The one Debian 12 image every machine boots from (each machine writes to its own overlay layer).

Built once with debootstrap through the lab's apt cache and reused while its recipe is unchanged.
Each recipe has its own directory (`<image_dir>/<recipe hash>`): a changed recipe builds a new image
next to the old one, so machines still running on the old one keep their lower layer; an old image
is deleted once no machine runs on it.
"""

import fcntl
import hashlib
import os
import shutil
from pathlib import Path

from opsctl_lab.machines.settings import PROVISIONING_HOME, PROVISIONING_UID, PROVISIONING_USER, SUITE, Settings
from opsctl_lab.processes import run

# initramfs-tools: every Debian node has it (its kernel's package depends on it, and the nvidia role
# rebuilds the initramfs after a driver change); the machines boot the host's kernel, so no kernel package
# brings it in here.
PACKAGES = ["systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-apt", "iproute2",
            "ca-certificates", "procps", "iputils-ping", "sudo", "initramfs-tools"]
# The Debian build chain of the DKMS modules the GPU machines build (the driver's, MLNX_OFED's, Lustre's:
# the Depends of mlnx-ofed-kernel-dkms and of lustre-release's lustre-client-modules-dkms and
# lustre-client-utils, vendor_repos/data/), as GPU node images usually carry it. Installed once here, not
# in every GPU machine at its first `make provision` (about 40 s of it with three machines on 2 cores);
# the roles still install what depends on it, and apt finds it there. The running kernel's headers are
# not here: they come from the lab's kernel repository, as a node's come from its distribution.
BUILD_CHAIN = ["dkms", "build-essential", "autoconf", "automake", "bison", "flex", "libtool", "pkg-config",
               "module-assistant", "libaio-dev", "libkeyutils-dev", "libkrb5-dev", "libselinux1-dev", "libssl-dev",
               "libyaml-dev", "libnl-genl-3-dev", "zlib1g-dev", "libmount-dev", "libsnmp-dev", "python3-dev",
               "python3-distutils", "linux-base", "lsof", "pciutils", "udev"]
STAMP = ".opsctl-image-recipe"
RECIPE_VERSION = "4"

# Debian's ssh.service has no key generation step; sshd refuses to start without host keys. Each
# machine gets its own keys from the lab (so known_hosts is exact); this covers any key type missing.
SSH_KEYGEN_DROPIN = "[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n"
# The provisioning account may run anything as root without a password, as Ansible's become needs.
SUDOERS = f"{PROVISIONING_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"


def recipe(settings: Settings) -> str:
    text = "\n".join([RECIPE_VERSION, SUITE, settings.mirror, *PACKAGES, *BUILD_CHAIN, SSH_KEYGEN_DROPIN, SUDOERS,
                      f"{PROVISIONING_USER}:{PROVISIONING_UID}:{PROVISIONING_HOME}"])
    return hashlib.sha256(text.encode()).hexdigest()


def path(settings: Settings) -> Path:
    return settings.image_dir / recipe(settings)[:16]


def is_current(settings: Settings) -> bool:
    try:
        return (path(settings) / STAMP).read_text().strip() == recipe(settings)
    except OSError:
        return False


def build(settings: Settings) -> bool:
    """Build the image unless the cached one is current. True if it built."""
    settings.image_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.image_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another lab on this host may be building it right now
        if is_current(settings):
            return False
        _build(settings)
    _prune(settings)
    return True


def _in_use(image: Path) -> bool:
    needle = f"-D {image} ".encode()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "cmdline").read_bytes().replace(b"\0", b" "):
                return True
        except OSError:
            continue
    return False


def _prune(settings: Settings) -> None:
    current = path(settings)
    for old in settings.image_dir.iterdir():
        # Only what this module made: <16 hex digits> images and their .new staging dirs.
        name = old.name.removesuffix(".new")
        if (len(name) == 16 and all(c in "0123456789abcdef" for c in name) and old.is_dir()
                and old != current and not _in_use(old)):
            shutil.rmtree(old, ignore_errors=True)


def _build(settings: Settings) -> None:
    target = path(settings)
    staging = target.with_name(target.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    # debootstrap fetches with wget, which honours http_proxy: the packages land in the apt cache too.
    env = dict(os.environ, http_proxy=settings.apt_proxy)
    run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(staging),
         settings.mirror], env=env, timeout=900)
    _configure(staging, settings)
    _install_build_chain(staging, env)
    (staging / STAMP).write_text(recipe(settings) + "\n")
    shutil.rmtree(target, ignore_errors=True)  # an incomplete one (no stamp); nothing boots from it
    staging.rename(target)


def _install_build_chain(root: Path, env: dict[str, str]) -> None:
    # apt, not debootstrap's --include: debootstrap's resolver takes no alternatives or virtual packages.
    apt = ["chroot", str(root), "apt-get", "-q", "-y", "-o", f"Acquire::http::Proxy={env['http_proxy']}"]
    run([*apt, "update"], env=env, timeout=600)
    run([*apt, "install", "--no-install-recommends", *BUILD_CHAIN], env={**env, "DEBIAN_FRONTEND": "noninteractive"},
        timeout=900)
    run(["chroot", str(root), "apt-get", "clean"], check=False)


def _configure(root: Path, settings: Settings) -> None:
    mirror = settings.mirror.rstrip("/")
    security = mirror.rsplit("/", 1)[0] + "/debian-security"
    (root / "etc/apt/sources.list").write_text(
        f"deb {mirror} {SUITE} main\n"
        f"deb {mirror} {SUITE}-updates main\n"
        f"deb {security} {SUITE}-security main\n"
    )
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
    # minbase has no locales; pam_env logs an error at every login without this file.
    (root / "etc/default/locale").write_text("LANG=C.UTF-8\n")
    (root / "etc/apt/apt.conf.d/99opsctl-no-recommends").write_text('APT::Install-Recommends "false";\n')
    run(["chroot", str(root), "useradd", "--create-home", "--home-dir", PROVISIONING_HOME, "--shell", "/bin/bash",
         "--uid", str(PROVISIONING_UID), "--user-group", PROVISIONING_USER])
    sudoers = root / "etc/sudoers.d" / PROVISIONING_USER
    sudoers.write_text(SUDOERS)
    sudoers.chmod(0o440)
    run(["chroot", str(root), "apt-get", "clean"], check=False)
