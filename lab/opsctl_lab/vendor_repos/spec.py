"""The repositories as data: data/<name>.yml, one entry per binary package with every build the
repository carries, its relations as the vendor's control file writes them (`${version}` for the
build's own version, as `${binary:Version}` expands; `${upstream}` for it without the Debian revision;
`${kernel}` for the lab machines' kernel release)."""

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).resolve().parent / "data"
RELATION_FIELDS = (("pre_depends", "Pre-Depends"), ("depends", "Depends"), ("recommends", "Recommends"),
                   ("conflicts", "Conflicts"), ("breaks", "Breaks"), ("provides", "Provides"),
                   ("replaces", "Replaces"))
_NAME = re.compile(r"^[a-z0-9][a-z0-9+.${}-]+$")


class SpecError(ValueError):
    pass


@dataclass(frozen=True)
class Package:
    package: str
    versions: tuple[str, ...]
    architecture: str = "amd64"
    source: str = ""
    relations: dict[str, str] = field(default_factory=dict)
    role: str = ""
    origin: str = ""  # the `from:` of the data: where its fields come from


@dataclass(frozen=True)
class Repository:
    name: str
    layout: str  # flat: `deb URL <suite>` (suite "/" or "./"); dists: dists/<suite>/<component>
    suite: str
    component: str
    packages: tuple[Package, ...]
    # Vendors that publish one directory per release (DOCA): the n-th version of each package is in the
    # n-th release's directory, `<repository>/<release>/`. Empty: one directory with every version.
    releases: tuple[str, ...] = ()

    def package(self, name: str) -> Package:
        for package in self.packages:
            if package.package == name:
                return package
        raise KeyError(name)


def upstream(version: str) -> str:
    """The version without its epoch and Debian revision: 1:4.2.3-1 -> 4.2.3."""
    without_epoch = version.split(":", 1)[-1]
    return without_epoch.rsplit("-", 1)[0] if "-" in without_epoch else without_epoch


def expand(text: str, version: str, kernel: str) -> str:
    return (text.replace("${version}", version).replace("${upstream}", upstream(version))
            .replace("${kernel}", kernel))


def _package(raw: dict[str, Any], where: str) -> Package:
    name = str(raw.get("package", ""))
    versions = raw.get("versions") or []
    if not _NAME.match(name) or not versions:
        raise SpecError(f"{where}: a package needs a valid name and at least one version: {raw!r}")
    relations = {key: " ".join(str(raw[key]).split()) for key, _ in RELATION_FIELDS if raw.get(key)}
    return Package(package=name, versions=tuple(str(v) for v in versions),
                   architecture=str(raw.get("architecture", "amd64")), source=str(raw.get("source", "")),
                   relations=relations, role=str(raw.get("role", "")), origin=str(raw.get("from", "")))


def load(name: str, data: Path = DATA) -> Repository:
    path = data / f"{name}.yml"
    raw = yaml.safe_load(path.read_text())
    layout = raw.get("layout")
    if layout not in ("flat", "dists"):
        raise SpecError(f"{path}: layout must be flat or dists, not {layout!r}")
    packages = tuple(_package(p, str(path)) for p in raw.get("packages") or [])
    releases = tuple(str(r) for r in raw.get("releases") or [])
    if releases and any(len(p.versions) != len(releases) for p in packages):
        raise SpecError(f"{path}: with releases {list(releases)}, every package needs one version per release")
    return Repository(name=raw["name"], layout=layout, suite=str(raw.get("suite", "./")),
                      component=str(raw.get("component", "main")), packages=packages, releases=releases)


def release_view(repo: Repository, index: int) -> Repository:
    """The directory of the index-th release: each package with that release's version only."""
    packages = tuple(Package(p.package, (p.versions[index],), p.architecture, p.source, p.relations, p.role,
                             p.origin) for p in repo.packages)
    return Repository(repo.name, repo.layout, repo.suite, repo.component, packages)


def names(data: Path = DATA) -> list[str]:
    return sorted(p.stem for p in data.glob("*.yml"))


def control(package: Package, version: str, kernel: str, installed_size_kib: int,
            description: str) -> str:
    """The DEBIAN/control of one build, fields in dpkg's order."""
    name = expand(package.package, version, kernel)
    lines = [f"Package: {name}"]
    if package.source:
        lines.append(f"Source: {package.source}")
    lines += [f"Version: {version}", f"Architecture: {package.architecture}",
              "Maintainer: opsctl lab <lab@opsctl.invalid>", f"Installed-Size: {installed_size_kib}"]
    for key, label in RELATION_FIELDS:
        if key in package.relations:
            lines.append(f"{label}: {expand(package.relations[key], version, kernel)}")
    lines += ["Section: non-free/libs" if package.architecture != "all" else "Section: misc", "Priority: optional",
              f"Description: {description}",
              f" opsctl lab build of {name} {version}: the vendor's control fields, the lab's emulated",
              " behaviour (lab/opsctl_lab/vendor_repos)."]
    return "\n".join(lines) + "\n"
