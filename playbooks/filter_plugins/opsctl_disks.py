"""Jinja filters that decide whether the nfs_server role may touch a disk, from `blkid -p -o export`.

blkid_export: the KEY=VALUE lines of `blkid -p -o export DEVICE` as a dict ({} when blkid found nothing,
exit code 2):

    {{ 'TYPE=xfs\\nLABEL=opsctl-nfs' | blkid_export }}  -> {'TYPE': 'xfs', 'LABEL': 'opsctl-nfs'}

foreign_signatures: of the results of a looped `blkid -p -o export {{ item }}` task ({item, stdout} each),
the devices that hold a filesystem, a RAID member's superblock or a partition table that this role did
not make, each as 'DEVICE (what)'. The role's own result is never foreign: XFS with the role's label on
a single device, or an md member named after the role's array:

    {{ [{'item': '/dev/vdc', 'stdout': 'TYPE=ext4'}] | foreign_signatures('opsctl-nfs', 'opsctl-nfs') }}
    -> ['/dev/vdc (ext4)']
"""


def blkid_export(text: str) -> dict:
    found = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            found[key.strip()] = value.strip()
    return found


def _ours(signature: dict, fs_label: str, array_name: str, members: int) -> bool:
    if members == 1:
        return signature.get("TYPE") == "xfs" and signature.get("LABEL") == fs_label
    # mdadm names a member "<homehost>:<name>" (or "<name>" alone when the host part is empty).
    label = signature.get("LABEL", "")
    return signature.get("TYPE") == "linux_raid_member" and label.rpartition(":")[2] == array_name


def foreign_signatures(results: list, fs_label: str, array_name: str) -> list:
    found = []
    for entry in results:
        signature = blkid_export(entry.get("stdout", ""))
        what = signature.get("TYPE") or (f"{signature['PTTYPE']} partition table" if "PTTYPE" in signature else "")
        if what and not _ours(signature, fs_label, array_name, len(results)):
            found.append(f"{entry['item']} ({what})")
    return found


class FilterModule:
    def filters(self):
        return {"blkid_export": blkid_export, "foreign_signatures": foreign_signatures}
