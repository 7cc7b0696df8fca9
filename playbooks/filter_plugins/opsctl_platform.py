"""Jinja filters for the platforms the roles support (Debian 12, Ubuntu 22.04, Ubuntu 24.04).

platform_name: the name every role's vars/ files and the preflight use for a host's platform:

    {{ ansible_facts | platform_name }}                 -> 'ubuntu-24.04' (or 'debian-12')

platform_vars_files: the files a role's platform.yml hands to the first_found lookup, most specific
first (distribution and version, then distribution and major version, then the family floor):

    {{ ansible_facts | platform_vars_files(role_path) }}
    -> ['<role>/vars/ubuntu-24.04.yml', '<role>/vars/ubuntu-24.yml', '<role>/vars/debian.yml']

version_misfit: why a pinned distribution package version cannot be installed on this platform
(a Debian build on Ubuntu, a build for another release), or '' when nothing speaks against it:

    {{ '0.5.15-2+deb12u1' | version_misfit('ubuntu-24.04') }}
    -> 'a Debian 12 build (+deb12), not for ubuntu-24.04'

pin_misfits: version_misfit for a dict of pinned versions, as one message per pin that does not fit:

    {{ {'munge_version': '0.5.15-2+deb12u1'} | pin_misfits('ubuntu-24.04') }}
    -> ['munge_version 0.5.15-2+deb12u1 is a Debian 12 build (+deb12), not for ubuntu-24.04']

packages_matching: the package names that match any of the glob patterns (the common role holds them):

    {{ ['nvidia-fabricmanager-570', 'chrony'] | packages_matching(['nvidia-*', 'munge']) }}
    -> ['nvidia-fabricmanager-570']

packages_to_hold: of dpkg-query's `<status> <want> <name>` lines, the installed packages that match and
are not held yet:

    {{ ['installed install munge', 'installed hold slurmd', 'config-files deinstall grafana']
       | packages_to_hold(['munge', 'slurmd', 'grafana']) }}  -> ['munge']

packages_not_installed: of package specs as the apt module takes them (`name`, `name=version`,
`name=version*`), those that dpkg-query's `<name> <version> <status>` lines do not show installed
(status `ii`, or `hi` once held) at a matching version:

    {{ ['munge=0.5.15-2', 'slurmd'] | packages_not_installed(['munge 0.5.15-2 hi', 'slurmd 22.05.8-4 rc']) }}
    -> ['slurmd']

packages_upgradable: of package names, those whose candidate in `apt-cache policy <names>`'s output is not
the installed version (a package not installed, or that apt does not know, included):

    {{ ['mlnx-ofed-kernel-dkms'] | packages_upgradable(policy.stdout) }}  -> [] when Installed == Candidate

host_addresses: the address each host gets in /etc/hosts: cluster_address, else ansible_host when it
is an IP address, else the default IPv4 address of its facts (this run's or the fact cache's); None
when none is known. A host name in ansible_host is never written as an address:

    {{ ['gpu001'] | host_addresses(hostvars) }}  -> [{'name': 'gpu001', 'address': '10.20.1.1'}]

cluster_address: that address for one host. The exporters and servers bind it and Prometheus scrapes
it, never a name: on the host itself a name may resolve to the stock `127.0.1.1 <hostname>` line of
/etc/hosts, and a service bound there answers the host's own check but not Prometheus:

    {{ inventory_hostname | cluster_address(hostvars) }}  -> '10.20.1.1'
"""

import fnmatch
import ipaddress
import re

# Debian point releases are "12.8"; the platform is the major release. Ubuntu's is "24.04".
_MAJOR_ONLY = {"debian"}


def platform_name(facts: dict) -> str:
    distribution = str(facts.get("distribution", "")).lower()
    version = str(facts.get("distribution_version", ""))
    if distribution in _MAJOR_ONLY:
        version = str(facts.get("distribution_major_version", version.split(".")[0]))
    return f"{distribution}-{version}"


def platform_vars_files(facts: dict, role_path: str) -> list[str]:
    distribution = str(facts.get("distribution", "")).lower()
    return [
        f"{role_path}/vars/{platform_name(facts)}.yml",
        f"{role_path}/vars/{distribution}-{facts.get('distribution_major_version', '')}.yml",
        f"{role_path}/vars/{str(facts.get('os_family', '')).lower()}.yml",
    ]


def version_misfit(version: str, platform: str) -> str:
    """Debian spells its builds +debNNuM / ~debNNuM; Ubuntu's stable updates spell the release
    (0ubuntu0.22.04.3, 1ubuntu1.22.04.3). A version naming another platform cannot be installed."""
    text = str(version)
    debian = re.search(r"[+~]deb(\d+)", text)
    if debian and platform != f"debian-{debian.group(1)}":
        return f"a Debian {debian.group(1)} build (+deb{debian.group(1)}), not for {platform}"
    # +bN: a Debian binary rebuild (binNMU), a version only Debian's archive has.
    if re.search(r"\+b\d+$", text) and not platform.startswith("debian-"):
        return f"a Debian binary rebuild (+b{text.rsplit('+b', 1)[1]}), not for {platform}"
    if "ubuntu" in text and not platform.startswith("ubuntu-"):
        return f"an Ubuntu build, not for {platform}"
    release = re.search(r"ubuntu\d+(?:\.\d+)?\.(\d\d\.\d\d)(?:\.\d+)?$", text)
    if release and platform != f"ubuntu-{release.group(1)}":
        return f"a build for Ubuntu {release.group(1)}, not for {platform}"
    return ""


def pin_misfits(pins: dict, platform: str) -> list[str]:
    return [f"{name} {value} is {version_misfit(value, platform)}"
            for name, value in sorted(pins.items()) if value and version_misfit(value, platform)]


def packages_matching(names, patterns) -> list[str]:
    return sorted(name for name in names if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns))


def packages_to_hold(selections, patterns) -> list[str]:
    """The installed packages that match a pattern and are not held yet, from dpkg-query lines
    `<status> <want> <name>` (`installed install slurmd`, `installed hold munge`)."""
    unheld = [fields[2] for fields in (str(line).split() for line in selections)
              if len(fields) == 3 and fields[0] == "installed" and fields[1] != "hold"]
    return packages_matching(unheld, patterns)


def packages_not_installed(specs, installed_lines) -> list[str]:
    installed = {fields[0]: fields[1] for fields in (str(line).split() for line in installed_lines)
                 if len(fields) >= 3 and fields[2] in ("ii", "hi")}
    missing = []
    for spec in specs:
        name, _, version = str(spec).partition("=")
        have = installed.get(name)
        # The apt module matches a version with a wildcard as fnmatch does, and one without exactly.
        if have is None or (version and not fnmatch.fnmatchcase(have, version)):
            missing.append(spec)
    return missing


def packages_upgradable(names, policy_output) -> list[str]:
    """apt's candidate is never older than the installed version unless a pin of priority 1000 or more
    asks for it: a candidate that differs is a change to make."""
    seen: dict[str, dict[str, str]] = {}
    package = None
    for line in str(policy_output).splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            package = seen.setdefault(line[:-1], {})
        elif package is not None and line.strip().startswith(("Installed:", "Candidate:")):
            key, _, value = line.strip().partition(":")
            package[key] = value.strip()
    return [name for name in names
            if name not in seen or seen[name].get("Installed", "(none)") in ("(none)", "")
            or seen[name].get("Installed") != seen[name].get("Candidate")]


def _ip_or_none(text) -> str | None:
    try:
        return str(ipaddress.ip_address(str(text)))
    except ValueError:
        return None


def cluster_address(host, hostvars) -> str | None:
    hv = hostvars[host]
    address = hv.get("cluster_address") or _ip_or_none(hv.get("ansible_host", ""))
    if not address:
        facts = hv.get("ansible_facts") or {}
        address = (facts.get("default_ipv4") or {}).get("address")
    return address or None


def host_addresses(hosts, hostvars) -> list[dict]:
    return [{"name": host, "address": cluster_address(host, hostvars)} for host in hosts]


class FilterModule:
    def filters(self):
        return {
            "platform_name": platform_name,
            "platform_vars_files": platform_vars_files,
            "version_misfit": version_misfit,
            "pin_misfits": pin_misfits,
            "packages_matching": packages_matching,
            "packages_to_hold": packages_to_hold,
            "packages_not_installed": packages_not_installed,
            "packages_upgradable": packages_upgradable,
            "host_addresses": host_addresses,
            "cluster_address": cluster_address,
        }
