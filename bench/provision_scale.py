"""How provisioning scales: `make provision`'s playbook run on 4 and on 16 GPU lab machines.

For each size this starts fresh lab machines (`opsctl lab machines up --count N`: head, stor1 and
gpu1..gpuN, real Debian 12 machines under systemd-nspawn, docs/lab-machines.md), runs the playbook run
that `make provision` runs (playbooks/site.yml with ansible.cfg, the fact cache beside the inventory, and
ansible-core's junit callback), times it, and takes the machines down with --purge. The time per role is
playbooks/role_times.py's (the slowest host of each task, summed per role). Then it prints one row per role
with the seconds at each size and the ratio of the largest size to the smallest, a total row, and the
ratio of the whole playbook runs: the number the scale target is about (16 machines at most twice the
time of 4). The machines' start-up is reported apart and is not in the ratio. Where the CPU went:
"ansible CPU" is ansible-playbook and its workers and SSH clients on this host (the control host), "CPU in
the machines" the sum over the machines' own cgroups ("most in one GPU": the busiest GPU machine), "busy
cores" the host's average busy cores during the run, out of os.cpu_count(). docs/provision-scale.md has
the measured numbers and what they mean.

The lab is one of its own, apart from the default lab (network 0, /var/lib/opsctl-lab), the provision
tests' (network 0, /var/lib/opsctl-lab-machines-tests) and the machines tests' (network 1): network
--net (default 7: 10.213.7.0/24, bridge opsctl-lab7, machines opsctl7-*), state, inventory and fact cache
in OPSCTL_LAB_DIR=/var/lib/opsctl-lab-bench, removed at the end. It shares the cached image. Its apt
cache (/var/cache/opsctl/apt-cacher-ng-<net>, kept) is seeded once from the default lab's, so that the
first size does not pay for downloads that the second then gets for free.

--keep DIR keeps each run's log and junit files there. --second-run runs the playbook again on the
first size; that run must change nothing (it also changes the opsctl wheel when the opsctl sources
changed in between). Exits 1 when a run fails or the second run changes something.

Needs root and `make deps-machines`. 16 machines take 15-20 minutes on 2 cores.

Run: .venv/bin/python bench/provision_scale.py [--sizes 4,16] [--net 7] [--keep DIR] [--second-run]
"""

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "playbooks"))
from role_times import OUTSIDE, role_times  # noqa: E402

LAB_DIR = Path("/var/lib/opsctl-lab-bench")
SHARED_APT_CACHE = Path("/var/cache/opsctl/apt-cacher-ng")
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def lab_env(net: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPSCTL_LAB_", "ANSIBLE_", "JUNIT_"))}
    env.update(OPSCTL_LAB_NET=str(net), OPSCTL_LAB_DIR=str(LAB_DIR), OPSCTL_LAB_INVENTORY=str(inventory_dir(net)),
               OPSCTL_LAB_APT_CACHE=str(apt_cache(net)))
    return env


def inventory_dir(net: int) -> Path:
    return LAB_DIR / f"machines-{net}" / "inventory"


def apt_cache(net: int) -> Path:
    return Path(f"/var/cache/opsctl/apt-cacher-ng-{net}")


def machines(env: dict, *args: str) -> tuple[float, str]:
    started = time.monotonic()
    proc = subprocess.run([str(BIN / "opsctl"), "lab", "machines", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"bench: opsctl lab machines {' '.join(args)} exited {proc.returncode}:\n"
                         f"{proc.stdout}{proc.stderr}")
    return time.monotonic() - started, proc.stdout


def machines_cpu(net: int) -> dict[str, float]:
    """machine -> CPU seconds used inside it so far (its own cgroup, docs/lab-machines.md)."""
    prefix = f"opsctl{net}-"
    used = {}
    for root in (Path("/sys/fs/cgroup/unified/opsctl-lab"), Path("/sys/fs/cgroup/opsctl-lab")):
        for stat in root.glob(f"{prefix}*/cpu.stat"):
            usage = next(line for line in stat.read_text().splitlines() if line.startswith("usage_usec"))
            used[stat.parent.name.removeprefix(prefix)] = int(usage.split()[1]) / 1e6
        if used:
            break
    return used


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs of this host."""
    fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def provision(env: dict, net: int, log: Path) -> dict:
    """`make provision`'s playbook run against the bench lab's inventory."""
    inv = inventory_dir(net)
    junit = Path(tempfile.mkdtemp(prefix="opsctl-bench-junit-"))
    run_env = dict(env, ANSIBLE_CONFIG=str(REPO / "playbooks" / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
                   ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.junit",
                   JUNIT_HIDE_TASK_ARGUMENTS="true", JUNIT_TASK_RELATIVE_PATH=str(REPO / "playbooks"),
                   JUNIT_INCLUDE_SETUP_TASKS_IN_REPORT="true", JUNIT_OUTPUT_DIR=str(junit),
                   ANSIBLE_CACHE_PLUGIN_CONNECTION=str(inv / ".facts"))
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    machines0 = machines_cpu(net)
    busy0, total0 = cpu_ticks()
    started = time.monotonic()
    try:
        with log.open("w") as out:
            proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/site.yml"], env=run_env,
                                  cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=3600)
        wall = time.monotonic() - started
        busy1, total1 = cpu_ticks()
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        machines1 = machines_cpu(net)
        roles = role_times(sorted(junit.glob("*.xml")))
        shutil.copytree(junit, log.with_suffix(".junit"))  # each task's time on each host, for a closer look
    finally:
        shutil.rmtree(junit, ignore_errors=True)
    recap = {m[1]: {"changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
             for m in RECAP.finditer(log.read_text())}
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    busy = (busy1 - busy0) / max(total1 - total0, 1) * (os.cpu_count() or 1)
    inside = {name: used - machines0.get(name, 0.0) for name, used in machines1.items()}
    return {"rc": proc.returncode, "wall": wall, "roles": roles, "recap": recap, "cpu": cpu, "busy": busy,
            "machines_cpu": sum(inside.values()),
            "gpu_machine_cpu": max([v for k, v in inside.items() if k.startswith("gpu")] or [0.0])}


def seed_apt_cache(net: int) -> None:
    """The bench lab's own apt cache, first filled from the default lab's (only when it does not exist)."""
    own = apt_cache(net)
    if own.exists() or not SHARED_APT_CACHE.is_dir():
        return
    tmp = own.with_name(own.name + ".seeding")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(["cp", "-a", str(SHARED_APT_CACHE), str(tmp)], check=True)
    tmp.rename(own)


def bench_size(n: int, net: int, work: Path, second_run: bool) -> dict:
    env = lab_env(net)
    # A bench inventory is the lab's own hosts.yml with the committed lab variables beside it.
    inv = inventory_dir(net)
    try:
        up_s, up_out = machines(env, "up", "--count", str(n))
        shutil.rmtree(inv / "group_vars", ignore_errors=True)
        shutil.copytree(REPO / "inventory" / "lab" / "group_vars", inv / "group_vars")
        sys.stderr.write(f"== {n} GPU machines up in {up_s:.0f} s; provisioning ...\n")
        row = provision(env, net, work / f"provision-{n}.log")
        row.update(n=n, up=up_s)
        (work / f"provision-{n}.json").write_text(json.dumps(row, indent=1))
        if row["rc"] == 0 and second_run:
            row["again"] = provision(env, net, work / f"provision-{n}-again.log")
    finally:
        machines(env, "down", "--purge")
    return row


def table(rows: list[dict]) -> str:
    first, last = rows[0], rows[-1]
    order = list(dict.fromkeys(role for row in rows for role in row["roles"]))
    order.sort(key=lambda role: -last["roles"].get(role, 0.0))
    width = max(len(r) for r in order + ["playbook wall time"])
    cols = "".join(f" {str(row['n']) + ' GPU':>9}" for row in rows)
    lines = [f"{'role':{width}}{cols} {'ratio':>6}"]

    def line(name: str, values: list[float]) -> str:
        ratio = f"{values[-1] / values[0]:6.2f}" if values[0] > 0.05 else f"{'-':>6}"
        return f"{name:{width}}" + "".join(f" {v:8.1f}s" for v in values) + f" {ratio}"

    for role in order:
        lines.append(line(role, [row["roles"].get(role, 0.0) for row in rows]))
    lines.append(line("total (roles)", [sum(row["roles"].values()) for row in rows]))
    lines.append(line("playbook wall time", [row["wall"] for row in rows]))
    lines.append(line("ansible CPU", [row["cpu"] for row in rows]))
    lines.append(line("CPU in the machines", [row["machines_cpu"] for row in rows]))
    lines.append(line("  most in one GPU", [row["gpu_machine_cpu"] for row in rows]))
    lines.append(f"{'busy cores':{width}}" + "".join(f" {row['busy']:9.2f}" for row in rows))
    lines.append(f"{'machines up (apart)':{width}}" + "".join(f" {row['up']:8.1f}s" for row in rows))
    for row in rows:
        if "again" in row:
            again = row["again"]
            changed = sum(h["changed"] for h in again["recap"].values())
            lines.append(f"second run at {row['n']} GPU: {again['wall']:.1f}s, rc={again['rc']}, changed={changed}")
    lines.append(f"playbook run, {last['n']} vs {first['n']} GPU machines: "
                 f"{last['wall'] / first['wall']:.2f}x ({OUTSIDE} = fact gathering and play-level tasks)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16")
    parser.add_argument("--net", type=int, default=7, help="Lab network of the bench (not 0 or 1: other labs').")
    parser.add_argument("--keep", default=None,
                        help="Directory to keep the playbook logs in (default: a temporary one).")
    parser.add_argument("--second-run", action="store_true",
                        help="At the first size, run the playbook a second time: it must change nothing.")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench: the lab machines need root")
    for tool in ("systemd-nspawn", "debootstrap", "apt-cacher-ng"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench: {tool} is not installed (make deps-machines)")
    if args.net in (0, 1):
        raise SystemExit("bench: networks 0 and 1 belong to the lab and the machines tests")
    work = Path(args.keep or tempfile.mkdtemp(prefix="opsctl-bench-provision-"))
    work.mkdir(parents=True, exist_ok=True)
    seed_apt_cache(args.net)
    rows: list[dict] = []
    failed = []
    try:
        for index, n in enumerate(int(s) for s in args.sizes.split(",")):
            row = bench_size(n, args.net, work, args.second_run and index == 0)
            rows.append(row)
            bad = {h: r for h, r in row["recap"].items() if r["failed"] or r["unreachable"]}
            sys.stderr.write(f"== {n} GPU machines: playbook {row['wall']:.1f} s, rc={row['rc']}"
                             f"{', failed: ' + ', '.join(bad) if bad else ''}\n")
            if row["rc"] != 0:
                failed.append(n)
                sys.stderr.write(f"bench: provisioning {n} GPU machines failed (log: {work}/provision-{n}.log)\n")
                break
            again = row.get("again")
            if again and (again["rc"] != 0 or any(h["changed"] for h in again["recap"].values())):
                failed.append(n)
                sys.stderr.write(f"bench: the second run on {n} GPU machines failed or changed something "
                                 f"(log: {work}/provision-{n}-again.log)\n")
        done = [row for row in rows if row["rc"] == 0]  # a failed run's times say nothing about scale
        if done:
            sys.stdout.write(table(done) + "\n")
    finally:
        shutil.rmtree(LAB_DIR, ignore_errors=True)
        if not args.keep and not failed:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
