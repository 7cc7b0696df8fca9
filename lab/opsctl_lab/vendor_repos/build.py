"""Build the repositories: one .deb per package and build (dpkg-deb, the data's control fields, the
behaviour's scripts and files), the index (Packages, Release) as the vendor lays it out, signed with the
lab's own key (InRelease and Release.gpg, as apt's Signed-By checks them), and the key published where
the vendor publishes its own. The result is cached by the hash of everything that made it, like the
machine image: a second build is a directory lookup."""

import fcntl
import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import Any

from opsctl_lab.vendor_repos import behaviours, kmod, spec

HERE = Path(__file__).resolve().parent
DEFAULT_CACHE = Path(os.environ.get("OPSCTL_LAB_VENDOR_REPOS", "/var/cache/opsctl/lab-vendor-repos"))
KEY_UID = "opsctl lab vendor repositories <lab@opsctl.invalid>"
# The file name each vendor publishes its key under, beside the repository (the roles fetch it there).
KEY_FILES = {"cuda": "3bf863cc.pub", "doca": "GPG-KEY-Mellanox.pub", "grafana": "gpg.key",
             "schedmd": "slurm.gpg", "lustre": "lustre.gpg", "kernel": "lab.gpg"}


class BuildError(Exception):
    pass


@dataclass(frozen=True)
class Built:
    root: Path  # <cache>/<hash>: one directory per repository under it
    fingerprint: str


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if out.returncode != 0:
        raise BuildError(f"{' '.join(argv[:3])}: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
    return out


def _gpg(home: Path, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return _run(["gpg", "--homedir", str(home), "--batch", "--no-tty", "--quiet", *args], **kwargs)


def ensure_key(cache: Path) -> tuple[Path, str]:
    """The lab's signing key, made once per cache (no passphrase: it signs lab repositories only). Under a lock:
    two `lab machines up` at once on a new host (the provisioning stream and the machines tier) would otherwise
    each see the other's empty key directory, and one of them find no key in it."""
    home = cache / "gnupg"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "gnupg.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not home.exists():
            home.mkdir(mode=0o700)
            _gpg(home, "--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
    listing = _gpg(home, "--with-colons", "--list-secret-keys").stdout
    fingerprints = [line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")]
    if not fingerprints:
        raise BuildError(f"no signing key in {home}")
    return home, fingerprints[0]


def recipe(names: list[str], release: str, fingerprint: str) -> str:
    digest = hashlib.sha256()
    for path in sorted(HERE.glob("*.py")) + [spec.DATA / f"{n}.yml" for n in names]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(f"{release}\0{fingerprint}\0{','.join(names)}".encode())
    # The emulated tools' wrappers, which the packages install.
    digest.update((HERE.parent / "installed_tools.py").read_bytes())
    return digest.hexdigest()[:16]


def _deb_name(package: str, version: str, arch: str) -> str:
    return f"{package}_{version.split(':', 1)[-1]}_{arch}.deb"


def build_deb(package: spec.Package, version: str, release: str, out_dir: Path, work: Path) -> tuple[Path, str]:
    """The .deb of one build, and its control text (for the index)."""
    name = spec.expand(package.package, version, release)
    contents = behaviours.contents(package.role, version, spec.upstream(version))
    tree = work / f"{name}_{version.replace(':', '%')}"
    (tree / "DEBIAN").mkdir(parents=True)
    size = 0
    for path, (mode, text) in contents.files.items():
        target = tree / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)
        size += len(text)
    for script, text in contents.scripts.items():
        target = tree / "DEBIAN" / script
        target.write_text(text)
        target.chmod(0o755)
    control = spec.control(package, version, release, max(1, size // 1024), f"{name} (vendor package, lab build)")
    (tree / "DEBIAN" / "control").write_text(control)
    deb = out_dir / _deb_name(name, version, package.architecture)
    _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(tree), str(deb)])
    return deb, control


def _hashes(data: bytes) -> dict[str, str]:
    return {"MD5sum": hashlib.md5(data).hexdigest(), "SHA1": hashlib.sha1(data).hexdigest(),  # noqa: S324 - apt's index fields
            "SHA256": hashlib.sha256(data).hexdigest()}


def packages_index(debs: list[tuple[Path, str]], base: Path) -> str:
    """Each .deb's control stanza with where it is and its size and hashes (apt's Packages)."""
    stanzas = []
    for deb, control in debs:
        data = deb.read_bytes()
        extra = {"Filename": str(deb.relative_to(base)), "Size": str(len(data)), **_hashes(data)}
        stanzas.append(control + "".join(f"{k}: {v}\n" for k, v in extra.items()))
    return "\n".join(stanzas)


def release_file(repo: spec.Repository, indexes: dict[str, bytes]) -> str:
    fields = [f"Origin: opsctl lab ({repo.name})", f"Label: {repo.name}",
              f"Date: {formatdate(time.time(), usegmt=True)}", "Architectures: amd64 all"]
    if repo.layout == "dists":
        fields += [f"Suite: {repo.suite}", f"Codename: {repo.suite}", f"Components: {repo.component}"]
    text = "\n".join(fields) + "\n"
    for algo, attr in (("MD5Sum", "md5"), ("SHA256", "sha256")):
        text += f"{algo}:\n"
        for rel, data in sorted(indexes.items()):
            text += f" {getattr(hashlib, attr)(data).hexdigest()} {len(data):>8} {rel}\n"
    return text


def build_repository(repo: spec.Repository, out: Path, gnupg: Path, release: str) -> None:
    """One repository under `out`: flat (index and .debs at the top, `deb URL ./` or `deb URL /`) or
    dists/<suite>/<component>/binary-amd64 with pool/<component>/; a vendor with one directory per release
    gets `out/<release>/` each, its key at the top."""
    if repo.releases:
        for index, name in enumerate(repo.releases):
            build_repository(spec.release_view(repo, index), out / name, gnupg, release)
        _publish_key(repo, out, gnupg)
        return
    out.mkdir(parents=True)
    pool = out if repo.layout == "flat" else out / "pool" / repo.component
    pool.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="opsctl-vendor-") as work:
        debs = [build_deb(p, v.replace("${kernel}", release), release, pool, Path(work))
                for p in repo.packages for v in p.versions]
    index_dir = out if repo.layout == "flat" else out / "dists" / repo.suite / repo.component / "binary-amd64"
    index_dir.mkdir(parents=True, exist_ok=True)
    packages = packages_index(debs, out).encode()
    release_dir = out if repo.layout == "flat" else out / "dists" / repo.suite
    prefix = "" if repo.layout == "flat" else f"{repo.component}/binary-amd64/"
    indexes = {f"{prefix}Packages": packages, f"{prefix}Packages.gz": gzip.compress(packages, mtime=0)}
    for rel, data in indexes.items():
        (release_dir / rel).write_bytes(data)
    (release_dir / "Release").write_text(release_file(repo, indexes))
    _gpg(gnupg, "--yes", "--clearsign", "--output", str(release_dir / "InRelease"), str(release_dir / "Release"))
    _gpg(gnupg, "--yes", "--armor", "--detach-sign", "--output", str(release_dir / "Release.gpg"),
         str(release_dir / "Release"))
    _publish_key(repo, out, gnupg)


def _publish_key(repo: spec.Repository, out: Path, gnupg: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / KEY_FILES.get(repo.name, "key.gpg")).write_text(_gpg(gnupg, "--armor", "--export").stdout)


def key_text(built: Built, name: str) -> str:
    """The armored public key as the repository `name` publishes it."""
    return (built.root / name / KEY_FILES.get(name, "key.gpg")).read_text()


def ensure_built(names: list[str] | None = None, cache: Path = DEFAULT_CACHE, release: str | None = None) -> Built:
    """The repositories `names` (default: every data file), built once per recipe; older builds removed."""
    names = names or spec.names()
    release = release or kmod.kernel()
    cache.mkdir(parents=True, exist_ok=True)
    try:
        return _ensure_built(names, cache, release)
    finally:
        # gpg starts an agent for the key's home (to list or use the secret key); the lab leaves no daemon
        # of a build behind.
        subprocess.run(["gpgconf", "--homedir", str(cache / "gnupg"), "--kill", "gpg-agent"], capture_output=True,
                       check=False)


def _ensure_built(names: list[str], cache: Path, release: str) -> Built:
    gnupg, fingerprint = ensure_key(cache)
    root = cache / recipe(names, release, fingerprint)
    if (root / ".complete").exists():
        return Built(root, fingerprint)
    shutil.rmtree(root, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=cache))
    try:
        for name in names:
            build_repository(spec.load(name), staging / name, gnupg, release)
        (staging / ".complete").write_text(",".join(names) + "\n")
        staging.rename(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for old in cache.iterdir():
        if old.is_dir() and old.name not in ("gnupg", root.name) and not old.name.startswith(".building-"):
            shutil.rmtree(old, ignore_errors=True)
    return Built(root, fingerprint)
