"""What the embedded Ray's dashboard process costs: start-up time and memory of a local Ray
as bertpipe starts it (`ensure_ray`: dashboard on, for Ray Train's state API) against the
same start with the dashboard off (the baseline), alternating, in fresh processes.

    python benchmarks/ray_startup.py --trials 3

Prints per configuration the median seconds from ray.init to a first finished task, and the
number and summed PSS (proportional set size: shared pages split between processes) of the
Ray processes started (GCS, raylet, dashboard and its modules, agents, one worker), then
the ratios (dashboard on / off).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, {root!r})
import psutil, ray
from bertcore.config import RayConfig
import pipelines.ray_runtime as rt

dashboard = {dashboard}
started = time.perf_counter()
if dashboard:
    rt.ensure_ray(RayConfig(num_cpus=2))
else:
    rt._embedded_settings()
    ray.init(address="local", num_cpus=2, include_dashboard=False, runtime_env=rt._local_env({{}}), log_to_driver=False)
ray.get(ray.remote(lambda: 1).remote())
seconds = time.perf_counter() - started
time.sleep(5)  # let the processes that start with Ray settle
children = psutil.Process().children(recursive=True)
pss = sum(p.memory_full_info().pss for p in children)
names = sorted(" ".join(p.cmdline()[:3])[-60:] for p in children)
ray.shutdown()
print(json.dumps({{"seconds": seconds, "pss_mb": pss / 2**20, "processes": len(children), "names": names}}))
"""


def trial(dashboard: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(root=str(ROOT), dashboard=dashboard)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--verbose", action="store_true", help="List the processes of the last trial of each.")
    args = parser.parse_args()
    results: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(args.trials):
        for dashboard in (False, True):
            results[dashboard].append(trial(dashboard))
    summary = {}
    for dashboard, runs in results.items():
        summary[dashboard] = {k: statistics.median(r[k] for r in runs) for k in ("seconds", "pss_mb", "processes")}
        name = "dashboard on (bertpipe)" if dashboard else "dashboard off (baseline)"
        print(
            f"{name:<26} start to first task {summary[dashboard]['seconds']:.2f} s   "
            f"{summary[dashboard]['processes']:.0f} Ray processes, PSS {summary[dashboard]['pss_mb']:.0f} MiB"
        )
        if args.verbose:
            print("  " + "\n  ".join(runs[-1]["names"]))
    print(
        f"ratio on/off: time {summary[True]['seconds'] / summary[False]['seconds']:.2f}, "
        f"memory {summary[True]['pss_mb'] / summary[False]['pss_mb']:.2f} (medians of {args.trials} trials)"
    )


if __name__ == "__main__":
    main()
