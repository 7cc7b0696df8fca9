"""The nfs_server role's decision to touch a disk or refuse it (playbooks/filter_plugins/opsctl_disks.py),
from `blkid -p -o export` output as the role's looped task registers it."""

from tests.unit.test_roles_static import PLAYBOOKS, load_module

DISKS = load_module(PLAYBOOKS / "filter_plugins" / "opsctl_disks.py", "opsctl_disks")
LABEL, ARRAY = "opsctl-nfs", "opsctl-nfs"

# `blkid -p -o export /dev/vdc` on the lab storage machine's data disk (mkfs.ext4 -L olddata).
EXT4 = ("DEVNAME=/dev/vdc\nLABEL=olddata\nUUID=777196ac-3c49-432f-9eef-e1f24cf5ba55\nVERSION=1.0\nBLOCK_SIZE=1024\n"
        "TYPE=ext4\nUSAGE=filesystem")


def result(device: str, stdout: str) -> dict:
    return {"item": device, "stdout": stdout}


def test_blkid_export_reads_key_value_lines_and_nothing_found_is_empty():
    assert DISKS.blkid_export(EXT4)["TYPE"] == "ext4"
    assert DISKS.blkid_export("") == {}


def test_a_disk_with_a_filesystem_is_foreign_and_a_blank_one_is_not():
    found = DISKS.foreign_signatures([result("/dev/vdb", ""), result("/dev/vdc", EXT4)], LABEL, ARRAY)
    assert found == ["/dev/vdc (ext4)"]


def test_a_partition_table_alone_is_foreign():
    assert DISKS.foreign_signatures([result("/dev/nvme1n1", "PTUUID=ab\nPTTYPE=gpt")], LABEL, ARRAY) == [
        "/dev/nvme1n1 (gpt partition table)"]


def test_the_roles_own_xfs_is_not_foreign_but_another_label_is():
    ours = "LABEL=opsctl-nfs\nTYPE=xfs\nUSAGE=filesystem"
    assert DISKS.foreign_signatures([result("/dev/vdb", ours)], LABEL, ARRAY) == []
    other = "LABEL=scratch\nTYPE=xfs"
    assert DISKS.foreign_signatures([result("/dev/vdb", other)], LABEL, ARRAY) == ["/dev/vdb (xfs)"]


def test_members_of_the_roles_array_are_not_foreign_but_another_arrays_are():
    member = "UUID=1\nLABEL=stor01:opsctl-nfs\nTYPE=linux_raid_member"
    stranger = "UUID=2\nLABEL=oldhost:data\nTYPE=linux_raid_member"
    both = [result("/dev/nvme1n1", member), result("/dev/nvme2n1", stranger)]
    assert DISKS.foreign_signatures(both, LABEL, ARRAY) == ["/dev/nvme2n1 (linux_raid_member)"]
    # On a single device, a RAID member is never the role's own result (it makes XFS there).
    assert DISKS.foreign_signatures([result("/dev/nvme1n1", member)], LABEL, ARRAY) == [
        "/dev/nvme1n1 (linux_raid_member)"]
