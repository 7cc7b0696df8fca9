"""The hosts of an Ansible YAML inventory and how to reach them over SSH, for `opsctl ib fabric-test`.

The inventory is the one `make provision` uses: a hosts.yml file, or its directory with group_vars/
and host_vars/ beside it. Of each host only the connection variables are read (ansible_host,
ansible_port, ansible_user, ansible_ssh_private_key_file, and the UserKnownHostsFile of
ansible_ssh_common_args), with Ansible's precedence: all, then parent groups, then child groups,
then the host. Host ranges such as gpu[001:064] are expanded as Ansible does.
"""

import fnmatch
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from opsctl.errors import ConfigError

_RANGE = re.compile(r"\[([0-9]+|[a-z]):([0-9]+|[a-z])(?::([0-9]+))?\]")
_CONNECTION = ("ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file",
               "ansible_ssh_common_args")


@dataclass(frozen=True)
class SshHost:
    name: str
    address: str
    port: int
    user: str | None
    key_file: str | None
    known_hosts: str | None  # None: the user's ~/.ssh/known_hosts


def expand_host_pattern(name: str) -> list[str]:
    """gpu[001:003] -> gpu001, gpu002, gpu003 (Ansible's inventory ranges, zero padding kept)."""
    match = _RANGE.search(name)
    if not match:
        return [name]
    start, end, step = match[1], match[2], int(match[3] or 1)
    if start.isdigit() != end.isdigit():
        raise ConfigError(f"inventory: bad host range {name!r}")
    if start.isdigit():
        width = len(start) if start.startswith("0") else 0
        values = [str(i).zfill(width) for i in range(int(start), int(end) + 1, step)]
    else:
        values = [chr(c) for c in range(ord(start), ord(end) + 1, step)]
    head, tail = name[:match.start()], name[match.end():]
    return [host for value in values for host in expand_host_pattern(head + value + tail)]


def _vars_file(path: Path) -> dict[str, Any]:
    for candidate in (path.with_suffix(".yml"), path.with_suffix(".yaml"), path):
        if candidate.is_file():
            data = yaml.safe_load(candidate.read_text()) or {}
            if not isinstance(data, dict):
                raise ConfigError(f"inventory: {candidate} is not a mapping")
            return data
    return {}


class Inventory:
    def __init__(self, path: Path):
        path = Path(path)
        hosts_file = next((p for p in (path / "hosts.yml", path / "hosts.yaml") if p.is_file()), None) \
            if path.is_dir() else path
        if hosts_file is None or not hosts_file.is_file():
            raise ConfigError(f"--inventory {path}: no hosts.yml there")
        try:
            raw = yaml.safe_load(hosts_file.read_text())
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"--inventory {hosts_file}: not a readable YAML inventory ({err})") from err
        if not isinstance(raw, dict):
            raise ConfigError(f"--inventory {hosts_file}: not a YAML inventory (INI inventories are not read)")
        self.base = hosts_file.parent
        self.groups: dict[str, list[str]] = {}
        self.host_vars: dict[str, dict[str, Any]] = {}
        for group, body in raw.items():
            self._walk(str(group), body or {}, [])

    def _walk(self, group: str, body: dict[str, Any], parents: list[str]) -> None:
        if not isinstance(body, dict):
            raise ConfigError(f"inventory: group {group} is not a mapping")
        chain = [*parents, group]
        for pattern, host_body in (body.get("hosts") or {}).items():
            for host in expand_host_pattern(str(pattern)):
                for name in chain:
                    self.groups.setdefault(name, []).append(host)
                merged = self.host_vars.setdefault(host, {"_groups": []})
                merged["_groups"] = list(dict.fromkeys([*merged["_groups"], *chain]))
                merged.update({k: v for k, v in (host_body or {}).items() if k in _CONNECTION})
        for child, child_body in (body.get("children") or {}).items():
            self._walk(str(child), child_body or {}, chain)
        self.groups.setdefault(group, [])

    def hosts(self, group: str | None, pattern: str | None) -> list[SshHost]:
        if group is not None and group not in self.groups:
            raise ConfigError(f"inventory: no group {group!r} (groups: {', '.join(sorted(self.groups))})")
        names = list(dict.fromkeys(self.groups[group] if group else self.host_vars))
        if pattern:
            names = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not names:
            raise ConfigError(f"inventory: no host matches {pattern or group!r}")
        return [self._host(name) for name in names]

    def _host(self, name: str) -> SshHost:
        own = self.host_vars[name]
        merged: dict[str, Any] = {}
        for group in ["all", *own["_groups"]]:  # parents before children, as Ansible ranks them
            merged.update({k: v for k, v in _vars_file(self.base / "group_vars" / group).items() if k in _CONNECTION})
        merged.update({k: v for k, v in _vars_file(self.base / "host_vars" / name).items() if k in _CONNECTION})
        merged.update({k: v for k, v in own.items() if k in _CONNECTION})
        known = None
        for word in shlex.split(str(merged.get("ansible_ssh_common_args", ""))):
            if word.startswith("UserKnownHostsFile="):
                known = word.split("=", 1)[1]
        return SshHost(name=name, address=str(merged.get("ansible_host", name)),
                       port=int(merged.get("ansible_port", 22)), user=merged.get("ansible_user"),
                       key_file=merged.get("ansible_ssh_private_key_file"), known_hosts=known)
