"""The storage client roles' own logic, run by ansible-playbook on this host (connection local) into a
temporary directory, with this host's systemd as the judge:

- nfs_client and lustre_client name their units exactly as `systemd-escape -p --suffix=mount` does (their
  filter, compared with systemd-escape itself, a path with '-' too), render the options and dependencies
  they promise, and `systemd-analyze verify` accepts them (the role runs it; the test runs it again); a
  second run changes nothing;
- a unit that systemd refuses fails the play with the verifier's message, and the preflights refuse bad
  inventories with a message that names the variable;
- lustre_client verifies its mounts' Requires=lnet.service honestly: against a stand-in written into the
  render directory only when it does not activate, and against the real lnet.service otherwise (so on a
  host without the Lustre client, activating fails the check);
- lnet.conf is `lnetctl import` YAML with one local NI per interface;
- slurm_compute's epilog drains a node whose required mount is not a mount point.
The roles' full runs on real machines, with the units installed nowhere (the lab's render-only mode):
tests/integration/provision/test_provision_8_storage_clients.py.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.component.test_slurm_render import BIN
from tests.unit.test_roles_static import PLAYBOOKS, REPO, ROLES

NEEDS_SYSTEMD = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
RECAP = re.compile(r"^\S+\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", re.M)


def run_play(tmp: Path, name: str, tasks: list[dict], gather: bool = False, **variables) -> subprocess.CompletedProcess:
    """One play of `tasks` on this host (connection local), with `variables` as extra vars."""
    playbook = tmp / f"{name}.yml"
    playbook.write_text(yaml.safe_dump([{"name": name, "hosts": "node", "gather_facts": gather,
                                         **({"gather_subset": ["!all", "network"]} if gather else {}),
                                         "tasks": tasks}]))
    inventory = tmp / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"node": {
        "ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}}}}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(PLAYBOOKS / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROLES),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp / "facts")}
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook),
                           "-e", json.dumps(variables)], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)


def run_role(tmp: Path, role: str, tasks_from: str, gather: bool = False, **variables) -> subprocess.CompletedProcess:
    """The role's task file `tasks_from` on this host, its files under tmp."""
    task = {"name": "Run the role's tasks", "ansible.builtin.include_role": {"name": role, "tasks_from": tasks_from}}
    return run_play(tmp, f"{role}-{tasks_from}", [task], gather, **variables)


def template(tmp: Path, src: Path, dest: Path, **variables) -> subprocess.CompletedProcess:
    """A role's template rendered by Ansible with `variables`."""
    task = {"name": "Render", "ansible.builtin.template": {"src": str(src), "dest": str(dest), "mode": "0755"}}
    return run_play(tmp, f"render-{dest.name}", [task], **variables)


def recap(proc: subprocess.CompletedProcess) -> tuple[int, int]:
    """(changed, failed) of the one host."""
    found = RECAP.search(proc.stdout)
    assert found, proc.stdout[-3000:] + proc.stderr[-3000:]
    return int(found[1]), int(found[2])


def unit(path: Path) -> dict[str, list[str]]:
    """'Section.Key' -> values of a unit file."""
    values: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(f"{section}.{key}", []).append(value)
    return values


def escape(path: str) -> str:
    return subprocess.run(["systemd-escape", "-p", "--suffix=mount", path], capture_output=True, text=True,
                          check=True, timeout=10).stdout.strip()


def verify(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", *map(str, files)], capture_output=True, text=True,
                          timeout=60)


def load_filter():
    path = ROLES / "nfs_client" / "filter_plugins" / "systemd_unit_name.py"
    spec = importlib.util.spec_from_file_location("systemd_unit_name", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@NEEDS_SYSTEMD
@pytest.mark.parametrize("path", ["/home", "/shared/ml-data", "/lustre", "/-x-", "/a b", "/.snap/x", "/x//y/", "/",
                                  "/a:b_c.d", "/a\\b", "/data/ü", "/a.b/.c", "/scratch/2024-12"])
def test_the_unit_name_filter_is_systemd_escape(path):
    """Both roles name units with systemd_mount_unit (lustre_client's filter_plugins links to nfs_client's)."""
    want = subprocess.run(["systemd-escape", "--path", "--suffix=mount", "--", path], capture_output=True, text=True,
                          check=True, timeout=10).stdout.strip()
    assert load_filter().systemd_mount_unit(path) == want
    assert (ROLES / "lustre_client" / "filter_plugins" / "systemd_unit_name.py").resolve() == \
        (ROLES / "nfs_client" / "filter_plugins" / "systemd_unit_name.py").resolve()


NFS_MOUNTS = [
    {"path": "/home", "server": "10.20.0.20", "export": "/home"},
    {"path": "/shared/ml-data", "server": "stor01", "export": "/shared", "options": ["ro", "noatime"]},
]


@NEEDS_SYSTEMD
def test_nfs_units_are_named_by_systemd_escape_verified_and_stable(tmp_path):
    render = tmp_path / "units"
    first = run_role(tmp_path, "nfs_client", "units", nfs_client_mounts=NFS_MOUNTS, nfs_client_render_dir=str(render),
                     nfs_client_activate=False)
    assert recap(first)[1] == 0, first.stdout[-4000:]
    assert escape("/shared/ml-data") == "shared-ml\\x2ddata.mount"  # the '-' case: not shared-ml-data.mount
    assert sorted(p.name for p in render.iterdir()) == sorted(
        ["home.mount", "home.automount", "shared-ml\\x2ddata.mount", "shared-ml\\x2ddata.automount"])
    home = unit(render / "home.mount")
    assert home["Mount.What"] == ["10.20.0.20:/home"] and home["Mount.Where"] == ["/home"]
    assert home["Mount.Type"] == ["nfs4"] and home["Mount.TimeoutSec"] == ["90"]
    assert home["Mount.Options"] == ["_netdev,hard,nconnect=8,vers=4.2,nosuid,nodev,noatime"]
    assert home["Unit.After"] == ["network-online.target"] and home["Unit.Wants"] == ["network-online.target"]
    data = unit(render / "shared-ml\\x2ddata.mount")
    assert data["Mount.Options"] == ["_netdev,hard,nconnect=8,vers=4.2,nosuid,nodev,noatime,ro"]
    automount = unit(render / "shared-ml\\x2ddata.automount")
    assert automount["Automount.Where"] == ["/shared/ml-data"] and automount["Automount.TimeoutIdleSec"] == ["0"]
    assert automount["Install.WantedBy"] == ["remote-fs.target"]
    checked = verify(*sorted(render.iterdir()))
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    assert "changed" in first.stdout.split("Verify the NFS units with systemd-analyze", 1)[1].split("TASK", 1)[0]
    second = run_role(tmp_path, "nfs_client", "units", nfs_client_mounts=NFS_MOUNTS, nfs_client_render_dir=str(render),
                      nfs_client_activate=False)
    assert recap(second) == (0, 0), second.stdout[-4000:]


@NEEDS_SYSTEMD
def test_a_unit_systemd_refuses_fails_the_play_with_the_verifiers_message(tmp_path):
    proc = run_role(tmp_path, "nfs_client", "units", nfs_client_mounts=NFS_MOUNTS[:1],
                    nfs_client_render_dir=str(tmp_path / "units"), nfs_client_activate=False,
                    nfs_client_automount_idle_timeout=-1)
    assert recap(proc)[1] == 1
    assert "nfs_client_mounts: systemd-analyze verify refused the units" in proc.stdout
    assert "home.automount:11: Failed to parse time value" in proc.stdout  # systemd's own words


@pytest.mark.parametrize("mounts, message", [
    ([{"path": "home", "server": "s", "export": "/home"}], "nfs_client_mounts: path must be absolute and normalized"),
    ([{"path": "/home/", "server": "s", "export": "/home"}], "nfs_client_mounts: path must be absolute and normalized"),
    ([{"path": "/home", "server": "s", "export": "home"}], "export absolute"),
    ([{"path": "/home", "server": "", "export": "/home"}], "nfs_client_mounts: every mount needs a non-empty path"),
    ([{"path": "/home", "server": "a", "export": "/home"}, {"path": "/home", "server": "b", "export": "/x"}],
     "nfs_client_mounts: more than one mount on /home"),
])
def test_nfs_preflight_refuses_bad_mounts_naming_the_variable(tmp_path, mounts, message):
    proc = run_role(tmp_path, "nfs_client", "preflight", nfs_client_mounts=mounts)
    assert recap(proc)[1] == 1 and message in proc.stdout, proc.stdout[-3000:]


@pytest.mark.parametrize("login, path, refused", [
    ("root", "/root", "nfs_client_mounts: /root (s:/export) would be mounted over /root, the home of root"),
    ("daemon", "/usr", "would be mounted over /usr/sbin, the home of daemon"),  # above the home hides it too
    ("root", "/rootfs", None),  # a path that only starts with the home's characters is not above it
    ("no-such-account", "/home", None),  # unknown to the node: no home to hide
])
def test_nfs_preflight_refuses_a_mount_over_the_home_ansible_logs_in_to(tmp_path, login, path, refused):
    """The home comes from this host's passwd database (getent), as on a node."""
    mounts = [{"path": "/shared", "server": "s", "export": "/shared"},
              {"path": path, "server": "s", "export": "/export"}]
    proc = run_role(tmp_path, "nfs_client", "preflight", nfs_client_mounts=mounts, ansible_user=login)
    if refused:
        assert recap(proc)[1] == 1 and refused in " ".join(proc.stdout.split()), proc.stdout[-3000:]
        assert "the account Ansible logs in as" in proc.stdout
    else:
        assert recap(proc)[1] == 0, proc.stdout[-3000:]


LUSTRE = {"lustre_client_mounts": [{"fs_name": "scratch", "path": "/lustre"}],
          "lustre_client_mgs_nids": ["10.20.2.10@tcp", "10.20.2.11@tcp"]}


@NEEDS_SYSTEMD
def test_lustre_units_require_lnet_and_verify_against_a_stand_in_only_when_not_activating(tmp_path):
    render = tmp_path / "units"
    proc = run_role(tmp_path, "lustre_client", "units", lustre_client_render_dir=str(render),
                    lustre_client_activate=False, **LUSTRE)
    assert recap(proc)[1] == 0, proc.stdout[-4000:]
    assert sorted(p.name for p in render.iterdir()) == ["lnet.service", "lustre.automount", "lustre.mount"]
    mount = unit(render / "lustre.mount")
    assert mount["Mount.What"] == ["10.20.2.10@tcp:10.20.2.11@tcp:/scratch"] and mount["Mount.Type"] == ["lustre"]
    assert mount["Mount.Options"] == ["flock,_netdev,nosuid,nodev"]
    assert mount["Unit.Requires"] == ["lnet.service"] and "lnet.service" in mount["Unit.After"][0].split()
    assert verify(render / "lustre.mount", render / "lustre.automount").returncode == 0
    # Activating uses the real lnet.service: this host has no Lustre client, so the check must fail.
    activated = run_role(tmp_path, "lustre_client", "units", lustre_client_render_dir=str(render),
                         lustre_client_activate=True, **LUSTRE)
    assert not (render / "lnet.service").exists()
    assert recap(activated)[1] == 1 and "lnet.service not found" in activated.stdout, activated.stdout[-3000:]


@pytest.mark.parametrize("variables, message", [
    ({"lustre_client_mgs_nids": []}, "lustre_client_mgs_nids: set the MGS NIDs"),
    ({"lustre_client_mgs_nids": ["10.20.2.10"]}, "lustre_client_mgs_nids: 10.20.2.10 is not a NID"),
    ({"lustre_client_mgs_nids": ["10.20.2.10@o2ib"]},
     "lustre_client_mgs_nids: 10.20.2.10@o2ib are on LNet network(s) o2ib0"),
    ({"lustre_client_mounts": [{"fs_name": "", "path": "/lustre"}]}, "lustre_client_mounts: every mount needs fs_name"),
    ({"lustre_client_mounts": [{"fs_name": "x", "path": "/lustre"}, {"fs_name": "y", "path": "/lustre"}]},
     "lustre_client_mounts: more than one mount on /lustre"),
])
def test_lustre_preflight_refuses_bad_variables_naming_them(tmp_path, variables, message):
    lo = {"lustre_client_lnet_networks": [{"net": "tcp", "interfaces": ["lo"]}],
          "lustre_client_install_packages": False}
    proc = run_role(tmp_path, "lustre_client", "preflight", gather=True, **{**LUSTRE, **lo, **variables})
    assert recap(proc)[1] == 1 and message in proc.stdout, proc.stdout[-3000:]


def test_lnet_interfaces_the_node_lacks_are_refused_naming_the_variable(tmp_path):
    """Not an inventory check (lnet_interfaces.yml, after the node's netdevs are read): an interface this host
    does not have is refused, lo passes; the preflight (inventory only) leaves interfaces alone."""
    missing = {"lustre_client_lnet_networks": [{"net": "o2ib", "interfaces": ["ib-none"]}],
               "lustre_client_install_packages": False}
    proc = run_role(tmp_path, "lustre_client", "lnet_interfaces", gather=True, **{**LUSTRE, **missing})
    assert recap(proc)[1] == 1 and "lustre_client_lnet_networks: network o2ib must be o2ib or tcp" in proc.stdout, \
        proc.stdout[-3000:]
    present = {**missing, "lustre_client_lnet_networks": [{"net": "tcp", "interfaces": ["lo"]}]}
    assert recap(run_role(tmp_path, "lustre_client", "lnet_interfaces", gather=True, **{**LUSTRE, **present}))[1] == 0
    # site.yml's preflight play runs before the NVIDIA/DOCA stack makes the IPoIB netdevs: its checks pass.
    preflight = run_role(tmp_path, "lustre_client", "preflight", gather=True,
                         **{**LUSTRE, **missing, "lustre_client_mgs_nids": ["10.20.2.10@o2ib"]})
    assert recap(preflight)[1] == 0, preflight.stdout[-3000:]


def test_lnet_conf_is_lnetctl_import_yaml_with_one_ni_per_interface(tmp_path):
    networks = [{"net": "o2ib", "interfaces": []}, {"net": "tcp1", "interfaces": ["eth0"]}]
    proc = template(tmp_path, ROLES / "lustre_client" / "templates" / "lnet.conf.j2", tmp_path / "lnet.conf",
                    lustre_client_lnet_networks=networks, _lustre_client_ipoib_interfaces=["ibp12s0", "ibp75s0"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    conf = yaml.safe_load((tmp_path / "lnet.conf").read_text())
    assert conf == {"net": [
        {"net type": "o2ib", "local NI(s)": [{"interfaces": {0: "ibp12s0"}}, {"interfaces": {0: "ibp75s0"}}]},
        {"net type": "tcp1", "local NI(s)": [{"interfaces": {0: "eth0"}}]}]}


@pytest.mark.skipif(os.geteuid() != 0, reason="the epilog keeps its results under /run")
def test_epilog_drains_a_node_whose_required_mount_is_not_a_mount_point(tmp_path):
    """The epilog rendered by Ansible from the role's template, run with bash -x: its Slurm call is read
    from the trace (no controller here, so scontrol itself fails, and the epilog still exits 0)."""
    defaults = yaml.safe_load((ROLES / "slurm_compute" / "defaults" / "main.yml").read_text())
    not_mounted = tmp_path / "shared"
    not_mounted.mkdir()

    def epilog(mounts: list[str]) -> str:
        proc = template(tmp_path, ROLES / "slurm_compute" / "templates" / "opsctl-epilog.sh.j2",
                        tmp_path / "epilog.sh", **{**defaults, "slurm_compute_required_mounts": mounts})
        assert proc.returncode == 0, proc.stdout[-3000:]
        subprocess.run(["bash", "-n", str(tmp_path / "epilog.sh")], check=True, timeout=30)
        run = subprocess.run(["bash", "-x", str(tmp_path / "epilog.sh")], capture_output=True, text=True, timeout=60,
                             env={"SLURM_JOB_ID": "7", "SLURM_JOB_UID": "0", "SLURMD_NODENAME": "gpu9"})
        assert run.returncode == 0
        return "\n".join(line for line in run.stderr.splitlines() if line.startswith("+ scontrol"))

    assert epilog(["/proc", "/sys"]) == ""
    drains = epilog(["/proc", str(not_mounted)])
    assert f"reason=opsctl:epilog job 7 storage {not_mounted} not mounted" in drains, drains
    assert "nodename=gpu9 state=drain" in drains
