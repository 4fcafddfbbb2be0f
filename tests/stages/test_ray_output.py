"""What Ray relays from its processes: bertpipe's own messages from a worker reach the
console; Ray's own account of a failure (the controller's traceback, a raylet's dump: a
page of lines) goes to the log only, so the driver's one error line stays the last."""

from __future__ import annotations

import logging

from flows import logs


def test_our_worker_lines_reach_the_console_and_rays_dumps_stay_in_the_log(caplog):
    sink = logs._LogSink({"pid": 7, "worker": "RayTrainWorker", "stream": "stderr"})
    with caplog.at_level(logging.DEBUG):
        sink.write("(RayTrainWorker pid=7) pretrain: resuming step-0000010, written by 2 workers, on 1\n")
        sink.write("(TrainController pid=8) Traceback (most recent call last):\n")
        sink.write('(TrainController pid=8)   File "/x/ray/train/v2/worker_group.py", line 805, in poll\n')
        sink.write(
            "(raylet) [state-dump] NodeManager:\n(RayTrainWorker pid=7) [2026-12-01 21:05:46] [WARNING] "
            "[real_accelerator.py:199]\n"
        )
        sink.write("(RayTrainWorker pid=7) distill: the teacher has no MLM head; soft targets are skipped\n")
        sink.write(
            "(write_output_shard pid=9) object store unreachable for 14 s at http://127.0.0.1:9000; retried "
            "5 times until it answered again\n"
        )
    ours = [r.getMessage() for r in caplog.records if r.name == logs.WORKERS.name]
    rays = [r for r in caplog.records if r.name == logs.RAY_OUTPUT.name]
    assert ours == [
        "(RayTrainWorker pid=7) pretrain: resuming step-0000010, written by 2 workers, on 1",
        "(RayTrainWorker pid=7) distill: the teacher has no MLM head; soft targets are skipped",
        (
            "(write_output_shard pid=9) object store unreachable for 14 s at http://127.0.0.1:9000; retried 5 "
            "times until it answered again"
        ),
    ]
    assert len(rays) == 4 and all(r.levelno == logging.DEBUG for r in rays)


def test_the_console_drops_rays_output_unless_verbose(capsys, monkeypatch):
    root = logging.getLogger()
    saved = (
        list(root.handlers),
        root.level,
        {
            name: logging.getLogger(name).level
            for name in (*logs.PROJECT_LOGGERS, logs.WORKERS.name, logs.RAY_OUTPUT.name)
        },
    )
    for name in ("PREFECT_LOGGING_EXTRA_LOGGERS", "PREFECT_LOGGING_LEVEL"):
        monkeypatch.setenv(name, __import__("os").environ.get(name, ""))
    try:
        for verbosity, shown in ((0, False), (1, True)):
            logs.setup(verbosity)
            logs.RAY_OUTPUT.debug("(TrainController pid=8) Traceback (most recent call last):")
            logs.WORKERS.info("(RayTrainWorker pid=7) pretrain: resumed from step-0000010")
            err = capsys.readouterr().err
            assert "pretrain: resumed" in err
            assert ("Traceback" in err) is shown
    finally:
        logs._configured = None
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        for name, level in saved[2].items():
            logging.getLogger(name).setLevel(level)


HELD = """
import sys, time
import ray
from ray._private import worker
from bertcore.config import RayConfig
from flows import logs
from pipelines.ray_runtime import ensure_ray

logs.setup(0)
ensure_ray(RayConfig(num_cpus=2))
logs.route_ray_output()

@ray.remote(max_calls=1)  # a process of its own each: Ray deduplicates a line across processes
def fail(i):
    print("Traceback (most recent call last): the same line from every worker", file=sys.stderr, flush=True)
    return i

ray.get([fail.remote(i) for i in range(3)])
deadline = time.monotonic() + 120
while not any(s.count for s in worker.stderr_deduplicator.recent.values()):  # a repeat is held
    assert time.monotonic() < deadline, "no repeated line reached the driver"
    time.sleep(0.2)
sys.stderr.write("bertpipe: error: the last line\\n")
"""


def test_lines_rays_deduplication_holds_at_exit_stay_off_the_console_after_the_error():
    """Ray's disconnect at exit prints what its deduplication holds (a failure's tracebacks,
    '[repeated 2x across cluster]') to stderr, after the command's error line, where issue
    26's probe found a page of them below `bertpipe: error:`; routed, they are log records."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    ran = subprocess.run(
        [sys.executable, "-c", HELD],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(root)},
    )
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert lines[-1] == "bertpipe: error: the last line" and "the same line from every worker" not in ran.stderr, (
        ran.stderr[-3000:]
    )
