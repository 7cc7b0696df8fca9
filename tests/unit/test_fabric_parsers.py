"""The fabric parsers on real tool output (tests/fixtures/, sources in SOURCES.md) and on broken input."""

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.fabrictest.ib_write_bw import parse_ib_write_bw
from opsctl.gpu.nvidia_smi import parse_nvidia_smi_csv
from opsctl.ib.ibstat import parse_ibstat
from opsctl.ib.ibv_devinfo import parse_ibv_devinfo
from tests.conftest import FIXTURES

IB = FIXTURES / "infiniband"
IBSTAT_SOME_DOWN = (IB / "gpud_ibstat.47.0.h100.some.down.0.txt").read_text()
IBSTAT_ALL_ACTIVE = (IB / "gpud_ibstat.47.0.h100.all.active.0.txt").read_text()
DEVINFO_IB = (IB / "ibv_devinfo_cx6_ib_mlx5_0.txt").read_text()
# ib_read_bw then ib_write_bw in one session, CX-7 NDR back to back, client side.
PERFTEST = (IB / "ib_write_bw_ib_read_bw_cx7_ndr_b2b_client.txt").read_text()
# H200 `--query-gpu` csv, a few of the real columns (nvidia_gpu_exporter capture, driver 590.48.01).
CSV = ("name, pci.bus_id, memory.total [MiB], memory.used [MiB], power.draw [W], fan.speed [%], "
       "temperature.gpu\nNVIDIA H200, 00000000:83:00.0, 143771 MiB, 0 MiB, 77.71 W, [N/A], 28\n")
H200_CAPTURE = (FIXTURES / "gpu" / "nvidia-smi_q_and_query-gpu_csv_H200_1gpu.txt").read_text()


def test_ibstat_real_some_down():
    cas = {ca.name: ca for ca in parse_ibstat(IBSTAT_SOME_DOWN)}
    assert len(cas) == 12
    assert (cas["mlx5_0"].ca_type, cas["mlx5_0"].firmware) == ("MT4129", "28.39.1002")
    down = cas["mlx5_2"].ports[0]
    assert (cas["mlx5_2"].ca_type, down.state, down.physical_state, down.rate, down.link_layer) == (
        "MT4125", "Down", "Disabled", 40, "Ethernet")
    rails = [ca for ca in cas.values() if ca.ports[0].link_layer == "InfiniBand"]
    assert len(rails) == 8 and {(p.state, p.rate) for ca in rails for p in ca.ports} == {("Active", 400)}


def test_ibstat_real_all_active():
    cas = parse_ibstat(IBSTAT_ALL_ACTIVE)
    assert len(cas) == 12 and all(port.state == "Active" for ca in cas for port in ca.ports)


def test_ibv_devinfo_real():
    dev = parse_ibv_devinfo(DEVINFO_IB)[0]
    assert (dev.hca_id, dev.fw_ver, dev.vendor_part_id, dev.board_id) == ("mlx5_0", "20.41.1000", 4123,
                                                                          "MT_0000000222")
    port = dev.ports[1]
    assert (port.state, port.state_code, port.link_layer) == ("PORT_ACTIVE", 4, "InfiniBand")
    assert port.fields == {"max_mtu": "4096 (5)", "active_mtu": "4096 (5)", "sm_lid": "35", "port_lid": "35",
                           "port_lmc": "0x00"}


def test_perftest_last_run_wins_and_noise_is_skipped():
    result = parse_ib_write_bw(PERFTEST)
    assert (result.test, result.iterations, result.bw_peak, result.bw_average, result.msg_rate_mpps) == (
        "RDMA_Write BW Test", 5000, 392.38, 392.34, 0.748336)
    assert result.unit == "Gb/sec" and result.link_type == "IB"


def test_nvidia_smi_csv_real():
    row = parse_nvidia_smi_csv(CSV)[0]
    assert row == {"name": "NVIDIA H200", "pci.bus_id": "00000000:83:00.0", "memory.total": 143771,
                   "memory.used": 0, "power.draw": 77.71, "fan.speed": None, "temperature.gpu": 28}


@pytest.mark.parametrize("parser,text", [
    (parse_ibstat, "\tCA type: MT4129\n"),
    (parse_ibv_devinfo, "\tfw_ver:\t\t\t\t1.2\n"),
    (parse_ib_write_bw, "Couldn't connect to gpu2:18515\n"),
    (parse_nvidia_smi_csv, ""),
    (parse_nvidia_smi_csv, "name, memory.total [MiB]\nNVIDIA H200\n"),
])
def test_broken_output_is_a_source_error(parser, text):
    with pytest.raises(SourceUnavailable):
        parser(text)


def test_empty_ibstat_is_no_cas():
    assert parse_ibstat("") == []
