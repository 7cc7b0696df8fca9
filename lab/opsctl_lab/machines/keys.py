"""SSH trust for the lab: one client key for root on every machine, and per-machine host keys that
the lab makes itself, so known_hosts is written from the keys, never learnt on first contact."""

from pathlib import Path

from opsctl_lab.machines.settings import Settings
from opsctl_lab.processes import run


def ensure_client_key(settings: Settings) -> str:
    key = settings.ssh_key
    key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "opsctl-lab", "-f", str(key)])
    key.chmod(0o600)
    return Path(f"{key}.pub").read_text().strip()


def ensure_host_key(upper: Path, name: str) -> None:
    """An ed25519 host key in the machine's own layer, made before its first boot."""
    key = upper / "etc/ssh/ssh_host_ed25519_key"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)])


def write_known_hosts(settings: Settings, uppers: dict[str, Path]) -> None:
    lines = []
    for name, upper in sorted(uppers.items()):
        algo, blob = Path(upper / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
        lines.append(f"{name},{settings.addr(name)} {algo} {blob}")
    settings.known_hosts.parent.mkdir(parents=True, exist_ok=True)
    settings.known_hosts.write_text("\n".join(lines) + "\n")


def ssh_args(settings: Settings, name: str, user: str = "root") -> list[str]:
    """ssh to a machine as the inventory does: lab key, lab known_hosts, strict checking. The lab's own
    commands log in as root; provisioning logs in as its own user."""
    return ["ssh", "-i", str(settings.ssh_key), "-o", f"UserKnownHostsFile={settings.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
            "-o", "LogLevel=ERROR", f"{user}@{settings.addr(name)}"]
