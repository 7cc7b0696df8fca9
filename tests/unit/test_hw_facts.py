"""The hardware discovery module (playbooks/library/opsctl_hw_facts.py), run without Ansible or a
process: its `nvidia-smi topo -m` parser against the real 8x H100 capture (tests/fixtures/SOURCES.md),
and its nvidia-smi calls against a fake of the module's own interface (run_command, fail_json,
get_bin_path). That the module runs under Ansible is proven in the component and lab tiers.
"""

import ast
from pathlib import Path

import pytest

from opsctl.hw import pcie_tree
from opsctl.ib import rails
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.ib_sysfs import write_tree
from tests.pcie_tree import build_sysfs
from tests.unit.test_roles_static import load_ansible_module

REPO = Path(__file__).resolve().parents[2]
GPU_FIXTURES = REPO / "tests" / "fixtures" / "gpu"
TOPO_H100 = (GPU_FIXTURES / "nvidia-smi_topo_-m_8xH100_HGX_NV18.txt").read_text()
Q_H200 = (GPU_FIXTURES / "nvidia-smi_q_and_query-gpu_csv_H200_1gpu.txt").read_text()


# Loaded at import: Ansible's module_utils ask ldconfig for libraries once, which a unit test may not run.
HW = load_ansible_module("opsctl_hw_facts")

# The capture's cells after NIC5, as `cat -A` shows them (^I is a tab):
#   GPU0^I...^INODE^I^I0^I^IN/A   -> CPU Affinity "", NUMA Affinity "0", "", GPU NUMA ID "N/A"
#   GPU4^I...^INODE^I1^I1^I^IN/A  -> CPU Affinity "1", NUMA Affinity "1", "", GPU NUMA ID "N/A"
# (Likely a process confined to CPU 1: nvidia-smi shows only the near CPUs the caller may use.)
H100_CPU_AFFINITY = {0: "", 1: "", 2: "", 3: "", 4: "1", 5: "1", 6: "1", 7: "1"}
H100_NUMA_AFFINITY = {0: "0", 1: "0", 2: "0", 3: "0", 4: "1", 5: "1", 6: "1", 7: "1"}


def edit_cell(text: str, row: str, column: str, value: str) -> str:
    """The capture with one cell of `row` under header `column` replaced (cells are tab-separated)."""
    lines = text.split("\n")
    header = next(i for i, line in enumerate(lines) if "CPU Affinity" in line.split("\t"))
    index = [cell.strip() for cell in lines[header].split("\t")].index(column)
    row_at = next(i for i, line in enumerate(lines) if line.split("\t")[0] == row)
    cells = lines[row_at].split("\t")
    cells[index] = value
    lines[row_at] = "\t".join(cells)
    return "\n".join(lines)


def test_topo_reads_the_cpu_affinity_column_of_the_real_capture():
    affinity = HW.parse_topo_affinity(TOPO_H100)
    assert affinity == H100_CPU_AFFINITY
    # GPU0-3 have an empty CPU Affinity cell: merging the tabs around it read NUMA Affinity "0" there.
    assert all(affinity[gpu] != H100_NUMA_AFFINITY[gpu] for gpu in range(4))


def test_topo_of_a_capture_with_an_empty_numa_cell():
    """Derived from the real capture, not captured: GPU4's NUMA Affinity emptied, GPU5's set to N/A,
    GPU6's GPU NUMA ID emptied (newer drivers print that column, and not always a value)."""
    text = edit_cell(TOPO_H100, "GPU4", "NUMA Affinity", "")
    text = edit_cell(text, "GPU5", "NUMA Affinity", "N/A")
    text = edit_cell(text, "GPU6", "GPU NUMA ID", "")
    assert text != TOPO_H100
    assert HW.parse_topo_affinity(text) == H100_CPU_AFFINITY


def test_topo_of_a_capture_with_a_cpu_list():
    """Derived from the real capture, not captured: GPU0's empty CPU Affinity cell filled in."""
    text = edit_cell(TOPO_H100, "GPU0", "CPU Affinity", "0-55,112-167")
    assert HW.parse_topo_affinity(text) == {**H100_CPU_AFFINITY, 0: "0-55,112-167"}


def test_topo_without_a_header_reads_nothing():
    assert HW.parse_topo_affinity("") == {}
    assert HW.parse_topo_affinity("No devices were found\n") == {}


# ---- nvidia-smi calls -----------------------------------------------------------------------------
class Failed(Exception):
    """What the fake's fail_json raises: AnsibleModule.fail_json exits and never returns."""


class FakeModule:
    """The part of AnsibleModule the module uses; answers nvidia-smi argv (after `timeout -k 5 N`)
    from `answers`: the argument after the path -> (rc, stdout)."""

    def __init__(self, answers: dict[str, tuple[int, str]]):
        self.answers = answers
        self.calls: list[list[str]] = []

    def get_bin_path(self, name, required=False):
        return f"/usr/bin/{name}"

    def run_command(self, argv):
        self.calls.append(list(argv))
        rc, out = self.answers[argv[5]]
        return rc, out, ""

    def fail_json(self, msg, **_kwargs):
        raise Failed(msg)


QUERY = "--query-gpu=index,name,pci.bus_id"
NVSMI = "/opt/nvidia/bin/nvidia-smi"


@pytest.fixture
def executable(monkeypatch):
    monkeypatch.setattr(HW.os, "access", lambda path, mode: path == NVSMI)


def test_driver_not_loaded_fails_on_a_gpu_node(executable):
    module = FakeModule({QUERY: (9, "")})
    with pytest.raises(Failed) as failed:
        HW.gpus(module, NVSMI)
    assert str(failed.value) == f"{NVSMI} exited 9: the NVIDIA driver is not loaded on this GPU node"
    assert "\n" not in str(failed.value)


def test_driver_not_loaded_is_no_gpus_elsewhere(executable):
    assert HW.gpus(FakeModule({QUERY: (9, "")}), NVSMI, gpu_node=False) == ([], [])


def test_missing_nvidia_smi_is_no_gpus(executable):
    assert HW.gpus(FakeModule({}), "/nonexistent/nvidia-smi") == ([], [])


@pytest.mark.parametrize("rc", [124, 137])  # TERM after the timeout; KILL 5 s later
@pytest.mark.parametrize("call", [QUERY, "-q", "topo"])
def test_a_call_that_does_not_answer_fails(executable, rc, call):
    answers = {QUERY: (0, "0, NVIDIA H200, 00000000:83:00.0\n"), "-q": (0, Q_H200), "topo": (0, TOPO_H100)}
    answers[call] = (rc, "")
    with pytest.raises(Failed) as failed:
        HW.gpus(FakeModule(answers), NVSMI, seconds=45)
    assert str(failed.value).startswith(f"{NVSMI} did not answer within 45 s: {NVSMI} ")


def test_every_call_runs_under_timeout(executable):
    """A real H200's -q (one GPU, minor 0) and the real H100 topology: GPU0's CPU Affinity is empty."""
    module = FakeModule({QUERY: (0, "0, NVIDIA H200, 00000000:83:00.0\n"), "-q": (0, Q_H200),
                         "topo": (0, TOPO_H100)})
    found, lost = HW.gpus(module, NVSMI, seconds=30)
    assert found == [{"index": 0, "name": "NVIDIA H200", "pci_bus_id": "00000000:83:00.0", "minor": 0,
                      "cores": ""}] and lost == []
    assert [call[:5] for call in module.calls] == [["/usr/bin/timeout", "-k", "5", "30", NVSMI]] * 3
    assert [call[5:] for call in module.calls] == [[QUERY, "--format=csv,noheader"], ["-q"], ["topo", "-m"]]


def test_new_options_are_documented():
    import yaml

    options = yaml.safe_load(HW.DOCUMENTATION)["options"]
    assert options["gpu_node"] == {**options["gpu_node"], "type": "bool", "default": True}
    assert options["command_timeout"] == {**options["command_timeout"], "type": "int", "default": 30}


# nvidia-smi's line for a GPU NVML cannot reach (XID 79, "fallen off the bus"), and its rc 15, as the
# lab's nvidia-smi prints them (lab/opsctl_lab/hwtools/nvidia_smi.py).
LOST_LINE = "Unable to determine the device handle for GPU0000:DB:00.0: Unknown Error\n"


def test_a_gpu_off_the_bus_leaves_the_others_and_is_named(executable):
    """rc 15: the GPUs that answer are the node's; the lost one is kept by its bus id, never dropped."""
    module = FakeModule({QUERY: (15, LOST_LINE + "0, NVIDIA H200, 00000000:83:00.0\n"), "-q": (15, LOST_LINE + Q_H200),
                         "topo": (0, TOPO_H100)})
    found, lost = HW.gpus(module, NVSMI)
    assert [(gpu["index"], gpu["minor"]) for gpu in found] == [(0, 0)]
    assert lost == ["0000:DB:00.0"]


def test_rc_15_without_a_lost_gpu_named_fails(executable):
    with pytest.raises(Failed, match="--query-gpu failed with rc 15"):
        HW.gpus(FakeModule({QUERY: (15, "0, NVIDIA H200, 00000000:83:00.0\n")}), NVSMI)



# The compute flag: the same rule as `opsctl ib check` (tests/unit/test_ib_rails.py), on the same trees.
DGX_TREE = (REPO / "tests" / "fixtures" / "ib" / "dgx-h100-pcie-tree.txt").read_text()
DGX_RAILS = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]


def compute_hcas(found):
    return [hca["name"] for hca in found if hca["compute"]]


def test_dgx_naming_flags_the_eight_rails_and_not_the_storage_ports(tmp_path):
    found = HW.hcas(str(build_sysfs(DGX_TREE, tmp_path)))
    assert sorted(compute_hcas(found)) == sorted(DGX_RAILS)
    assert len(found) == 12 and {h["name"]: h["link_layer"] for h in found}["mlx5_2"] == "Ethernet"


def test_the_lab_hgx_tree_flags_mlx5_0_to_7(tmp_path):
    write_tree(tmp_path, NodeHardware(node="gpu1"), now=0.0)
    assert compute_hcas(HW.hcas(str(tmp_path))) == [f"mlx5_{i}" for i in range(8)]


def test_the_sites_pattern_wins_over_discovery(tmp_path):
    root = str(build_sysfs(DGX_TREE, tmp_path))
    assert compute_hcas(HW.hcas(root, r"^mlx5_[0-7]$")) == [f"mlx5_{i}" for i in range(8)]


def test_no_gpu_in_the_pci_tree_makes_no_rail(tmp_path):
    hca = "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0 0x020700 0x15b3 mlx5_0 InfiniBand"
    assert compute_hcas(HW.hcas(str(build_sysfs(hca, tmp_path)))) == []


def test_the_module_and_opsctl_ib_check_run_one_copy_of_the_pcie_tree_rule():
    """The module's PCIe-tree code is opsctl/hw/pcie_tree.py, through the module_utils link that AnsiballZ
    ships, and rails.py uses the same; neither defines a function of that module again (rails.py's
    read_pci_tree only adds opsctl's error for a root without PCI devices)."""
    shared = Path(pcie_tree.__file__).resolve()
    for name in ("read_pci_tree", "near_gpu"):
        assert Path(getattr(HW, name).__code__.co_filename).resolve() == shared, name
    assert rails.near_gpu is pcie_tree.near_gpu and rails.read_sysfs_pci_tree is pcie_tree.read_pci_tree
    shared_functions = functions(shared)
    assert {"pci_path", "share_switch", "near_gpu", "read_pci_tree"} <= shared_functions
    assert not shared_functions & functions(REPO / "playbooks" / "library" / "opsctl_hw_facts.py")
    assert shared_functions & functions(Path(rails.__file__)) == {"read_pci_tree"}


def functions(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}
