"""What a lab package does when it is installed: its maintainer scripts and files, by the `role` its
data gives it. Packages without a role only carry their control fields (apt resolves them; dpkg installs
nothing). Scripts are POSIX sh, as dpkg runs them, and fail where the real ones fail."""

from collections.abc import Callable
from dataclasses import dataclass, field

from opsctl_lab.installed_tools import tool_wrapper
from opsctl_lab.vendor_repos import kmod


@dataclass
class Contents:
    scripts: dict[str, str] = field(default_factory=dict)  # postinst, prerm, ...: script text
    files: dict[str, tuple[int, str]] = field(default_factory=dict)  # path: (mode, text)


def _script(body: str) -> str:
    return "#!/bin/sh\nset -e\n" + body.strip() + "\n"


# dh_dkms' postinst skips a kernel without headers, with this line, and succeeds (dkms_common.postinst).
_HEADERS_CHECK = """
release=$(uname -r)
if [ ! -e "/lib/modules/$release/build" ]; then
    echo "Module build for kernel $release was skipped since the kernel headers for this kernel" \
        "do not seem to be installed." >&2
    exit 0
fi
modules="/lib/modules/$release/updates/dkms"
mkdir -p "$modules"
"""


def _module_line(path: str, fields: str) -> str:
    return f'printf "%s\\n" {kmod.MAGIC} {fields} > "{path}"\n'


def nvidia_dkms(version: str, upstream: str) -> Contents:
    """nvidia-kernel-open-dkms / nvidia-dkms-<branch>-open: the open kernel modules of this driver,
    nvidia-peermem with the peer-memory symbols only if MLNX_OFED's tree is there now (kmod.py)."""
    ofa = kmod.OFA_ROOT
    trees = " ".join(f'"/{ofa}/{candidate.format(release="$release")}"' for candidate in kmod.OFA_CANDIDATES)
    peermem_fields = f'"name=nvidia_peermem" "version={upstream}" "needs={kmod.PEER_SYMBOL}" "ib_core=$ofed"'
    body = f"""
[ "$1" = configure ] || exit 0
{_HEADERS_CHECK}
for module in nvidia nvidia-uvm nvidia-modeset nvidia-drm; do
    {_module_line('$modules/$module.ko', f'"name=$module" "version={upstream}"').strip()}
done
ofed=""
for tree in {trees}; do
    if [ -f "$tree/Module.symvers" ] && grep -q {kmod.PEER_SYMBOL} "$tree/Module.symvers"; then
        ofed=$(cat "$tree/opsctl-lab-version" 2>/dev/null || echo unknown)
        break
    fi
done
if [ -z "$ofed" ]; then
    echo "nvidia-peermem: MLNX_OFED kernel tree not found under /{ofa}: built without peer memory support" >&2
fi
{_module_line('$modules/nvidia-peermem.ko', peermem_fields).strip()}
echo "nvidia {upstream}: built and installed for kernel $release"
"""
    prerm = """
[ "$1" = remove ] || [ "$1" = purge ] || exit 0
rm -f /lib/modules/*/updates/dkms/nvidia.ko /lib/modules/*/updates/dkms/nvidia-*.ko
"""
    return Contents(scripts={"postinst": _script(body), "prerm": _script(prerm)})


def ofed_dkms(version: str, upstream: str) -> Contents:
    """mlnx-ofed-kernel-dkms: MLNX_OFED's kernel modules, and the tree other modules build against
    (/usr/src/ofa_kernel/<arch>/<kernel>, `default` linked to it), with the peer-memory symbols."""
    ofa = kmod.OFA_ROOT
    body = f"""
[ "$1" = configure ] || exit 0
{_HEADERS_CHECK}
tree="/{ofa}/x86_64/$release"
mkdir -p "$tree"
printf "0x00000000\\t%s\\tdrivers/infiniband/core/ib_core\\tEXPORT_SYMBOL\\t\\n" \\
    {kmod.PEER_SYMBOL} ib_register_client > "$tree/Module.symvers"
echo "{version}" > "$tree/opsctl-lab-version"
ln -sfn "x86_64/$release" "/{ofa}/default"
for module in ib_core mlx5_core mlx5_ib ib_uverbs; do
    {_module_line('$modules/$module.ko', f'"name=$module" "version={upstream}" "ofed={version}"').strip()}
done
echo "mlnx-ofed-kernel {version}: built and installed for kernel $release"
"""
    prerm = f"""
[ "$1" = remove ] || [ "$1" = purge ] || exit 0
rm -rf /{ofa}
"""
    return Contents(scripts={"postinst": _script(body), "prerm": _script(prerm)})


def headers(version: str, upstream: str) -> Contents:
    """linux-headers-<kernel> of the lab's kernel: the build directory DKMS looks for."""
    release = kmod.kernel()
    return Contents(files={f"/usr/src/linux-headers-{release}/Makefile": (0o644, "# opsctl lab stand-in\n")},
                    scripts={"postinst": _script(f"""
[ "$1" = configure ] || exit 0
mkdir -p /lib/modules/{release}
ln -sfn /usr/src/linux-headers-{release} /lib/modules/{release}/build
""")})


# Lustre's client modules as lustre-release installs them (DEST_MODULE_LOCATION /updates/kernel/{fs,net}/lustre),
# reduced to LNet's, its two network drivers and the client's core.
LUSTRE_MODULES = {"net": ("libcfs", "lnet", "ksocklnd", "ko2iblnd"), "fs": ("obdclass", "ptlrpc", "lustre")}


def _lustre_module_paths(release: str) -> list[tuple[str, str]]:
    return [(name, f"/lib/modules/{release}/updates/kernel/{kind}/lustre/{name}.ko")
            for kind, names in LUSTRE_MODULES.items() for name in names]


def lustre_prebuilt(version: str, upstream: str) -> Contents:
    """lustre-client-modules-<kernel>: Whamcloud's modules, built for one kernel against its own RDMA stack,
    so ko2iblnd loads only while the kernel's ib_core is the one running (not once DOCA-OFED replaced it)."""
    release = kmod.kernel()
    files = {}
    for name, path in _lustre_module_paths(release):
        o2ib = {"ib_core": kmod.IN_KERNEL} if name == "ko2iblnd" else {}
        files[path] = (0o644, kmod.text({"name": name, "version": upstream, **o2ib}))
    return Contents(files=files)


def lustre_dkms(version: str, upstream: str) -> Contents:
    """lustre-client-modules-dkms: its postinst runs `dkms build ... && dkms install ... || true`, so a build
    that fails leaves no modules and the install succeeds. configure builds ko2iblnd against MLNX_OFED's tree
    when it finds `ofed_info` (and fails when that tree is missing), else against the kernel's RDMA headers
    (lnet/autoconf/lustre-lnet.m4; data/lustre.yml)."""
    tree = f"/{kmod.OFA_ROOT}/default"
    o2ib = ' "ib_core=$ib_core"'  # the ib_core configure built it against (lustre_prebuilt's is the kernel's)
    writes = "\n".join(
        _module_line(path, f'"name={name}" "version={upstream}"' + (o2ib if name == "ko2iblnd" else "")).strip()
        for name, path in _lustre_module_paths("$release"))
    body = f"""
[ "$1" = configure ] || exit 0
release=$(uname -r)
if [ ! -e "/lib/modules/$release/build" ]; then
    echo "Error! Your kernel headers for kernel $release cannot be found." >&2
    exit 0
fi
ib_core={kmod.IN_KERNEL}
if command -v ofed_info >/dev/null 2>&1; then
    if [ ! -f "{tree}/Module.symvers" ]; then
        echo "configure: error: can't find the OFED kernel tree of the installed OFED packages" >&2
        exit 0
    fi
    ib_core=$(cat "{tree}/opsctl-lab-version")
fi
mkdir -p "/lib/modules/$release/updates/kernel/net/lustre" "/lib/modules/$release/updates/kernel/fs/lustre"
{writes}
echo "lustre-client-modules {upstream}: built and installed for kernel $release (o2ib against $ib_core)"
"""
    # Its prerm runs `dkms remove ... --all` whatever dpkg asks (an upgrade or a reinstall too), so a reinstall
    # builds the modules again against the tree installed now.
    prerm = """
rm -rf /lib/modules/*/updates/kernel/net/lustre /lib/modules/*/updates/kernel/fs/lustre
"""
    return Contents(scripts={"postinst": _script(body), "prerm": _script(prerm)})


def ofed_release(upstream: str) -> str:
    """MLNX_OFED's release from its packages' upstream version: 24.10.OFED.24.10.1.1.4 -> 24.10-1.1.4.0 (the
    release that doca.yml names for DOCA 2.9: year.month, a dash, the build with a trailing .0)."""
    if ".OFED." not in upstream:
        return upstream
    year, month, *build = upstream.split(".OFED.", 1)[1].split(".")
    return f"{year}.{month}-{'.'.join([*build, '0'])}"


def ofed_info(version: str, upstream: str) -> Contents:
    """ofed-scripts' /usr/bin/ofed_info: the installed MLNX_OFED's release (`-s`: the short form, one line), in
    its own spelling (24.10-1.1.4.0), not the package's (24.10.OFED.24.10.1.1.4)."""
    release = ofed_release(upstream)
    text = (f'#!/bin/sh\nif [ "$1" = -s ]; then echo "MLNX_OFED_LINUX-{release}:"; exit 0; fi\n'
            f'echo "MLNX_OFED_LINUX-{release} (OFED-{release}):"\n')
    return Contents(files={"/usr/bin/ofed_info": (0o755, text)})


def _unit(description: str) -> str:
    return (f"[Unit]\nDescription={description} (opsctl lab emulation)\n\n[Service]\nExecStart=/bin/sleep infinity\n\n"
            "[Install]\nWantedBy=multi-user.target\n")


def tool(path: str) -> Contents:
    """The lab's emulated tool at the real tool's path, as the machines' hardware install writes it."""
    return Contents(files={path: (0o755, tool_wrapper(path))})


def unit(name: str, description: str) -> Contents:
    return Contents(files={f"/lib/systemd/system/{name}": (0o644, _unit(description))})


def dcgm_core() -> Contents:
    """datacenter-gpu-manager-4-core ships dcgmi and the host engine's unit, nvidia-dcgm.service (NVIDIA/DCGM
    scripts/verify_package_contents/datacenter-gpu-manager-core_amd64.deb.txt)."""
    files = {**tool("/usr/bin/dcgmi").files, **unit("nvidia-dcgm.service", "NVIDIA DCGM host engine").files}
    return Contents(files=files)


ROLES: dict[str, Callable[[str, str], Contents]] = {
    "nvidia-dkms": nvidia_dkms,
    "ofed-dkms": ofed_dkms,
    "kernel-headers": headers,
    "nvidia-smi": lambda v, u: tool("/usr/bin/nvidia-smi"),
    "dcgmi": lambda v, u: dcgm_core(),
    "dcgm-exporter": lambda v, u: unit("nvidia-dcgm-exporter.service", "NVIDIA dcgm-exporter"),
    "ibstat": lambda v, u: tool("/usr/sbin/ibstat"),
    "ibv_devinfo": lambda v, u: tool("/usr/bin/ibv_devinfo"),
    "ib_write_bw": lambda v, u: tool("/usr/bin/ib_write_bw"),
    "fabricmanager": lambda v, u: unit("nvidia-fabricmanager.service", "NVIDIA fabric manager"),
    "persistenced": lambda v, u: unit("nvidia-persistenced.service", "NVIDIA persistence daemon"),
    "ofed-info": ofed_info,
    "lustre-prebuilt": lustre_prebuilt,
    "lustre-dkms": lustre_dkms,
    "lustre-utils": lambda v, u: Contents(files={
        **{path: tool(path).files[path] for path in ("/usr/sbin/lctl", "/usr/bin/lfs", "/usr/sbin/lnetctl")},
        **unit("lnet.service", "lnet management").files}),
}


def contents(role: str, version: str, upstream: str) -> Contents:
    """A role the lab does not emulate (yet), or none: control fields only."""
    behaviour = ROLES.get(role)
    return behaviour(version, upstream) if behaviour else Contents()
