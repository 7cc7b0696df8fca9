"""The nfs_server role's files and preflight, rendered and run by ansible-playbook on this host (connection
local) into a temporary directory: the kernel server's exports and nfs.conf (the lab serves with Ganesha,
so only here are they checked), Ganesha's config, and the preflight's one-line refusals that name the
variable. The role's full run, on the lab's storage machine with real NFS-Ganesha and a real disk:
tests/integration/provision/test_provision_7_storage.py."""

import pytest

from tests.component.test_storage_roles import recap, run_role, template
from tests.unit.test_roles_static import ROLES

TEMPLATES = ROLES / "nfs_server" / "templates"
BASE = {
    "nfs_server_root": "/srv/nfs",
    "nfs_server_clients": ["10.20.0.0/16", "10.30.0.0/16"],
    "nfs_server_export_options": {"root_squash": True, "sync": True, "subtree_check": False},
    "nfs_server_anonymous_uid": 65534,
    "nfs_server_anonymous_gid": 65534,
}


def rendered(tmp_path, name: str, **variables) -> str:
    dest = tmp_path / name
    proc = template(tmp_path, TEMPLATES / f"{name}.j2", dest, **{**BASE, **variables})
    assert recap(proc)[1] == 0, proc.stdout[-3000:]
    return "\n".join(line for line in dest.read_text().splitlines() if line and not line.startswith("#"))


def test_kernel_exports_put_the_nfsv4_root_first_and_each_client_network_with_the_options(tmp_path):
    root = rendered(tmp_path, "export.exports", item={"path": "", "root": True})
    opts = "root_squash,sync,no_subtree_check,anonuid=65534,anongid=65534"
    assert root == f"/srv/nfs 10.20.0.0/16(ro,fsid=0,{opts}) 10.30.0.0/16(ro,fsid=0,{opts})"
    home = rendered(tmp_path, "export.exports", item={"path": "/home"})
    assert home == f"/srv/nfs/home 10.20.0.0/16(rw,{opts}) 10.30.0.0/16(rw,{opts})"


def test_an_exports_own_options_override_the_defaults_for_it_only(tmp_path):
    shared = rendered(tmp_path, "export.exports", item={"path": "/shared", "options": {"root_squash": False,
                                                                                       "sync": False}})
    assert shared.split()[1] == "10.20.0.0/16(rw,no_root_squash,async,no_subtree_check,anonuid=65534,anongid=65534)"


def test_nfs_conf_serves_the_listed_nfsv4_minor_versions_only(tmp_path):
    conf = rendered(tmp_path, "nfs.conf", nfs_server_threads=64, nfs_server_nfs4_minor_versions=[2])
    assert conf.splitlines() == ["[nfsd]", "threads=64", "vers3=n", "vers4.0=n", "vers4.1=n", "vers4.2=y"]


def test_ganesha_serves_each_export_once_under_its_pseudo_path_to_the_listed_clients(tmp_path):
    conf = rendered(tmp_path, "ganesha.conf", nfs_server_exports=[{"path": "/home"}, {"path": "/shared"}],
                    nfs_server_nfs4_minor_versions=[2], nfs_server_port=2049, nfs_server_listen_address="10.20.0.20")
    assert "Bind_addr = 10.20.0.20;" in conf and "Minor_Versions = 2;" in conf and "Protocols = 4;" in conf
    assert [line.strip() for line in conf.splitlines() if "Export_Id" in line] == ["Export_Id = 1;", "Export_Id = 2;"]
    assert "Path = /srv/nfs/shared;" in conf and "Pseudo = /shared;" in conf
    assert conf.count("Clients = 10.20.0.0/16, 10.30.0.0/16;") == 2 and conf.count("Squash = root_squash;") == 2
    # Nothing is open to a client outside the list: the export's own access is None.
    assert conf.count("Access_Type = None;") == 2


PREFLIGHT_OK = {**BASE, "nfs_server_implementation": "ganesha", "nfs_server_devices": [],
                "nfs_server_wipe_devices": [], "nfs_server_raid_level": 1,
                "nfs_server_exports": [{"path": "/home"}, {"path": "/shared"}], "nfs_server_nfs4_minor_versions": [2]}


@pytest.mark.parametrize(("override", "message"), [
    ({"nfs_server_clients": []}, "nfs_server_clients must list the cluster networks"),
    ({"nfs_server_clients": ["*"]}, "nfs_server_clients must list the cluster networks"),
    ({"nfs_server_exports": [{"path": "/home"}, {"path": "/home"}]}, "nfs_server_exports lists a path twice"),
    ({"nfs_server_exports": [{"path": "home"}]}, "nfs_server_exports: every path must be absolute"),
    ({"nfs_server_devices": ["/dev/a"], "nfs_server_wipe_devices": ["/dev/b"]},
     "nfs_server_wipe_devices names a device that nfs_server_devices does not: /dev/b"),
    ({"nfs_server_devices": ["/dev/a", "/dev/b"], "nfs_server_raid_level": 5},
     "nfs_server_raid_level 5 needs at least 3 devices"),
    ({"nfs_server_nfs4_minor_versions": [3]}, "nfs_server_nfs4_minor_versions must be"),
])
def test_the_preflight_refuses_a_bad_inventory_naming_the_variable(tmp_path, override, message):
    proc = run_role(tmp_path, "nfs_server", "preflight", **{**PREFLIGHT_OK, **override})
    assert recap(proc)[1] == 1 and message in proc.stdout, proc.stdout[-3000:]


def test_the_preflight_passes_a_good_inventory(tmp_path):
    proc = run_role(tmp_path, "nfs_server", "preflight", **PREFLIGHT_OK)
    assert recap(proc) == (0, 0), proc.stdout[-3000:]
