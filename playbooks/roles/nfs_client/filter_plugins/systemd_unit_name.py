"""systemd_mount_unit: the name systemd gives the mount unit of a path, as `systemd-escape --path
--suffix=mount PATH` prints it (systemd.unit(5), "String Escaping for Inclusion in Unit Names"; systemd's
unit_name_path_escape):

    {{ '/home' | systemd_mount_unit }}                           -> home.mount
    {{ '/shared/ml-data' | systemd_mount_unit }}                 -> shared-ml\\x2ddata.mount
    {{ '/lustre' | systemd_mount_unit('automount') }}            -> lustre.automount

The path is simplified (duplicate and trailing slashes dropped), the leading slash removed, every other
'/' becomes '-', and every byte that is not an ASCII letter, digit, ':', '_' or '.' (a leading '.' too)
becomes \\xNN. tests/component/test_storage_roles.py compares it with systemd-escape itself. Shared by
nfs_client and lustre_client (lustre_client/filter_plugins links to this file).
"""

_VALID = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.")


def systemd_escape_path(path: str) -> str:
    parts = [part for part in str(path).split("/") if part]
    if not parts:
        return "-"
    if any(part in (".", "..") for part in parts):
        raise ValueError(f"{path!r} is not a normalized path (systemd-escape refuses it)")
    raw = "/".join(parts).encode()
    out = []
    for index, byte in enumerate(raw):
        if byte == ord("/"):
            out.append("-")
        elif byte in _VALID and not (index == 0 and byte == ord(".")):
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02x}")
    return "".join(out)


def systemd_mount_unit(path: str, suffix: str = "mount") -> str:
    return f"{systemd_escape_path(path)}.{suffix}"


class FilterModule:
    def filters(self):
        return {"systemd_mount_unit": systemd_mount_unit}
