#!/bin/sh
# Runs a command, and everything it starts, in the cpu cgroup opsctl-tests-background, so that the other
# streams of `make test` yield the CPU to the provisioning stream, the longest.
#
# nice alone does not do it: with the kernel's autogroups (sched_autogroup_enabled, the default), nice
# weighs only within one session, and the lab's daemons and machines each start a session of their own,
# each weighted as much as the provisioning stream. A cgroup's weight covers all of its processes, in
# whatever session. The group weighs as much as one session (v1 cpu.shares 1024, v2 cpu.weight 100);
# where no cpu cgroup can be made (no root, no cpu controller), the command runs as it is.
set -u
group=opsctl-tests-background
if [ -f /sys/fs/cgroup/cpu/cpu.shares ]; then
  dir=/sys/fs/cgroup/cpu/$group; weight_file=cpu.shares; weight=1024
else
  dir=/sys/fs/cgroup/$group; weight_file=cpu.weight; weight=100
fi
if mkdir -p "$dir" 2>/dev/null && [ -f "$dir/$weight_file" ] && echo "$weight" >"$dir/$weight_file" 2>/dev/null; then
  echo $$ >"$dir/cgroup.procs" 2>/dev/null || true
fi
exec "$@"
