"""A watchdog that stops what `bertpipe run` started when `bertpipe run` itself is killed.

A run ended by SIGKILL or the OOM killer cannot clean up: Prefect's temporary API server,
Ray's GCS, raylet, agents and workers (training workers hold a GB each) were still alive
seconds later, some for good. `start()` launches this module as a small process of its own
session that watches the run's pid: every half second it notes the run's descendants, and
when the run is gone it sends them SIGTERM, then SIGKILL to whatever is left after
`GRACE_S`. Only processes it saw descending from the run are touched, each checked by
psutil against its start time (a reused pid is not ours). A run that ends normally has
stopped its children already; the watchdog then finds nothing to do and exits.

    python -m flows.reaper PID
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

POLL_S = 0.5
GRACE_S = 3.0


def start() -> subprocess.Popen | None:
    """Watch this process; None where the watchdog cannot start (it is a safety net only)."""
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "flows.reaper", str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not in the run's process group: a Ctrl-C there does not end it
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
    except OSError:
        return None


def watch(pid: int) -> int:
    """Follow `pid` until it is gone, then stop the descendants it had; returns how many."""
    import psutil

    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return 0
    me = os.getpid()
    seen: dict[int, psutil.Process] = {}
    while True:
        try:
            if not parent.is_running() or parent.status() == psutil.STATUS_ZOMBIE:
                break
            for child in parent.children(recursive=True):
                if child.pid != me:
                    seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            break
        time.sleep(POLL_S)
    alive = [p for p in seen.values() if p.is_running()]  # is_running compares start times
    for process in list(alive):  # and what they started after the last look (a raylet's new worker)
        try:
            late = [c for c in process.children(recursive=True) if c.pid != me and c.pid not in seen]
        except psutil.NoSuchProcess:
            continue
        for child in late:
            seen[child.pid] = child
            alive.append(child)
    for process in alive:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, left = psutil.wait_procs(alive, timeout=GRACE_S)
    for process in left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    return len(alive)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
