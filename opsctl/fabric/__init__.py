"""fabric: parsers of what GPU and InfiniBand tools print (ibstat, ibv_devinfo, ib_write_bw,
nvidia-smi csv)."""

from opsctl.fabric.ib_write_bw import BandwidthResult, process_ib_write_bw_output
from opsctl.fabric.ibstat import IbCa, IbPort, process_ibstat_output
from opsctl.fabric.ibv_devinfo import VerbsDevice, VerbsPort, process_ibv_devinfo_output
from opsctl.fabric.nvidia_smi import process_nvidia_smi_csv_output

__all__ = ["BandwidthResult", "IbCa", "IbPort", "VerbsDevice", "VerbsPort", "process_ib_write_bw_output",
           "process_ibstat_output", "process_ibv_devinfo_output", "process_nvidia_smi_csv_output"]
