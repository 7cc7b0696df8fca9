"""`opsctl ib check`: the InfiniBand hardware of one node against a profile (check), read live from sysfs or
from a capture (collect), and the parsers of what the tools print (ibstat, ibv_devinfo, sysfs, PCIe)."""
