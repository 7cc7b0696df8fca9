"""The fabric parsers on real tool output (excerpts of public captures, see the comments) and on
broken input."""

import pytest

from opsctl.errors import SourceUnavailable
from opsctl.fabric import (
    process_ib_write_bw_output,
    process_ibstat_output,
    process_ibv_devinfo_output,
    process_nvidia_smi_csv_output,
)

# `ibstat` with one port down (gpud testdata ibstat.47.0.h100.some.down.0, two CAs of it).
IBSTAT_SOME_DOWN = (
    "CA 'mlx5_0'\n\tCA type: MT4129\n\tNumber of ports: 1\n\tFirmware version: 28.39.1002\n\tHardware version: 0\n"
    "\tNode GUID: 0xa088c20300e3142a\n\tSystem image GUID: 0xa088c20300e3142a\n\tPort 1:\n\t\tState: Active\n"
    "\t\tPhysical state: LinkUp\n\t\tRate: 400\n\t\tBase lid: 0\n\t\tLMC: 0\n\t\tSM lid: 0\n"
    "\t\tCapability mask: 0x00010000\n\t\tPort GUID: 0xa288c2fffee3142a\n\t\tLink layer: Ethernet\n"
    "CA 'mlx5_2'\n\tCA type: MT4125\n\tNumber of ports: 1\n\tFirmware version: 22.38.1002\n\tHardware version: 0\n"
    "\tNode GUID: 0x946dae0300c2b691\n\tSystem image GUID: 0x946dae0300c2b691\n\tPort 1:\n\t\tState: Down\n"
    "\t\tPhysical state: Disabled\n\t\tRate: 40\n\t\tBase lid: 0\n\t\tLMC: 0\n\t\tSM lid: 0\n"
    "\t\tCapability mask: 0x00010000\n\t\tPort GUID: 0x966daefffec2b691\n\t\tLink layer: Ethernet\n"
)
# `ibv_devinfo` on a ConnectX-6 IB host, from a public issue report.
DEVINFO_IB = (
    "hca_id:\tmlx5_0\n\ttransport:\t\t\tInfiniBand (0)\n\tfw_ver:\t\t\t\t20.41.1000\n"
    "\tnode_guid:\t\t\ta088:c203:0096:05fc\n\tsys_image_guid:\t\t\ta088:c203:0096:05fc\n\tvendor_id:\t\t\t0x02c9\n"
    "\tvendor_part_id:\t\t\t4123\n\thw_ver:\t\t\t\t0x0\n\tboard_id:\t\t\tMT_0000000222\n\tphys_port_cnt:\t\t\t1\n"
    "\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\t\t\tmax_mtu:\t\t4096 (5)\n\t\t\tactive_mtu:\t\t4096 (5)\n"
    "\t\t\tsm_lid:\t\t\t35\n\t\t\tport_lid:\t\t35\n\t\t\tport_lmc:\t\t0x00\n\t\t\tlink_layer:\t\tInfiniBand\n\n"
)
# ib_read_bw then ib_write_bw, CX-7 NDR back to back, client side (shared/samples/infiniband/).
PERFTEST = """\
                    RDMA_Read BW Test
 Dual-port       : OFF\t\tDevice         : mlx5_0
 Link type       : IB
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
Conflicting CPU frequency values detected: 3295.212000 != 5003.410000. CPU Frequency is not max.
 65536      1000             328.64             328.61 \t\t     0.626777
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : mlx5_0
 Link type       : IB
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
Conflicting CPU frequency values detected: 3295.212000 != 4999.302000. CPU Frequency is not max.
 65536      5000             392.38             392.34 \t\t     0.748336
"""
# H200 `--query-gpu` csv, a few of the real columns (nvidia_gpu_exporter capture, driver 590.48.01).
CSV = ("name, pci.bus_id, memory.total [MiB], memory.used [MiB], power.draw [W], fan.speed [%], "
       "temperature.gpu\nNVIDIA H200, 00000000:83:00.0, 143771 MiB, 0 MiB, 77.71 W, [N/A], 28\n")


def test_ibstat_real_some_down():
    cas = process_ibstat_output(IBSTAT_SOME_DOWN)
    assert [(c.name, c.ca_type, c.firmware) for c in cas] == [("mlx5_0", "MT4129", "28.39.1002"),
                                                              ("mlx5_2", "MT4125", "22.38.1002")]
    assert (cas[1].ports[0].state, cas[1].ports[0].physical_state, cas[1].ports[0].rate) == ("Down", "Disabled", 40)
    assert cas[0].ports[0].link_layer == "Ethernet"


def test_ibv_devinfo_real():
    dev = process_ibv_devinfo_output(DEVINFO_IB)[0]
    assert (dev.hca_id, dev.fw_ver, dev.vendor_part_id, dev.board_id) == ("mlx5_0", "20.41.1000", 4123,
                                                                          "MT_0000000222")
    assert dev.ports[1] | {} == {"state": "PORT_ACTIVE", "state_code": 4, "max_mtu": "4096 (5)",
                                 "active_mtu": "4096 (5)", "sm_lid": "35", "port_lid": "35", "port_lmc": "0x00",
                                 "link_layer": "InfiniBand"}


def test_perftest_last_run_wins_and_noise_is_skipped():
    result = process_ib_write_bw_output(PERFTEST)
    assert (result.test, result.iterations, result.bw_peak, result.bw_average, result.msg_rate_mpps) == (
        "RDMA_Write BW Test", 5000, 392.38, 392.34, 0.748336)
    assert result.unit == "Gb/sec" and result.link_type == "IB"


def test_nvidia_smi_csv_real():
    row = process_nvidia_smi_csv_output(CSV)[0]
    assert row == {"name": "NVIDIA H200", "pci.bus_id": "00000000:83:00.0", "memory.total": 143771,
                   "memory.used": 0, "power.draw": 77.71, "fan.speed": None, "temperature.gpu": 28}


@pytest.mark.parametrize("parser,text", [
    (process_ibstat_output, "\tCA type: MT4129\n"),
    (process_ibv_devinfo_output, "\tfw_ver:\t\t\t\t1.2\n"),
    (process_ib_write_bw_output, "Couldn't connect to gpu2:18515\n"),
    (process_nvidia_smi_csv_output, ""),
    (process_nvidia_smi_csv_output, "name, memory.total [MiB]\nNVIDIA H200\n"),
])
def test_broken_output_is_a_source_error(parser, text):
    with pytest.raises(SourceUnavailable):
        parser(text)


def test_empty_ibstat_is_no_cas():
    assert process_ibstat_output("") == []
