"""slurm.conf changes: which ones `scontrol reconfigure` applies and which need the daemons restarted
(playbooks/filter_plugins/slurm_conf_changes.py, used by slurm_common's handlers)."""

from tests.unit.test_roles_static import PLAYBOOKS, ROLES, load_module, load_yaml

CHANGES = load_module(PLAYBOOKS / "filter_plugins" / "slurm_conf_changes.py", "slurm_conf_changes")
RESTART_KEYS = load_yaml(ROLES / "slurm_common" / "vars" / "main.yml")["_slurm_restart_keys"]

INSTALLED = """# Ansible managed
ClusterName=lab
SlurmctldHost=head
SlurmdTimeout=300
SelectType=select/cons_tres
SchedulerParameters=bf_continue

# NODES
NodeName=gpu[1-4] Sockets=2 CoresPerSocket=4 RealMemory=1900 Gres=gpu:h200:8 State=UNKNOWN

# PARTITIONS
PartitionName=gpu Nodes=gpu[1-4] Default=YES State=UP
"""


def reasons(new: str, old: str | None = INSTALLED) -> list[str]:
    return CHANGES.slurm_conf_restart_reasons(old, new, RESTART_KEYS)


def test_a_timeout_or_a_partition_change_is_reconfigured():
    assert reasons(INSTALLED.replace("SlurmdTimeout=300", "SlurmdTimeout=299")) == []
    assert reasons(INSTALLED.replace("Default=YES State=UP", "Default=YES MaxTime=1-0 State=UP")) == []
    assert reasons(INSTALLED.replace("# NODES", "# the nodes")) == []  # comments are no settings
    assert reasons(INSTALLED.replace("SlurmdTimeout=300\n", "")) == []  # back to Slurm's default


def test_plugins_marked_keys_and_node_lines_need_a_restart():
    assert reasons(INSTALLED.replace("cons_tres", "linear")) == ["SelectType changed"]
    assert reasons(INSTALLED + "TaskPlugin=task/cgroup,task/affinity\n") == ["TaskPlugin changed"]
    assert reasons(INSTALLED.replace("bf_continue", "bf_continue,defer")) == ["SchedulerParameters changed"]
    assert reasons(INSTALLED.replace("SlurmctldHost=head", "SlurmctldHost=head2")) == ["SlurmctldHost changed"]
    assert reasons(INSTALLED.replace("gpu:h200:8", "gpu:h200:7")) == [
        "node lines changed (nodes added, removed or redefined)"]
    assert reasons(INSTALLED.replace("gpu[1-4]", "gpu[1-5]")) == [
        "node lines changed (nodes added, removed or redefined)"]


def test_a_node_without_an_installed_file_starts_its_daemons_with_the_new_one():
    assert reasons(INSTALLED, old=None) == ["no slurm.conf installed yet"]
    assert reasons(INSTALLED, old="") == ["no slurm.conf installed yet"]
