"""opsctl.nodecheck.kernel_log: only the records after the last run's are counted, a new boot or a log that
started again is read from its start, the counts survive runs and reboots in the state file (never
followed through a symlink), a log that cannot be read is a check that could not run; and the metrics
text that node check writes for them; records that quote the driver's words count nothing and are counted
apart. The log is a file of /dev/kmsg records (tests/fixtures/kmsg)."""

import json
import os

import pytest

from opsctl.config.schema import GpuConfig
from opsctl.errors import SourceUnavailable
from opsctl.gpu.kmsg import Record, parse_records
from opsctl.nodecheck import metrics_text
from opsctl.nodecheck.kernel_log import (
    STATE_FILE,
    XID_WINDOW_S,
    KernelLogReport,
    KernelLogState,
    XidTally,
    advance,
    check_kernel_log,
)
from tests.conftest import FIXTURES

NODE_LOG = (FIXTURES / "kmsg" / "kmsg_h200_node.txt").read_text()
RECORDS = parse_records(NODE_LOG)
T0 = 1_800_000_000.0
BOOT = "bf2dc59e-5ec2-41cf-9e7e-0ec2798e9b63"
# One more record of the journalctl capture (tests/fixtures/kmsg/journalctl_xid48_171_63_154.txt).
MORE = "3,1212,6781790000000,-;NVRM: Xid (PCI:0000:55:00): 63, pid=2187734, name=python, Row Remapper: New row " \
       "(0x0000000e9b9107e0) marked for remapping, reset gpu to activate.\n"
# Records that quote the driver's text and are not the driver's (tests/fixtures/SOURCES.md).
QUOTED = parse_records((FIXTURES / "kmsg" / "kmsg_quoted_driver_text.txt").read_text())
GPU_55, GPU_91, GPU_97 = "00000000:55:00.0", "00000000:91:00.0", "00000000:97:00.0"


def counts(state):
    return {key: tally.count for key, tally in state.xids.items()}


FIRST = {(GPU_91, 79): 1, (GPU_55, 48): 2, (GPU_55, 154): 1, (GPU_97, 119): 1, (GPU_97, 154): 1}


def test_the_first_read_counts_every_record_and_the_next_only_new_ones():
    state, seen = advance(KernelLogState(), BOOT, RECORDS, T0)
    assert counts(state) == FIRST and state.seq == 1211 and state.boot_id == BOOT
    assert [s.seq for s in seen] == [1202, 1204, 1207, 1208, 1209, 1210, 1211]  # not the Severity line (1205)
    assert state.sxids == {("00000000:06:00.0", 20034, True): XidTally(1, T0, [T0])}
    assert state.recovery == {GPU_55: "drain_and_reset", GPU_97: "reset"}
    again, seen = advance(state, BOOT, RECORDS, T0 + 60)
    assert seen == [] and again == state
    more, seen = advance(state, BOOT, RECORDS + parse_records(MORE), T0 + 120)
    assert [(s.seq, s.event.code) for s in seen] == [(1212, 63)]
    assert counts(more) == {**FIRST, (GPU_55, 63): 1} and more.seq == 1212
    assert more.xids[(GPU_55, 63)].last_seen == T0 + 120 and more.xids[(GPU_55, 48)].last_seen == T0


def test_a_new_boot_is_read_from_its_start_and_keeps_the_counts_but_not_the_boots_state():
    state, _ = advance(KernelLogState(), BOOT, RECORDS, T0)
    state.gpus = {GPU_55: 0}
    # After a reboot the sequence numbers start again, lower than the last one read.
    rebooted = parse_records("3,5,9000000,-;NVRM: Xid (PCI:0000:55:00): 48, pid=17, name=python, channel 0x00000002\n")
    after, seen = advance(state, "another-boot", rebooted, T0 + 600)
    assert [s.seq for s in seen] == [5] and after.seq == 5 and after.boot_id == "another-boot"
    assert counts(after) == {**FIRST, (GPU_55, 48): 3}  # counters: cumulative across reboots
    assert after.recovery == {} and after.gpus == {}  # the last boot's recovery actions and GPU indexes


def test_a_log_that_started_again_is_read_from_its_start():
    state, _ = advance(KernelLogState(), BOOT, RECORDS, T0)
    restarted = parse_records(MORE.replace("1212", "7"))  # the same boot, the newest record older than 1211
    after, seen = advance(state, BOOT, restarted, T0 + 60)
    assert [s.seq for s in seen] == [7] and after.seq == 7 and counts(after)[(GPU_55, 63)] == 1
    assert after.recovery == state.recovery  # same boot: still the GPUs' latest actions


def test_the_kernels_own_time_of_a_record_never_later_than_now():
    boot_time = T0 - 6781800.0  # booted 6781800 s (78.5 days) before T0
    state, seen = advance(KernelLogState(), BOOT, RECORDS, T0, boot_time)
    assert seen[0].time == pytest.approx(boot_time + 6781741.548779)
    assert state.xids[(GPU_97, 154)].last_seen == pytest.approx(boot_time + 6781770.5)
    _, seen = advance(KernelLogState(), BOOT, RECORDS, T0, T0)  # a clock that puts them in the future
    assert {s.time for s in seen} == {T0}


def test_an_xid_a_program_wrote_to_dev_kmsg_is_not_counted():
    forged = parse_records("12,1212,1,-;NVRM: Xid (PCI:0000:55:00): 79, GPU has fallen off the bus.\n")
    state, seen = advance(KernelLogState(), BOOT, RECORDS + forged, T0)
    assert counts(state) == FIRST and state.seq == 1212 and 1212 not in [s.seq for s in seen]


def test_defect_1_records_that_quote_the_drivers_text_count_nothing_and_are_counted_as_ignored():
    """A user's file named `NVRM: Xid (PCI:0000:8a:00): 142, ...` exec'd with an empty argv, its segfault, an audit
    message and a program's writes to /dev/kmsg (real records, kmsg_quoted_driver_text.txt) are no XID 142 on the
    GPU at 8a: only the driver's own lines count, and these are counted apart, by why they were ignored."""
    state, seen = advance(KernelLogState(), BOOT, RECORDS + QUOTED, T0)
    assert counts(state) == FIRST and state.sxids == {("00000000:06:00.0", 20034, True): XidTally(1, T0, [T0])}
    assert [s.seq for s in seen] == [1202, 1204, 1207, 1208, 1209, 1210, 1211] and state.seq == 1294
    assert state.ignored == {"quoted": 3, "userspace": 2}
    again, _ = advance(state, BOOT, RECORDS + QUOTED, T0 + 60)  # read once: the cursor passed them
    assert again.ignored == state.ignored
    assert KernelLogState.from_json(json.loads(json.dumps(again.to_json()))) == again


def test_the_latest_recovery_action_of_a_gpu_wins():
    records = parse_records("3,1,1,-;NVRM: Xid (PCI:0000:97:00): 154, GPU recovery action changed from 0x0 (None) to "
                            "0x4 (Drain and Reset)\n3,2,2,-;NVRM: Xid (PCI:0000:97:00): 154, GPU recovery action "
                            "changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)\n")
    assert advance(KernelLogState(), BOOT, records, T0)[0].recovery == {GPU_97: "reset"}


class FakeSmi:
    """The GpuIndexes protocol: an answer per call (a mapping, or SourceUnavailable to raise)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = 0

    def gpu_indexes(self):
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def node(tmp_path):
    """(config, state dir, boot id file, log file) of a node whose kernel log is a file of records."""
    log = tmp_path / "kmsg"
    log.write_text(NODE_LOG)
    boot_id = tmp_path / "boot_id"
    boot_id.write_text(BOOT + "\n")
    return GpuConfig(kernel_log_path=str(log)), tmp_path / "state", boot_id, log


def run(node, now, smi):
    config, state_dir, boot_id, _ = node
    return check_kernel_log(config, state_dir, now, smi, boot_id_path=boot_id)


def test_counts_persist_across_runs_in_the_state_file(node):
    smi = FakeSmi({GPU_55: 0, GPU_97: 1})
    first = run(node, T0, smi)
    assert first.read_ok and counts(first.state) == FIRST and len(first.seen) == 7
    saved = json.loads((node[1] / STATE_FILE).read_text())["logs"][str(node[3])]
    assert saved["seq"] == 1211 and saved["boot_id"] == BOOT and os.stat(node[1] / STATE_FILE).st_mode & 0o777 == 0o600
    second = run(node, T0 + 60, smi)
    assert second.seen == [] and counts(second.state) == FIRST
    node[3].write_text(NODE_LOG + MORE)
    third = run(node, T0 + 120, smi)
    assert [s.event.code for s in third.seen] == [63] and counts(third.state)[(GPU_55, 63)] == 1
    assert smi.calls == 1  # once a boot: every GPU with an XID was named by then


def test_a_gpu_that_fell_off_the_bus_keeps_the_index_it_had_and_an_unknown_one_is_empty(node):
    smi = FakeSmi({GPU_55: 0, GPU_97: 1}, SourceUnavailable("nvidia-smi did not answer within 10s"))
    first = run(node, T0, smi)
    assert (first.gpu(GPU_55), first.gpu(GPU_97), first.gpu(GPU_91)) == ("0", "1", "")
    assert first.gpu_note == "nvidia-smi does not list 00000000:91:00.0"
    node[3].write_text(NODE_LOG + "3,1212,1,-;NVRM: Xid (PCI:0000:91:00): 79, GPU has fallen off the bus.\n")
    second = run(node, T0 + 60, smi)  # nvidia-smi asked again for 91, and hangs now
    assert second.read_ok and second.gpu(GPU_55) == "0" and second.gpu(GPU_91) == ""
    assert second.gpu_note == "nvidia-smi did not answer within 10s" and smi.calls == 2


def test_a_kernel_log_that_cannot_be_read_is_not_checked_and_keeps_the_counts(node):
    run(node, T0, FakeSmi({}))
    node[3].unlink()
    report = run(node, T0 + 60, FakeSmi({}))
    assert not report.read_ok and report.why == f"cannot read {node[3]}: No such file or directory"
    assert counts(report.state) == FIRST  # the counters go on being exported, unchanged
    text = metrics_text([], T0 + 60, kernel=report)
    assert "opsctl_node_kernel_log_read_ok 0\n" in text
    assert f'opsctl_node_kernel_xid_total{{gpu="",pci_bus_id="{GPU_55}",xid="48"}} 2\n' in text


def test_a_state_file_planted_as_a_symlink_is_refused_and_its_target_untouched(node, tmp_path):
    victim = tmp_path / "shadow"
    victim.write_text("root:x:0:0\n")
    node[1].mkdir(mode=0o700)
    (node[1] / STATE_FILE).symlink_to(victim)
    report = run(node, T0, FakeSmi({}))
    assert report.why == f"state file {node[1] / STATE_FILE}: a symlink, refused; move it away to reset"
    assert victim.read_text() == "root:x:0:0\n" and (node[1] / STATE_FILE).is_symlink()
    assert report.state == KernelLogState()  # nothing counted without the counts so far


@pytest.mark.parametrize("damaged", ['{"version": 1, "seq": 3}', '{"version": 1, "logs": {"LOG": {"seq": "x"}}}', "{"])
def test_a_damaged_state_file_is_not_read_over(node, damaged):
    node[1].mkdir(mode=0o700)
    damaged = damaged.replace("LOG", str(node[3]))
    (node[1] / STATE_FILE).write_text(damaged)
    report = run(node, T0, FakeSmi({}))
    assert report.why.startswith(f"state file {node[1] / STATE_FILE} is unreadable (")
    assert report.why.endswith("; move it away to reset") and (node[1] / STATE_FILE).read_text() == damaged


def test_logs_sharing_a_state_directory_keep_a_cursor_each(node, tmp_path):
    """The simulated lab's nodes run on one host, each reading its own file, with one state directory."""
    other = tmp_path / "other-kmsg"
    other.write_text(MORE.replace("1212", "3"))
    run(node, T0, FakeSmi({}))
    config, state_dir, boot_id, _ = node
    for _ in range(2):
        report = check_kernel_log(GpuConfig(kernel_log_path=str(other)), state_dir, T0, FakeSmi({}), boot_id)
        assert counts(report.state) == {(GPU_55, 63): 1}
    assert run(node, T0 + 60, FakeSmi({})).seen == [] and counts(run(node, T0 + 60, FakeSmi({})).state) == FIRST


def test_the_metrics_text_names_and_labels():
    state = KernelLogState(boot_id=BOOT, seq=9,
                           xids={(GPU_55, 48): XidTally(2, T0), (GPU_91, 79): XidTally(1, T0 + 1.5, [T0 + 30])},
                           sxids={("00000000:C7:00.0", 12028, False): XidTally(3, T0 + 2, [T0 + 40])},
                           recovery={GPU_55: "drain_and_reset"},
                           gpus={GPU_55: 1}, ignored={"userspace": 2})
    text = metrics_text([], T0 + 60, kernel=KernelLogReport(source="/dev/kmsg", state=state))
    assert text == f"""\
# HELP opsctl_node_check Whether a node-local check failed (1) or passed (0), per check and device.
# TYPE opsctl_node_check gauge
# HELP opsctl_node_kernel_log_read_ok Whether node check read the kernel log (1) or could not (0; --json says why).
# TYPE opsctl_node_kernel_log_read_ok gauge
opsctl_node_kernel_log_read_ok 1
# HELP opsctl_node_kernel_log_ignored_records_total Kernel log records with the NVIDIA driver's XID or SXid words \
that are not its lines, never counted as XIDs, by reason: quoted (a kernel message quoting them: a user's file or \
process name, an audit text), userspace (a program wrote them to /dev/kmsg).
# TYPE opsctl_node_kernel_log_ignored_records_total counter
opsctl_node_kernel_log_ignored_records_total{{reason="quoted"}} 0
opsctl_node_kernel_log_ignored_records_total{{reason="userspace"}} 2
# HELP opsctl_node_kernel_xid_total GPU XIDs the NVIDIA driver wrote to the kernel log, counted by node check \
across its runs.
# TYPE opsctl_node_kernel_xid_total counter
opsctl_node_kernel_xid_total{{gpu="1",pci_bus_id="{GPU_55}",xid="48"}} 2
opsctl_node_kernel_xid_total{{gpu="",pci_bus_id="{GPU_91}",xid="79"}} 1
# HELP opsctl_node_kernel_xid_last_timestamp_seconds When the newest of these XIDs was logged (/dev/kmsg: the \
kernel's time; a file: the run that read it).
# TYPE opsctl_node_kernel_xid_last_timestamp_seconds gauge
opsctl_node_kernel_xid_last_timestamp_seconds{{gpu="1",pci_bus_id="{GPU_55}",xid="48"}} {T0:.3f}
opsctl_node_kernel_xid_last_timestamp_seconds{{gpu="",pci_bus_id="{GPU_91}",xid="79"}} {T0 + 1.5:.3f}
# HELP opsctl_node_kernel_xid_count XIDs node check first saw in the kernel log within the window \
(label window_size_in_ms), as dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT: the XID rules read both.
# TYPE opsctl_node_kernel_xid_count gauge
opsctl_node_kernel_xid_count{{gpu="1",pci_bus_id="{GPU_55}",xid="48",window_size_in_ms="900000"}} 0
opsctl_node_kernel_xid_count{{gpu="",pci_bus_id="{GPU_91}",xid="79",window_size_in_ms="900000"}} 1
# HELP opsctl_node_kernel_sxid_total NVSwitch SXids the driver wrote to the kernel log, counted by node check \
across its runs.
# TYPE opsctl_node_kernel_sxid_total counter
opsctl_node_kernel_sxid_total{{nvswitch_pci="00000000:C7:00.0",sxid="12028",fatal="false"}} 3
# HELP opsctl_node_kernel_sxid_count NVSwitch SXids node check first saw in the kernel log within the window \
(label window_size_in_ms), as opsctl_node_kernel_xid_count counts XIDs.
# TYPE opsctl_node_kernel_sxid_count gauge
opsctl_node_kernel_sxid_count{{nvswitch_pci="00000000:C7:00.0",sxid="12028",fatal="false",window_size_in_ms="900000"}} 1
# HELP opsctl_node_gpu_recovery_action The recovery action of a GPU's latest XID 154 this boot (1 on that \
action's series only).
# TYPE opsctl_node_gpu_recovery_action gauge
opsctl_node_gpu_recovery_action{{gpu="1",pci_bus_id="{GPU_55}",action="drain_and_reset"}} 1
# HELP opsctl_node_check_timestamp_seconds When the node checks last ran.
# TYPE opsctl_node_check_timestamp_seconds gauge
opsctl_node_check_timestamp_seconds {T0 + 60:.3f}
"""


def test_an_sxid_counts_in_the_window_from_the_run_that_first_saw_it_and_an_older_state_file_still_loads():
    state, _ = advance(KernelLogState(), BOOT, RECORDS, T0)
    key = ("00000000:06:00.0", 20034, True)
    later, _ = advance(state, BOOT, RECORDS, T0 + XID_WINDOW_S + 1)
    assert (later.sxids[key].count, later.sxids[key].recent) == (1, [])
    saved = state.to_json()
    for sxid in saved["sxids"]:  # what a release that only counted SXids wrote
        del sxid["last_seen"], sxid["recent"]
    assert KernelLogState.from_json(saved).sxids == {key: XidTally(1)}


def test_without_xids_only_the_read_status_and_the_ignored_records_are_written():
    report = KernelLogReport(source="/dev/kmsg", why="cannot read /dev/kmsg: Permission denied")
    text = metrics_text([], T0, kernel=report)
    assert "opsctl_node_kernel_log_read_ok 0\n" in text and "xid" not in text and "recovery" not in text
    assert 'opsctl_node_kernel_log_ignored_records_total{reason="quoted"} 0\n' in text


def test_the_windowed_count_holds_what_runs_first_saw_within_the_window():
    """Like dcgm-exporter's windowed count: a run's new XIDs count until XID_WINDOW_S after that run."""
    xid_79 = "NVRM: Xid (PCI:0000:91:00): 79, pid=0, name=python3, GPU has fallen off the bus."
    records = [Record(seq=1, usec=5, message=xid_79)]
    state, _ = advance(KernelLogState(), BOOT, records, now=T0)
    ((_, tally),) = state.xids.items()
    assert tally.recent == [T0]
    later = records + [Record(seq=2, usec=9, message=xid_79)]
    state, _ = advance(state, BOOT, later, now=T0 + XID_WINDOW_S - 1)
    assert len(next(iter(state.xids.values())).recent) == 2
    state, _ = advance(state, BOOT, later, now=T0 + XID_WINDOW_S + 1)  # nothing new; the first run's is out
    assert next(iter(state.xids.values())).recent == [T0 + XID_WINDOW_S - 1]
    assert KernelLogState.from_json(json.loads(json.dumps(state.to_json()))) == state
