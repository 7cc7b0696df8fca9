"""`opsctl health --watch`: run again every N seconds until SIGTERM or SIGINT.

A run that fails for a passing reason (a source down, the lock held) is reported and the loop goes
on; a config error ends it. SIGTERM lets the current run finish and then exits 0.
"""

import signal
import threading

from opsctl.errors import ExitCode, OpsctlError

PASSING = (ExitCode.SOURCE_DOWN, ExitCode.SAFETY_STOP)


def watch(run_once, interval: float, emit, emit_error, stop: threading.Event | None = None) -> ExitCode:
    stop = stop or threading.Event()

    def _stop(signum, frame):
        stop.set()

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.is_set():
            try:
                emit(run_once())
            except OpsctlError as err:
                if err.exit_code not in PASSING:
                    raise
                for line in getattr(err, "done", []):
                    emit_error(f"opsctl: done before the error: {line}")
                emit_error(f"opsctl: {err} (exit {int(err.exit_code)}); retrying in {interval:g}s")
            stop.wait(interval)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return ExitCode.OK
