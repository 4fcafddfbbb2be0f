"""flows/reaper.py: the watchdog stops what a killed run left, including what the run's
processes started between its last look and the run's death."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import psutil

from flows import reaper

CHILD = textwrap.dedent(
    """
    import os, subprocess, sys, time
    flag = sys.argv[1]
    while not os.path.exists(flag):
        time.sleep(0.005)
    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a late grandchild
    open(flag + ".pids", "w").write(f"{os.getpid()} {late.pid}")
    time.sleep(120)
    """
)


def test_a_process_started_just_before_the_run_died_is_stopped(tmp_path):
    flag = tmp_path / "dying"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import subprocess, sys, time
            subprocess.Popen([sys.executable, "-c", {CHILD!r}, {str(flag)!r}])
            time.sleep(3)  # the watchdog has seen the child by now, not yet the grandchild
            open({str(flag)!r}, "w").close()
            time.sleep(0.05)  # the grandchild starts, then the run is gone
        """),
        ]
    )
    stopped = []
    watcher = threading.Thread(target=lambda: stopped.append(reaper.watch(parent.pid)))
    watcher.start()
    watcher.join(timeout=30)
    parent.wait()
    pids = [int(pid) for pid in (tmp_path / "dying.pids").read_text().split()]  # the child, the grandchild
    assert stopped == [2], stopped
    assert not [pid for pid in pids if _alive(pid)], pids


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
