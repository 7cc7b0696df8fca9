"""The vendors' repositories in their real shape (opsctl_lab.vendor_repos), installed from with real apt in
the lab machines: the nvidia role's install path with the production variables (a new node's run that stops
to ask for the reboot, and the whole role across a DOCA release change, its reboot included), the Slurm
user, a security build, and the defects the emulation must be able to show (a pin on the named packages
only; the driver built before DOCA; Lustre's prebuilt modules under DOCA). The whole stack through
site.yml, DCGM and Lustre's DKMS build included, and a driver change rolled out through Slurm's reboot, is
the provision tier's (test_provision_4_nodes.py).

Runs after test_machines.py on the same machines (conftest.py); each test uses a GPU machine of its own
or one that an earlier test of this module prepared, in file order."""

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from opsctl_lab.vendor_repos import build, spec
from tests.integration.machines.support import ENV, LAB_DIR, MACHINES_MARKS, ROOT, SETTINGS, on
from tests.vendor_stack import BRANCH, DPKG_QUERY, DRIVER, LUSTRE, PINNED, platform_packages

pytestmark = MACHINES_MARKS
# The lab inventory's variables of the machines' emulated kernel (its module loading and /sys/module).
LAB_KERNEL = {name: value for name, value in
              yaml.safe_load((ROOT / "inventory" / "lab" / "group_vars" / "gpu_nodes.yml").read_text()).items()
              if name in ("nvidia_modprobe_command", "nvidia_loaded_modules_dir")}
MODPROBE = " ".join(LAB_KERNEL["nvidia_modprobe_command"])
PEERMEM_LOAD = f"{MODPROBE} nvidia_peermem"
APT = "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=120 --no-install-recommends"


def boot_id(machine: str) -> str:
    return on(machine, "cat /proc/sys/kernel/random/boot_id").stdout


def installed(machine: str) -> dict[str, str]:
    from tests.vendor_stack import installed as parse

    return parse(on(machine, DPKG_QUERY).stdout)


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


def test_whamclouds_prebuilt_lustre_modules_do_not_load_on_a_node_with_doca():
    """Whamcloud's prebuilt modules for the running kernel, built against the kernel's own ib_core, on a node
    whose ib_core is DOCA's (gpu2, above): ko2iblnd does not load. (The role's DKMS build, against DOCA's
    MLNX_OFED, is the provision tier's: test_provision_4_nodes.py.) The directory has a newer release too:
    the role takes its files by name, not by apt's choice."""
    lustre_url = yaml.safe_load((LAB_DIR / "inventory" / "vendor-repos.yml").read_text())["all"]["vars"][
        "lustre_client_repo_url"]
    newer = next(v for v in spec.load("lustre").package("lustre-client-modules-dkms").versions if v != f"{LUSTRE}-1")
    listing = urllib.request.urlopen(lustre_url, timeout=10).read().decode()
    assert f"lustre-client-modules-dkms_{newer}_amd64.deb" in listing
    release = on("gpu2", "uname -r").stdout.strip()
    deb = f"lustre-client-modules-{release}_{LUSTRE}-1_amd64.deb"
    on("gpu2", f"python3 -c 'import urllib.request; urllib.request.urlretrieve(\"{lustre_url}{deb}\", \"/tmp/{deb}\")'")
    on("gpu2", f"{APT} install /tmp/{deb}", timeout=300)
    refused = on("gpu2", f"{MODPROBE} ko2iblnd", check=False)
    assert refused.returncode == 1 and "disagrees about version of symbol" in refused.stderr, refused.stderr


def test_a_new_doca_release_moves_mlnx_ofed_and_rebuilds_peermem_against_it_before_the_reboot(tmp_path):
    """gpu1 (the role's install above, its reboot still due) moves to the second DOCA release of the lab's
    repository, a directory of its own as NVIDIA publishes them: the whole role, its reboot allowed, moves
    MLNX_OFED's kernel stack to that release's builds, rebuilds the driver's modules against it, reboots,
    and its checks pass with nvidia_peermem loaded at boot. (A driver version change through Slurm's reboot
    is the provision tier's rollout: test_provision_4_nodes.py.)"""
    doca = spec.load("doca")
    ofed = doca.package("mlnx-ofed-kernel-dkms").versions[1]
    booted = boot_id("gpu1")
    run = run_role("gpu1", tmp_path, "nvidia_role.yml",
                   whole_role_vars(nvidia_doca_version=doca.releases[1]))
    assert run.returncode == 0 and "failed=0" in run.stdout, run.stdout[-5000:]
    assert "Rebuild the driver's kernel modules against the new MLNX_OFED" in run.stdout
    assert boot_id("gpu1") != booted
    packages = installed("gpu1")
    assert packages["mlnx-ofed-kernel-dkms"] == ofed and packages["doca-ofed"] == doca.package("doca-ofed").versions[1]
    module = on("gpu1", "cat /lib/modules/$(uname -r)/updates/dkms/nvidia-peermem.ko").stdout.split()
    assert f"ib_core={ofed}" in module, module
    assert on("gpu1", f"test -d {LAB_KERNEL['nvidia_loaded_modules_dir']}/nvidia_peermem", check=False).returncode == 0
