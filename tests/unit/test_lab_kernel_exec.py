"""opsctl_lab.kernel_exec, the lab's stand-in for what the kernel logs of an exec with an empty argv: the
record in fs/exec.c's words at KERN_WARNING, once each emulated boot (pr_warn_once), and bprm->filename of
an execveat. The tracing itself runs in the lab test (tests/integration/lab/test_lab_forged_xid.py)."""

from opsctl.gpu.kmsg import ignored_because, parse_records
from opsctl_lab.hardware import NodeHardware
from opsctl_lab.kernel_exec import Launch, _fd_path, log_launches
from tests.conftest import FIXTURES

T0 = 1_800_000_000.0
FORGED = "/tmp/k43/NVRM: Xid (PCI:0000:8a:00): 142, pid=1, name=x, y"


def test_the_record_is_the_kernels_and_written_once_a_boot():
    hw = NodeHardware(node="gpu032", booted=T0)
    launch = Launch("perl", FORGED)
    assert log_launches(hw, [launch, Launch("sh", "/tmp/other")], T0 + 2.5)
    assert not log_launches(hw, [launch], T0 + 3)  # pr_warn_once: the boot has warned
    real = parse_records((FIXTURES / "kmsg" / "kmsg_quoted_driver_text.txt").read_text())[0]
    assert hw.kernel_log == [{"prio": 4, "seq": 0, "usec": 2_500_000, "message": real.message}]
    hw.reboot(T0 + 60)
    assert log_launches(hw, [launch], T0 + 61) and len(hw.kernel_log) == 1
    record = parse_records(f"{hw.kernel_log[0]['prio']},0,1,-;{hw.kernel_log[0]['message']}\n")[0]
    assert record.from_kernel and ignored_because(record) == "quoted"


def test_execveat_names_the_file_as_the_kernel_does():
    assert _fd_path(-100, b"./x") == b"./x"  # AT_FDCWD: the path as given
    assert _fd_path(3, b"/abs/x") == b"/abs/x"
    assert _fd_path(4, b"./file1") == b"/dev/fd/4/./file1"
    assert _fd_path(5, b"") == b"/dev/fd/5"  # AT_EMPTY_PATH
