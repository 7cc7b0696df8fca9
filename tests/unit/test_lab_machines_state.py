"""The lab machines' own files agree with the roles, and what `lab machines up` and `reset` say.

/etc/hosts: the lab rewrites it at every machine start; it must be what the common role's
"Write cluster hosts into /etc/hosts" leaves there for the lab inventory, or the first provision after a
restart reports a change. The role's block is rendered here from the role's own task, vars and filter
for the inventory the lab writes, and applied the way blockinfile applies it. The whole path (restart,
then provision with changed=0) is proven by the provision tier against the real machines.
"""

import os
import subprocess
from pathlib import Path

import jinja2
import yaml
from click.testing import CliRunner

from opsctl.cli import main
from opsctl_lab.hardware import ActiveFault, NodeHardware, fault_label
from opsctl_lab.machines import inventory, labstate, lifecycle, nspawn
from opsctl_lab.machines.settings import HW_STATE, Settings, machine_names
from tests.unit.test_platforms import PLATFORM
from tests.unit.test_roles_static import ROLES, load_yaml

HOSTS_TASK = "Write cluster hosts into /etc/hosts"


def _hosts_task() -> dict:
    tasks = load_yaml(ROLES / "common" / "tasks" / "main.yml")
    return next(t for t in tasks if t.get("name") == HOSTS_TASK)["ansible.builtin.blockinfile"]


def role_block(settings: Settings, names: list[str]) -> tuple[str, str]:
    """(marker, block) as the common role renders them for the inventory the lab writes."""
    hosts_doc = yaml.safe_load(inventory.render(settings, names))
    groups: dict[str, list[str]] = {}
    hostvars: dict[str, dict] = {}

    def walk(name: str, group: dict) -> list[str]:
        members = list(group.get("hosts") or {})
        hostvars.update(group.get("hosts") or {})
        for child, sub in (group.get("children") or {}).items():
            members += walk(child, sub or {})
        groups[name] = members
        return members

    walk("all", hosts_doc["all"])
    # Ansible renders module arguments with trim_blocks on.
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["host_addresses"] = PLATFORM.host_addresses
    group = load_yaml(ROLES / "common" / "defaults" / "main.yml")["common_hosts_group"]
    entries_expr = load_yaml(ROLES / "common" / "vars" / "main.yml")["_common_hosts_entries"]
    entries = env.from_string(entries_expr.replace("{{", "{{ (").replace("}}", ") | tojson }}")).render(
        groups=groups, hostvars=hostvars, common_hosts_group=group)
    task = _hosts_task()
    block = env.from_string(task["block"]).render(_common_hosts_entries=yaml.safe_load(entries))
    return task["marker"], block


def blockinfile(text: str, marker: str, block: str) -> str:
    """ansible.builtin.blockinfile with its defaults (insertafter EOF): the marked block replaced in place,
    or appended."""
    lines = text.splitlines()
    begin, end = marker.replace("{mark}", "BEGIN"), marker.replace("{mark}", "END")
    wanted = [begin, *block.splitlines(), end]
    if begin in lines and end in lines:
        lines[lines.index(begin):lines.index(end) + 1] = wanted
    else:
        lines += wanted
    return "\n".join(lines) + "\n"


def settings() -> Settings:
    return Settings(net=7, state_dir=None, inventory_dir=None, apt_cache_dir=None)


def test_hosts_file_is_what_the_common_role_leaves():
    lab = settings()
    for names in (machine_names(3), machine_names(12)):  # gpu10 sorts before gpu2, as the role sorts
        marker, block = role_block(lab, names)
        written = nspawn.hosts_text(lab, "gpu1", names)
        assert blockinfile(written, marker, block) == written
        named = [line.split()[1] for line in written.splitlines()]
        for name in names:  # every host once in the block: no second list of the same hosts outside it
            assert named.count(name) == (2 if name == "gpu1" else 1)
        assert f"{lab.addr('gpu1')} gpu1" in block
        # The stock Debian/Ubuntu line that makes a service bound to the machine's own name listen on
        # loopback: the lab keeps it, so the roles are proven against it.
        assert "127.0.1.1\tgpu1" in written.splitlines()


def test_the_block_check_catches_a_hosts_file_without_the_role_block():
    lab = settings()
    names = machine_names(3)
    marker, block = role_block(lab, names)
    plain = "127.0.0.1\tlocalhost\n" + "".join(f"{lab.addr(n)}\t{n}\n" for n in names)
    assert blockinfile(plain, marker, block) != plain
    reordered = nspawn.hosts_text(lab, "gpu1", names).replace("gpu1\n", "gpu1 \n")
    assert blockinfile(reordered, marker, block) != reordered


SINFO = """gpu1 idle none
gpu2 drain ticket-123 bad dimm
gpu3 down* Not responding
gpu3 down* Not responding
gpu4 drng opsctl:xid-79 gpu3
gpu5 alloc none
"""


def test_parse_sinfo_keeps_reasons_with_spaces_and_counts_a_node_once():
    nodes = labstate.parse_sinfo(SINFO)
    assert nodes == {"gpu1": ("idle", ""), "gpu2": ("drain", "ticket-123 bad dimm"),
                     "gpu3": ("down*", "Not responding"), "gpu4": ("drng", "opsctl:xid-79 gpu3"),
                     "gpu5": ("alloc", "")}
    assert sorted(labstate.out_of_service(nodes)) == ["gpu2", "gpu3", "gpu4"]
    assert labstate.unsettled(nodes) == ["gpu3"]
    assert labstate.unsettled(labstate.parse_sinfo("gpu1 unk* none\ngpu2 idle none\n")) == ["gpu1"]


def test_up_names_every_node_that_is_not_idle_and_every_fault():
    nodes = labstate.parse_sinfo(SINFO)
    lines = labstate.found_lines(nodes, {"gpu1": ["xid:79 gpu3"], "gpu2": []})
    assert lines == [
        "slurm: 5 nodes (1 alloc, 1 down*, 1 drain, 1 drng, 1 idle)",
        "  drain    gpu2  ticket-123 bad dimm",
        "  down*    gpu3  Not responding",
        "  drng     gpu4  opsctl:xid-79 gpu3",
        "  alloc    gpu5",
        "  faults gpu1: xid:79 gpu3",
    ]
    assert labstate.found_lines(labstate.parse_sinfo("gpu1 idle none\n"), {}) == ["slurm: 1 nodes (1 idle)"]


def test_up_says_nothing_of_nodes_without_slurm_and_names_a_failing_sinfo():
    assert labstate.found_lines(None, {"gpu1": []}) == []
    assert labstate.found_lines(None, {}, "Unable to contact slurm controller") == [
        "slurm: no answer from sinfo on head: Unable to contact slurm controller"]


def test_reset_says_what_it_cleared_one_line_each():
    nodes = labstate.parse_sinfo(SINFO)
    lines = labstate.reset_lines({"gpu1": ["xid:79 gpu3", "ib-down mlx5_2"], "gpu3": []},
                                 labstate.out_of_service(nodes), ["handled.json", "audit.jsonl"],
                                 "/var/lib/opsctl, /var/log/opsctl/audit.jsonl")
    assert lines == [
        "cleared gpu1: xid:79 gpu3, ib-down mlx5_2",
        "resumed gpu2 (drain)",
        "resumed gpu3 (down*)",
        "resumed gpu4 (drng)",
        "emptied the opsctl state and audit log on head (/var/lib/opsctl, /var/log/opsctl/audit.jsonl): "
        "handled.json, audit.jsonl",
    ]
    assert labstate.reset_lines({"gpu1": []}, {}, [], "") == ["the lab machines were clean"]


def test_fault_labels():
    assert fault_label(ActiveFault("xid", gpu=3, xid=79)) == "xid:79 gpu3"
    assert fault_label(ActiveFault("ib-down", hca="mlx5_2")) == "ib-down mlx5_2"
    assert fault_label(ActiveFault("exporter-down")) == "exporter-down"


def test_opsctl_paths_follow_the_role_the_inventory_and_the_config(tmp_path):
    role = tmp_path / "defaults.yml"
    role.write_text("opsctl_config_path: /etc/opsctl/config.yaml\nopsctl_venv: /opt/opsctl\n")
    inv = tmp_path / "inv"
    assert labstate.opsctl_config_path(inv, role) == "/etc/opsctl/config.yaml"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "group_vars" / "controller.yml").write_text("opsctl_config_path: /srv/opsctl.yaml\n")
    assert labstate.opsctl_config_path(inv, role) == "/srv/opsctl.yaml"
    assert labstate.opsctl_config_path(inv, labstate.ROLE_DEFAULTS) == "/srv/opsctl.yaml"
    assert labstate.opsctl_paths(None) == ("/var/lib/opsctl", "/var/log/opsctl/audit.jsonl")
    assert labstate.opsctl_paths("state_dir: /srv/state\naudit_log: /srv/audit.jsonl\n") == (
        "/srv/state", "/srv/audit.jsonl")


def test_the_lab_reads_the_opsctl_roles_default_config_path():
    defaults = load_yaml(ROLES / "opsctl" / "defaults" / "main.yml")
    assert labstate.opsctl_config_path(labstate.ROLE_DEFAULTS.parent / "none", labstate.ROLE_DEFAULTS) == \
        defaults["opsctl_config_path"]


REAL_SINFO = Path(__file__).parents[1] / "fixtures" / "slurm" / "sinfo-N-t-E-22.05.8.txt"


def test_the_real_sinfo_of_the_lab_machines():
    nodes = labstate.parse_sinfo(REAL_SINFO.read_text())
    assert labstate.found_lines(nodes, {"gpu1": ["xid:79 gpu3"]}) == [
        "slurm: 3 nodes (2 idle, 1 drain)", "  drain    gpu2  ticket-123 bad dimm", "  faults gpu1: xid:79 gpu3"]


class FakeMachines:
    """What the machines answer over SSH; the provision tier runs the same commands on the real ones."""

    def __init__(self, sinfo: str):
        self.sinfo, self.commands = sinfo, []

    def __call__(self, settings, machine, command, stdin=None, timeout=30):
        self.commands.append((machine, command))
        out = {"sinfo": self.sinfo, "sh -s": "handled.json\naudit.jsonl\n"}
        stdout = next((text for key, text in out.items() if key in command), "")
        return subprocess.CompletedProcess([], 0, stdout, "")


def running_machines(tmp_path, monkeypatch, names=("head", "gpu1", "gpu2", "gpu3")) -> Settings:
    monkeypatch.setenv("OPSCTL_LAB_DIR", str(tmp_path))
    monkeypatch.setenv("OPSCTL_LAB_NET", "7")
    monkeypatch.setenv("OPSCTL_LAB_INVENTORY", str(tmp_path / "inv"))
    monkeypatch.setattr(lifecycle, "_preflight", lambda: None)
    lab = Settings()
    for name in names:
        nspawn.upper(lab, name).mkdir(parents=True)
        nspawn._pid_file(lab, name).write_text(f"{os.getpid()}\n")
    return lab


def test_reset_clears_faults_resumes_nodes_and_empties_opsctls_state(tmp_path, monkeypatch):
    lab = running_machines(tmp_path, monkeypatch)
    hw = NodeHardware(node="gpu1")
    hw.inject("xid:79", gpu=3)
    hw.save(nspawn.upper(lab, "gpu1") / HW_STATE.lstrip("/"))
    fake = FakeMachines(REAL_SINFO.read_text())
    monkeypatch.setattr(labstate, "_ssh", fake)
    result = CliRunner().invoke(main, ["lab", "machines", "reset"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "cleared gpu1: xid:79 gpu3", "resumed gpu2 (drain)",
        "emptied the opsctl state and audit log on head (/var/lib/opsctl, /var/log/opsctl/audit.jsonl): "
        "handled.json, audit.jsonl"]
    assert ("gpu1", "/usr/local/sbin/opsctl-hw clear") in fake.commands
    assert ("head", "scontrol update nodename=gpu2 state=resume") in fake.commands
    assert ("head", "cat /etc/opsctl/config.yaml 2>/dev/null || true") in fake.commands
    assert not any(m in ("gpu2", "gpu3") for m, _ in fake.commands)  # nothing to clear there


def test_reset_of_stopped_machines_is_one_line_exit_2(tmp_path, monkeypatch):
    lab = running_machines(tmp_path, monkeypatch)
    nspawn._pid_file(lab, "head").unlink()
    result = CliRunner().invoke(main, ["lab", "machines", "reset"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "opsctl: error: the lab machines are not running; start them with `opsctl lab machines up`"]


def test_each_machine_gets_cgroups_of_its_own_in_the_hierarchies_systemd_uses(tmp_path):
    hybrid = tmp_path / "hybrid"
    for hierarchy in ("systemd", "unified", "memory"):
        (hybrid / hierarchy).mkdir(parents=True)
        (hybrid / hierarchy / "cgroup.procs").touch()
    first, other = Settings(net=0, state_dir=tmp_path), Settings(net=3, state_dir=tmp_path)
    assert nspawn.cgroups(first, "gpu1", hybrid) == [hybrid / "systemd/opsctl-lab/opsctl-gpu1",
                                                     hybrid / "unified/opsctl-lab/opsctl-gpu1"]
    names = [group for settings in (first, other) for machine in ("head", "gpu1")
             for group in nspawn.cgroups(settings, machine, hybrid)]
    assert len(set(names)) == len(names) == 8  # no two machines of any lab share one
    unified = tmp_path / "unified"
    unified.mkdir()
    for name in ("cgroup.controllers", "cgroup.procs"):
        (unified / name).touch()
    assert nspawn.cgroups(first, "head", unified) == [unified / "opsctl-lab/opsctl-head"]
    assert nspawn.cgroups(first, "head", tmp_path / "none") == []  # no cgroup fs: nspawn's own choice


def test_removing_a_machines_cgroups_goes_deepest_first_and_keeps_a_busy_one(tmp_path):
    group = tmp_path / "opsctl-lab/opsctl-gpu1"
    (group / "payload/system.slice/ssh.service").mkdir(parents=True)
    (group / "supervisor").mkdir()
    busy = tmp_path / "opsctl-lab/opsctl-gpu2"
    (busy / "payload").mkdir(parents=True)
    (busy / "payload/cgroup.procs").write_text("42\n")  # rmdir refuses, as with a process in it
    nspawn.remove_cgroups([group, busy])
    assert not group.exists()
    assert (busy / "payload/cgroup.procs").exists()
