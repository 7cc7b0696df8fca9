"""The vendors' repositories in their real shape (opsctl_lab.vendor_repos), installed from with real apt in
the lab machines: the nvidia role's install path with the production variables (and the whole role, its
reboot included), DCGM, the Lustre client from DKMS, and the defects the emulation must be able to show (a
pin on the named packages only; the driver built before DOCA; Lustre's prebuilt modules under DOCA).

Runs after test_machines.py on the same machines (conftest.py); each test uses a GPU machine of its own
or one that an earlier test of this module prepared, in file order."""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from opsctl_lab.hardware import GPUS_PER_NODE
from opsctl_lab.vendor_repos import build, spec
from tests.integration.machines.support import ENV, LAB_DIR, MACHINES_MARKS, ROOT, SETTINGS, on

pytestmark = MACHINES_MARKS
ROLE = ROOT / "playbooks" / "roles" / "nvidia"
DRIVER = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["nvidia_driver_version"]
BRANCH = DRIVER.split(".")[0]
PINNED = f"{DRIVER}-1"
NEWER = next(v for v in spec.load("cuda").package("nvidia-driver-cuda").versions if v != PINNED)
# The lab inventory's variables of the machines' emulated kernel (its module loading and /sys/module).
LAB_KERNEL = {name: value for name, value in
              yaml.safe_load((ROOT / "inventory" / "lab" / "group_vars" / "gpu_nodes.yml").read_text()).items()
              if name in ("nvidia_modprobe_command", "nvidia_loaded_modules_dir")}
MODPROBE = " ".join(LAB_KERNEL["nvidia_modprobe_command"])
PEERMEM_LOAD = f"{MODPROBE} nvidia_peermem"
APT = "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=120 --no-install-recommends"


def platform_packages(kind: str) -> list[str]:
    """The role's Debian 12 packages of one kind (driver_packages, fabric_packages, doca_packages)."""
    text = (ROLE / "vars" / "debian-12.yml").read_text()
    text = text.replace("{{ nvidia_driver_version }}", DRIVER).replace("{{ nvidia_driver_branch }}", BRANCH)
    doca = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["nvidia_doca_version"]
    text = text.replace("{{ nvidia_doca_version }}", doca)
    return yaml.safe_load(text)["_nvidia_platform"][kind]


def boot_id(machine: str) -> str:
    return on(machine, "cat /proc/sys/kernel/random/boot_id").stdout


def installed(machine: str) -> dict[str, str]:
    out = on(machine, "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n'").stdout
    return {line.split()[0]: line.split()[1] for line in out.splitlines() if line.split()[2:] in (["ii"], ["hi"])}


def run_role(machine: str, tmp_path: Path, play: str = "nvidia_install.yml", *extra: str,
             tags: str = "") -> subprocess.CompletedProcess:
    """A play of plays/ (default: the nvidia role's install) against `machine`, with inventory/example's group
    variables, the lab's hosts.yml (connection data) and vendor-repos.yml (the lab's repositories); `extra`
    are extra variables (name=value, or JSON), `tags` the run's --tags."""
    inventory = tmp_path / "inventory"
    inventory.mkdir(parents=True)
    (inventory / "group_vars").symlink_to(ROOT / "inventory" / "example" / "group_vars")
    for name in ("hosts.yml", "vendor-repos.yml"):
        (inventory / name).write_text((LAB_DIR / "inventory" / name).read_text())
    env = dict(ENV, ANSIBLE_CONFIG=str(ROOT / "playbooks" / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    return subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory),
                           str(Path(__file__).with_name("plays") / play), "-e", f"target={machine}",
                           *(arg for value in extra for arg in ("-e", value)), *(["--tags", tags] if tags else [])],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_the_repositories_are_served_signed_and_built_once(tmp_path):
    built = build.ensure_built()
    assert build.ensure_built() == built  # the cached build, not a second one
    for name in spec.names():
        repo = spec.load(name)
        base = f"{SETTINGS.vendor_url}/{name}/"
        index = f"{repo.releases[0]}/InRelease" if repo.releases else \
            "InRelease" if repo.layout == "flat" else f"dists/{repo.suite}/InRelease"
        # What the lab serves on the bridge verifies against the key it publishes where the vendor does.
        key, signed = tmp_path / f"{name}.asc", tmp_path / f"{name}-InRelease"
        key.write_bytes(urllib.request.urlopen(base + build.KEY_FILES[name], timeout=10).read())
        signed.write_bytes(urllib.request.urlopen(base + index, timeout=10).read())
        # gpgv, as apt verifies (and no agent is started): the key as a binary keyring, then the signature.
        keyring = tmp_path / f"{name}.gpg"
        subprocess.run(["gpg", "--batch", "--yes", "--output", str(keyring), "--dearmor", str(key)], check=True,
                       capture_output=True, timeout=30)
        check = subprocess.run(["gpgv", "--keyring", str(keyring), str(signed)], capture_output=True, text=True,
                               timeout=30)
        assert check.returncode == 0 and "Good signature" in check.stderr, (name, check.stderr)


def test_the_role_installs_every_nvidia_package_at_the_pinned_version_from_the_vendor_repositories(tmp_path):
    run = run_role("gpu1", tmp_path)
    output = run.stdout + run.stderr
    # A new node's driver change ends the run with this line (production's nvidia_reboot_allowed: false).
    assert run.returncode == 2 and "need a reboot; nvidia_reboot_allowed is false" in output, output[-3000:]
    assert output.count("fatal:") == 1 and "failed=1" in output, output[-3000:]
    packages = installed("gpu1")
    for wanted in platform_packages("driver_packages") + platform_packages("fabric_packages"):
        name, version = wanted.split("=")
        assert packages.get(name) == version, (name, packages.get(name))
    # Every package of the branch, named or pulled in, at the pinned build; a newer build is in the repository.
    branch = {name: version for name, version in packages.items() if version.startswith(f"{BRANCH}.")}
    assert len(branch) > len(platform_packages("driver_packages")) and set(branch.values()) == {PINNED}, branch
    policy = on("gpu1", "apt-cache policy nvidia-driver-cuda").stdout
    newer = [v for v in spec.load("cuda").package("nvidia-driver-cuda").versions if v != PINNED]
    assert newer and all(v in policy for v in newer), policy
    assert any(name.startswith("mlnx-ofed-kernel") for name in packages)
    # DOCA came first: nvidia-peermem has the peer-memory symbols and loads.
    load = on("gpu1", PEERMEM_LOAD, check=False)
    assert load.returncode == 0, load.stderr
    # Run again: everything is in place, nothing changes and nothing asks for a reboot.
    again = run_role("gpu1", tmp_path / "again")
    assert again.returncode == 0 and "changed=0" in again.stdout and "failed=0" in again.stdout, again.stdout[-3000:]


def _copy_repositories(source: str, target: str) -> None:
    for path in ("/etc/apt/sources.list.d/opsctl-nvidia-distribution.sources",
                 "/etc/apt/sources.list.d/nvidia-cuda.sources", "/etc/apt/sources.list.d/nvidia-doca.sources",
                 "/etc/apt/keyrings/nvidia-cuda.asc", "/etc/apt/keyrings/nvidia-doca.asc",
                 "/etc/apt/preferences.d/opsctl-nvidia-driver.pref"):
        on(target, f"mkdir -p {Path(path).parent} && cat > {path}", stdin=on(source, f"cat {path}").stdout)


def test_a_pin_on_the_named_packages_only_cannot_resolve_and_a_driver_built_before_doca_has_no_peermem():
    _copy_repositories("gpu1", "gpu2")  # what the role wrote there (the test above)
    role_pin = on("gpu2", "cat /etc/apt/preferences.d/opsctl-nvidia-driver.pref").stdout
    driver = platform_packages("driver_packages") + platform_packages("fabric_packages")
    names = " ".join(p.split("=")[0] for p in driver)
    # The role's pin before: the named packages only. Their exact-version dependencies go to the newest build.
    on("gpu2", "cat > /etc/apt/preferences.d/opsctl-nvidia-driver.pref",
       stdin=f"Package: {names}\nPin: version {DRIVER}-*\nPin-Priority: 1000\n")
    on("gpu2", f"{APT} update", timeout=300)
    named_only = on("gpu2", f"{APT} install --simulate {' '.join(driver)}", check=False)
    newer = next(v for v in spec.load("cuda").package("nvidia-kernel-support").versions if v != PINNED)
    assert named_only.returncode != 0 and "unmet dependencies" in named_only.stdout.lower(), named_only.stdout
    assert f"but {newer} is to be installed" in named_only.stdout, named_only.stdout
    on("gpu2", "cat > /etc/apt/preferences.d/opsctl-nvidia-driver.pref", stdin=role_pin)
    # The kernel headers, then the driver alone: DKMS builds nvidia-peermem without MLNX_OFED's symbols.
    on("gpu2", f"{APT} install linux-headers-$(uname -r) {' '.join(driver)}", timeout=600)
    on("gpu2", f"{APT} install {' '.join(platform_packages('doca_packages'))}", timeout=600)
    stub = on("gpu2", PEERMEM_LOAD, check=False)
    assert stub.returncode == 1 and "could not insert 'nvidia_peermem': Invalid argument" in stub.stderr
    # What the role's handler does after a DOCA change: the driver's DKMS package again, now against MLNX_OFED.
    dkms = next(p for p in driver if p.startswith("nvidia-kernel-open-dkms="))
    on("gpu2", f"{APT} install --reinstall {dkms}", timeout=600)
    assert on("gpu2", PEERMEM_LOAD, check=False).returncode == 0


def whole_role_vars(**variables: str) -> str:
    """Extra variables (JSON) of a whole nvidia role run in a lab machine: its reboot allowed, the lab
    kernel's module variables, and `variables`."""
    return json.dumps({"nvidia_reboot_allowed": True, **LAB_KERNEL, **variables})


def test_a_new_driver_version_moves_every_package_of_the_branch_reboots_and_runs_the_new_driver(tmp_path):
    """The inventory's nvidia_driver_version moves (on gpu1, which the role installed above and site.yml's
    last play has held), and the whole role runs with its reboot allowed: the pin moves with it, every
    package of the branch goes to the new build together (the held ones the role did not name too: apt gives
    up on a held dependency it is not told to move, "held broken packages"), the new DKMS build is made
    against the MLNX_OFED that is there, the machine reboots, and the role's checks pass on what booted:
    nvidia-smi reports the new driver and nvidia_peermem is loaded. apt dropped the holds of what it moved,
    which the holds play puts back (site.yml runs it in every run). A second run changes nothing and does
    not reboot."""
    # Every Debian node has initramfs-tools (its kernel's package depends on it); the lab's image has no
    # kernel. With no initramfs in /boot, the role's `update-initramfs -u -k all` has nothing to do.
    on("gpu1", f"{APT} install initramfs-tools", timeout=300)
    held = run_role("gpu1", tmp_path / "held", "holds.yml")
    assert held.returncode == 0, held.stdout[-3000:]
    assert {"nvidia-smi", "libnvidia-ml1"} <= set(on("gpu1", "apt-mark showhold").stdout.split())
    lab_kernel = whole_role_vars(nvidia_driver_version=spec.upstream(NEWER))
    booted, started = boot_id("gpu1"), time.monotonic()
    run = run_role("gpu1", tmp_path, "nvidia_role.yml", lab_kernel)
    assert run.returncode == 0 and "failed=0" in run.stdout, run.stdout[-5000:]
    assert boot_id("gpu1") != booted  # it rebooted
    # ... and its uptime started again at the reboot, as slurmd's boot time needs (supervise.py).
    uptime = float(on("gpu1", "cut -d' ' -f1 /proc/uptime").stdout)
    assert uptime < time.monotonic() - started, uptime
    branch = {name: version for name, version in installed("gpu1").items() if version.startswith(f"{BRANCH}.")}
    assert set(branch.values()) == {NEWER}, branch
    module = on("gpu1", "cat /lib/modules/$(uname -r)/updates/dkms/nvidia-peermem.ko").stdout
    assert f"version={spec.upstream(NEWER)}" in module.split()
    smi = on("gpu1", "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split()
    assert smi == [spec.upstream(NEWER)] * GPUS_PER_NODE, smi
    peermem = on("gpu1", f"cat {LAB_KERNEL['nvidia_loaded_modules_dir']}/nvidia_peermem/version").stdout
    assert peermem.strip() == spec.upstream(NEWER)
    assert "nvidia-smi" not in on("gpu1", "apt-mark showhold").stdout.split()  # moved: its hold dropped
    again_held = run_role("gpu1", tmp_path / "held-again", "holds.yml")
    assert again_held.returncode == 0 and "changed=1" in again_held.stdout, again_held.stdout[-3000:]
    assert {"nvidia-smi", "libnvidia-ml1"} <= set(on("gpu1", "apt-mark showhold").stdout.split())
    booted = boot_id("gpu1")
    again = run_role("gpu1", tmp_path / "again", "nvidia_role.yml", lab_kernel)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-5000:]
    assert boot_id("gpu1") == booted


def test_dcgm_from_the_cuda_repository_at_the_pinned_release_with_its_host_engine(tmp_path):
    """The dcgm_exporter role's install on gpu1 (whose CUDA repository the nvidia role added): DCGM 4.2.3
    as NVIDIA's repository spells it (no Debian revision before 4.3.1) although 4.4.1-1 is there, the
    exporter at its pin, and the host engine's unit running."""
    run = run_role("gpu1", tmp_path, "dcgm_install.yml", tags="dcgm_exporter_install")
    assert run.returncode == 0 and "failed=0" in run.stdout, run.stdout[-3000:]
    packages = installed("gpu1")
    assert packages["datacenter-gpu-manager-4-core"] == "1:4.2.3", packages
    assert packages["datacenter-gpu-manager-4-cuda12"] == "1:4.2.3"
    assert packages["datacenter-gpu-manager-exporter"] == "4.1.3-1"
    assert "1:4.4.1-1" in on("gpu1", "apt-cache policy datacenter-gpu-manager-4-core").stdout
    assert on("gpu1", "systemctl is-active nvidia-dcgm").stdout.strip() == "active"
    assert on("gpu1", "systemctl is-enabled nvidia-dcgm-exporter", check=False).stdout.strip() == "masked"


def test_the_role_makes_the_slurm_user_that_schedmds_packages_do_not(tmp_path):
    """SchedMD's packages (the lab's schedmd repository has their relations; SchedMD/slurm's debian/ has no
    maintainer script) make no slurm user, and slurmctld's unit runs as it: the role makes it, with the
    distribution packages' uid, once."""
    assert on("gpu3", "getent passwd slurm", check=False).returncode == 2  # no Slurm package on it
    first = run_role("gpu3", tmp_path / "first", "slurm_user.yml")
    assert first.returncode == 0 and "changed=3" in first.stdout, first.stdout[-3000:]
    assert on("gpu3", "getent passwd slurm").stdout.split(":")[2:4] == ["64030", "64030"]
    assert on("gpu3", "stat -c %U /var/log/slurm").stdout.strip() == "slurm"
    again = run_role("gpu3", tmp_path / "again", "slurm_user.yml")
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]


def test_a_new_node_provisions_when_the_archive_replaced_the_pinned_build_with_a_security_build(tmp_path):
    """Debian's archive keeps only a release's newest build: munge's 0.5.15-2 is gone, replaced by its security
    build 0.5.15-2+deb12u1. An inventory that pinned the build the release shipped still provisions a new node,
    which gets the security build; asked for exactly, apt finds nothing."""
    security = yaml.safe_load((ROOT / "playbooks" / "roles" / "munge" / "vars" / "debian-12.yml").read_text())
    original = security["_munge_platform"]["version"].split("+deb")[0]  # 0.5.15-2+deb12u1 -> 0.5.15-2
    exact = on("head", f"{APT} install --simulate munge={original}", check=False)
    assert exact.returncode == 100 and f"Version '{original}' for 'munge' was not found" in exact.stderr, exact
    run = run_role("head", tmp_path, "munge.yml", f"munge_version={original}")
    assert run.returncode == 0, run.stdout[-3000:]
    assert installed("head")["munge"] == security["_munge_platform"]["version"]
    on("head", "munge -n | unmunge")  # the daemon runs with the key the role made


def test_lustre_from_dkms_builds_ko2iblnd_against_doca_and_the_prebuilt_modules_do_not_load(tmp_path):
    """The lustre_client role's install on gpu1 (DOCA and the driver installed above): lustre-release's DKMS
    package at the pinned release although a newer one is in the directory, its dependencies from Debian and
    the running kernel's image and meta packages from the lab's kernel repository; configure finds DOCA's
    ofed_info and builds ko2iblnd against MLNX_OFED, and it loads. Whamcloud's prebuilt modules for the same
    kernel, built against the kernel's own ib_core, do not load on a node with DOCA (gpu2)."""
    lustre_url = yaml.safe_load((LAB_DIR / "inventory" / "vendor-repos.yml").read_text())["all"]["vars"][
        "lustre_client_repo_url"]
    # The example's gpu_nodes group names the site's Lustre mirror, which wins over the lab's all-hosts
    # variable (the lab's own inventory sets no such group variable).
    run = run_role("gpu1", tmp_path, "lustre_install.yml", f"lustre_client_repo_url={lustre_url}")
    assert run.returncode == 0 and "failed=0" in run.stdout, run.stdout[-5000:]
    packages = installed("gpu1")
    version = yaml.safe_load((ROOT / "playbooks/roles/lustre_client/defaults/main.yml").read_text())[
        "lustre_client_version"]
    assert packages["lustre-client-modules-dkms"] == packages["lustre-client-utils"] == f"{version}-1", packages
    release = on("gpu1", "uname -r").stdout.strip()
    assert packages["linux-image-amd64"] == packages[f"linux-image-{release}"] == f"{release}-1"
    # The newer release is in the directory too (the role takes its files by name, not by apt's choice).
    newer = next(v for v in spec.load("lustre").package("lustre-client-modules-dkms").versions if v != f"{version}-1")
    listing = urllib.request.urlopen(lustre_url, timeout=10).read().decode()
    assert f"lustre-client-modules-dkms_{newer}_amd64.deb" in listing
    on("gpu1", f"{MODPROBE} ko2iblnd")
    # Whamcloud's build for this kernel, on a node whose ib_core is DOCA's.
    deb = f"lustre-client-modules-{release}_{version}-1_amd64.deb"
    on("gpu2", f"python3 -c 'import urllib.request; urllib.request.urlretrieve(\"{lustre_url}{deb}\", \"/tmp/{deb}\")'")
    on("gpu2", f"{APT} install /tmp/{deb}", timeout=300)
    refused = on("gpu2", f"{MODPROBE} ko2iblnd", check=False)
    assert refused.returncode == 1 and "disagrees about version of symbol" in refused.stderr, refused.stderr


def test_a_new_doca_release_moves_mlnx_ofed_and_rebuilds_peermem_against_it_before_the_reboot(tmp_path):
    """gpu1 (the whole role above, at the newer driver) moves to the second DOCA release of the lab's
    repository, a directory of its own as NVIDIA publishes them: the role moves MLNX_OFED's kernel stack to
    that release's builds, rebuilds the driver's modules against it, reboots, and its checks pass with
    nvidia_peermem loaded at boot."""
    doca = spec.load("doca")
    ofed = doca.package("mlnx-ofed-kernel-dkms").versions[1]
    booted = boot_id("gpu1")
    run = run_role("gpu1", tmp_path, "nvidia_role.yml",
                   whole_role_vars(nvidia_driver_version=spec.upstream(NEWER), nvidia_doca_version=doca.releases[1]))
    assert run.returncode == 0 and "failed=0" in run.stdout, run.stdout[-5000:]
    assert "Rebuild the driver's kernel modules against the new MLNX_OFED" in run.stdout
    assert boot_id("gpu1") != booted
    packages = installed("gpu1")
    assert packages["mlnx-ofed-kernel-dkms"] == ofed and packages["doca-ofed"] == doca.package("doca-ofed").versions[1]
    module = on("gpu1", "cat /lib/modules/$(uname -r)/updates/dkms/nvidia-peermem.ko").stdout.split()
    assert f"ib_core={ofed}" in module, module
    assert on("gpu1", f"test -d {LAB_KERNEL['nvidia_loaded_modules_dir']}/nvidia_peermem", check=False).returncode == 0
