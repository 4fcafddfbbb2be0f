"""An embedded Ray whose dashboard port is taken between bertpipe choosing it and the
dashboard binding it starts again on another port (in a suite run, two workers starting Ray
at once: one lost its dashboard port and every test of that worker errored)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import logging, socket
    import ray
    from bertcore.config import RayConfig
    from pipelines import ray_runtime

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()  # another process holds it by the time Ray's dashboard binds
    ports = iter([taken.getsockname()[1]])
    free = ray_runtime._free_port
    ray_runtime._free_port = lambda: next(ports, None) or free()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ray_runtime.ensure_ray(RayConfig(num_cpus=1))
    print(
        "answered:", ray.get(ray.remote(lambda: 42).remote()),
        "dashboard:", ray.get_runtime_context().gcs_address is not None,
    )
    ray.shutdown()
    """
)


def test_a_dashboard_port_taken_before_ray_binds_it_costs_one_more_start():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    ran = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "answered: 42" in ran.stdout, ran.stdout
    assert "was taken before Ray's dashboard bound it; starting again on another" in ran.stderr, ran.stderr[-3000:]
    assert ran.stderr.count("ray: started a local Ray") == 1, ran.stderr[-3000:]
