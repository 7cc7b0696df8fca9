"""The lab's vendor repositories as data (opsctl_lab.vendor_repos.spec), the control files they make, and
the kernel-module emulation the packages' scripts feed (kmod). The packages themselves are built and
installed with real dpkg and apt in the machines tier (tests/integration/machines/test_vendor_repos.py)."""

from pathlib import Path

import pytest

from opsctl.ib.ofed import OfedVersion, parse_ofed_info
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.machines import boot
from opsctl_lab.vendor_repos import behaviours, kmod, spec

pytestmark = pytest.mark.unit
RELEASE = "6.1.0-28-amd64"


# What the roles pin, per repository: each has the pinned build and a newer one, as the real repositories do.
PINNED = {"cuda": ["nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-persistenced", "nvidia-fabricmanager-570",
                   "libnvidia-nscq-570", "datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12",
                   "datacenter-gpu-manager-exporter"],
          "doca": ["doca-ofed", "mlnx-ofed-kernel-dkms"],
          "lustre": ["lustre-client-utils", "lustre-client-modules-dkms"],
          "grafana": ["grafana"],
          "schedmd": ["slurm-smd", "slurm-smd-slurmctld", "slurm-smd-slurmd", "slurm-smd-client"]}


def test_every_repository_loads_with_two_builds_of_what_the_roles_pin_and_a_source_for_its_fields():
    assert set(PINNED) | {"kernel"} == set(spec.names())
    for name, pinned in PINNED.items():
        repo = spec.load(name)
        assert all(package.origin for package in repo.packages), name  # where its fields come from
        versions = {p: {v for package in repo.packages if package.package == p for v in package.versions}
                    for p in pinned}
        assert all(len(builds) >= 2 for builds in versions.values()), (name, versions)


def test_a_vendor_with_a_directory_per_release_has_one_build_of_each_package_in_each():
    doca = spec.load("doca")
    assert doca.releases == ("2.9.1", "2.9.5")
    first = spec.release_view(doca, 0)
    assert first.package("doca-ofed").versions[0].startswith("2.9.1")
    assert all(len(package.versions) == 1 for package in first.packages)


def test_control_fields_expand_to_the_builds_own_version():
    package = spec.Package(package="nvidia-kernel-open-dkms", versions=("570.133.20-1",),
                           source="nvidia-graphics-drivers",
                           relations={"depends": "nvidia-kernel-common (= ${version}), dkms",
                                      "provides": "nvidia-kernel-dkms-any (= ${upstream})"})
    text = spec.control(package, "570.133.20-1", RELEASE, 12, "x")
    lines = text.splitlines()
    assert lines[:3] == ["Package: nvidia-kernel-open-dkms", "Source: nvidia-graphics-drivers", "Version: 570.133.20-1"]
    assert "Depends: nvidia-kernel-common (= 570.133.20-1), dkms" in lines
    assert "Provides: nvidia-kernel-dkms-any (= 570.133.20)" in lines
    assert spec.upstream("1:4.2.3-1") == "4.2.3" and spec.upstream("2.15.6-1") == "2.15.6"
    assert spec.expand("linux-headers-${kernel}", "1", RELEASE) == f"linux-headers-{RELEASE}"


def test_a_package_without_a_version_is_refused(tmp_path):
    (tmp_path / "bad.yml").write_text("name: bad\nlayout: flat\npackages:\n  - package: x\n")
    with pytest.raises(spec.SpecError, match="at least one version"):
        spec.load("bad", tmp_path)
    (tmp_path / "worse.yml").write_text("name: worse\nlayout: tree\npackages: []\n")
    with pytest.raises(spec.SpecError, match="flat or dists"):
        spec.load("worse", tmp_path)


def _module(root: Path, name: str, **fields: str) -> None:
    kmod.write(kmod.module_path(root, name, RELEASE), {"name": name, **fields})


def _ofed(root: Path, version: str) -> None:
    tree = root / kmod.OFA_ROOT / "x86_64" / RELEASE
    tree.mkdir(parents=True, exist_ok=True)
    (tree / "Module.symvers").write_text(f"0x0\t{kmod.PEER_SYMBOL}\tdrivers/infiniband/core/ib_core\tEXPORT_SYMBOL\t\n")
    (tree / "opsctl-lab-version").write_text(version + "\n")


def test_peermem_built_without_mlnx_ofed_does_not_load(tmp_path):
    _module(tmp_path, "nvidia_peermem", version="570.133.20", needs=kmod.PEER_SYMBOL, ib_core="")
    _ofed(tmp_path, "24.10-1")  # DOCA installed after the driver: the module is already built
    with pytest.raises(kmod.LoadError, match="could not insert 'nvidia_peermem': Invalid argument"):
        kmod.load(tmp_path, "nvidia_peermem", RELEASE, tmp_path / "loaded")
    assert not (tmp_path / "loaded").exists()


def test_peermem_loads_only_against_the_mlnx_ofed_it_was_built_for(tmp_path):
    _ofed(tmp_path, "24.10-1")
    _module(tmp_path, "nvidia_peermem", version="570.133.20", needs=kmod.PEER_SYMBOL, ib_core="24.10-1")
    kmod.load(tmp_path, "nvidia_peermem", RELEASE, tmp_path / "loaded")
    assert (tmp_path / "loaded" / "nvidia_peermem" / "version").read_text() == "570.133.20\n"
    _ofed(tmp_path, "25.01-1")  # a DOCA upgrade that did not rebuild the driver's modules
    with pytest.raises(kmod.LoadError, match="disagrees about version of symbol"):
        kmod.load(tmp_path, "nvidia_peermem", RELEASE, tmp_path / "again")


def test_a_module_no_package_built_is_not_found(tmp_path):
    with pytest.raises(kmod.LoadError, match=f"Module nvidia_peermem not found in directory /lib/modules/{RELEASE}"):
        kmod.load(tmp_path, "nvidia_peermem", RELEASE, tmp_path / "loaded")


def test_the_emulated_tools_ship_at_their_real_paths():
    contents = behaviours.contents("nvidia-smi", "570.133.20-1", "570.133.20")
    assert list(contents.files) == ["/usr/bin/nvidia-smi"]
    mode, text = contents.files["/usr/bin/nvidia-smi"]
    assert mode == 0o755 and "opsctl_lab.hwtools.nvidia_smi" in text
    dkms = behaviours.contents("nvidia-dkms", "570.133.20-1", "570.133.20").scripts["postinst"]
    assert "/usr/src/ofa_kernel/default" in dkms and "ib_core=$ofed" in dkms
    assert behaviours.contents("", "1", "1") == behaviours.Contents()


def _modules_load(root: Path, directory: str, name: str, text: str) -> None:
    path = root / directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_boot_loads_the_installed_driver_and_the_modules_of_modules_load_d(tmp_path):
    _ofed(tmp_path, "24.10-1")
    _module(tmp_path, "nvidia", version="570.172.08")
    _module(tmp_path, "nvidia_peermem", version="570.172.08", needs=kmod.PEER_SYMBOL, ib_core="24.10-1")
    _modules_load(tmp_path, "etc/modules-load.d", "opsctl-nvidia.conf", "# boot\nnvidia_peermem\n")
    loaded = tmp_path / "modules"
    (loaded / "left_from_the_last_boot").mkdir(parents=True)
    hw = NodeHardware(node="gpu1")
    assert hw.driver_version != "570.172.08"
    assert boot.boot(hw, tmp_path, loaded, RELEASE) == []
    assert hw.driver_version == "570.172.08"  # what nvidia-smi reports from now on
    assert sorted(p.name for p in loaded.iterdir()) == ["nvidia", "nvidia_peermem"]


def test_a_boot_names_a_module_the_kernel_refuses_and_keeps_an_emulated_driver_without_a_package(tmp_path):
    _module(tmp_path, "nvidia_peermem", version="570.133.20", needs=kmod.PEER_SYMBOL, ib_core="")  # built before DOCA
    _modules_load(tmp_path, "usr/lib/modules-load.d", "opsctl-nvidia.conf", "nvidia_peermem\n")
    hw = NodeHardware(node="gpu1", driver_version="570.86.15")
    failures = boot.boot(hw, tmp_path, tmp_path / "modules", RELEASE)
    assert failures == ["Failed to insert module 'nvidia_peermem': modprobe: ERROR: could not insert "
                        "'nvidia_peermem': Invalid argument"]
    assert hw.driver_version == "570.86.15" and list((tmp_path / "modules").iterdir()) == []


def test_modules_load_d_a_file_in_etc_hides_the_same_name_in_usr_lib(tmp_path):
    _modules_load(tmp_path, "usr/lib/modules-load.d", "a.conf", "hidden\n")
    _modules_load(tmp_path, "etc/modules-load.d", "a.conf", "; comment\nfirst\n\n")
    _modules_load(tmp_path, "usr/lib/modules-load.d", "b.conf", "second\nfirst\n")
    assert boot.modules_to_load(tmp_path) == ["first", "second"]


def test_ko2iblnd_loads_only_against_the_ib_core_it_was_built_for(tmp_path):
    """Whamcloud's prebuilt ko2iblnd (the kernel's ib_core) loads until DOCA-OFED's replaces it; a DKMS build
    against that MLNX_OFED loads with it, and not after another MLNX_OFED."""
    path = tmp_path / "lib/modules" / RELEASE / "updates/kernel/net/lustre/ko2iblnd.ko"
    kmod.write(path, {"name": "ko2iblnd", "version": "2.15.6", "ib_core": kmod.IN_KERNEL})
    kmod.load(tmp_path, "ko2iblnd", RELEASE, tmp_path / "loaded")
    _ofed(tmp_path, "24.10-1")
    with pytest.raises(kmod.LoadError, match=f"disagrees about version of symbol {kmod.IB_CORE_SYMBOL}"):
        kmod.load(tmp_path, "ko2iblnd", RELEASE, tmp_path / "loaded")
    kmod.write(path, {"name": "ko2iblnd", "version": "2.15.6", "ib_core": "24.10-1"})
    kmod.load(tmp_path, "ko2iblnd", RELEASE, tmp_path / "after-doca")
    assert (tmp_path / "after-doca" / "ko2iblnd").is_dir()
    _ofed(tmp_path, "25.01-1")
    with pytest.raises(kmod.LoadError, match="disagrees about version of symbol"):
        kmod.load(tmp_path, "ko2iblnd", RELEASE, tmp_path / "again")


def test_the_lustre_packages_install_their_modules_where_lustre_release_puts_them():
    prebuilt = behaviours.contents("lustre-prebuilt", "2.15.6-1", "2.15.6").files
    ko2iblnd = next(text for path, (_, text) in prebuilt.items() if path.endswith("/net/lustre/ko2iblnd.ko"))
    assert f"ib_core={kmod.IN_KERNEL}" in ko2iblnd.split()
    dkms = behaviours.contents("lustre-dkms", "2.15.6-1", "2.15.6").scripts["postinst"]
    # configure's choice (lustre-lnet.m4): MLNX_OFED's tree when ofed_info is there; the install never fails.
    assert "command -v ofed_info" in dkms and "/usr/src/ofa_kernel/default" in dkms
    assert '"ib_core=$ib_core" > "/lib/modules/$release/updates/kernel/net/lustre/ko2iblnd.ko"' in dkms
    files = behaviours.contents("ofed-info", "24.10.OFED.24.10.1.1.4-1", "24.10.OFED.24.10.1.1.4").files
    assert list(files) == ["/usr/bin/ofed_info"]


def test_the_emulated_ofed_info_names_mlnx_ofeds_release_as_the_real_one_does():
    """`ofed_info -s`: MLNX_OFED_LINUX-<year.month>-<build>.0:, which `opsctl node check` reads."""
    _, script = behaviours.contents("ofed-info", "24.10.OFED.24.10.3.2.5-1", "24.10.OFED.24.10.3.2.5").files[
        "/usr/bin/ofed_info"]
    assert 'if [ "$1" = -s ]; then echo "MLNX_OFED_LINUX-24.10-3.2.5.0:"; exit 0; fi' in script
    assert parse_ofed_info("MLNX_OFED_LINUX-24.10-3.2.5.0:\n") == OfedVersion("MLNX_OFED_LINUX", "24.10-3.2.5.0")
