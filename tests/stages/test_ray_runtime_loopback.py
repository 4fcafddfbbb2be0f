"""pipelines/ray_runtime.py against real Rays on this machine: the embedded Ray listens on
loopback only, `ray.address: auto` refuses to pick among several Rays, and
`drop_train_leftovers` removes what a TorchTrainer.fit() leaves running."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from processes import free_port, job_actors, stop
from test_ray_cluster import RAY, beyond_loopback, listening


def test_the_embedded_ray_listens_on_loopback_only(ray_cluster):
    """Every socket that the session's embedded Ray listens on (each process of its node and
    their children: GCS, raylet, dashboard, agents, workers; and this driver's own core
    worker) is bound to a loopback address."""
    ray = ray_cluster
    from ray.core.generated.common_pb2 import Address

    @ray.remote(num_cpus=0)
    class Probe:
        def ready(self):
            return True

    probe = Probe.remote()
    assert ray.get(probe.ready.remote())  # a worker process is up too
    node = ray._private.worker._global_node
    pids = [info.process.pid for infos in node.all_processes.values() for info in infos]
    driver = Address.FromString(ray._private.worker.global_worker.core_worker.get_owner_address(ray.put(None)))
    # this process also holds other tests' servers (torch.distributed's store): of its own
    # sockets only the core worker's is Ray's
    sockets = listening(pids) + [s for s in listening([os.getpid()]) if s[0] == os.getpid() and s[3] == driver.port]
    ray.kill(probe)
    names = {name for _, name, *_ in sockets}
    assert {"gcs_server", "raylet", "ray::Probe"} <= names, sorted(names)
    assert os.getpid() in {pid for pid, *_ in sockets}
    exposed = beyond_loopback(sockets)
    assert not exposed, "listening beyond loopback: " + "; ".join(exposed)


@pytest.fixture
def two_rays():
    """Two tiny Ray heads on this machine, bound to loopback as a single-node head can be
    (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, --node-ip-address 127.0.0.1); yields their GCS
    addresses and temp dirs once both raylets run. Stopped by pid."""
    env = dict(
        os.environ,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=uuid.uuid4().hex,
        RAY_USAGE_STATS_ENABLED="0",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
    )
    env.pop("RAY_ADDRESS", None)
    temp_dirs = [tempfile.mkdtemp(prefix="bpauto-", dir="/tmp") for _ in range(2)]
    ports = [free_port() for _ in temp_dirs]
    logs = [open(Path(temp_dir) / "start.log", "wb") for temp_dir in temp_dirs]
    procs = []
    try:
        for port, temp_dir, log in zip(ports, temp_dirs, logs):
            command = [
                RAY,
                "start",
                "--head",
                "--port",
                str(port),
                "--node-ip-address",
                "127.0.0.1",
                "--num-cpus",
                "0",
                "--include-dashboard",
                "false",
                "--ray-client-server-port",
                str(free_port()),
                "--dashboard-agent-listen-port",
                str(free_port()),
                "--metrics-export-port",
                str(free_port()),
                "--object-store-memory",
                str(80 * 2**20),
                "--temp-dir",
                temp_dir,
                "--disable-usage-stats",
                "--block",
            ]
            procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
        from pipelines.ray_runtime import local_ray_instances

        addresses = [f"127.0.0.1:{port}" for port in ports]
        deadline = time.monotonic() + 120
        while not set(addresses) <= set(local_ray_instances()):
            for proc, temp_dir in zip(procs, temp_dirs):
                assert proc.poll() is None, (Path(temp_dir) / "start.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Ray heads did not start"
            time.sleep(0.5)
        yield addresses, temp_dirs
    finally:
        stop(*procs)
        for log in logs:
            log.close()
        for path in temp_dirs:
            shutil.rmtree(path, ignore_errors=True)


REFUSED = r"""
import sys, ray
from bertcore.config import RayConfig
from bertcore.errors import ConfigError
from pipelines.ray_runtime import ensure_ray
try:
    ensure_ray(RayConfig(address="auto"))
except ConfigError as exc:
    print("REFUSED " + str(exc), flush=True)
    sys.exit(3)
print("JOINED " + str(ray.is_initialized()))
"""


def test_auto_address_refuses_to_pick_among_several_rays_in_one_line(two_rays, tmp_path):
    """`ray.address: auto` with two Rays running here: ensure_ray fails at once, in one line
    that names both (GCS address and session directory), and joins neither; Ray itself would
    warn and join the one the last `ray start` recorded."""
    addresses, temp_dirs = two_rays
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-c", REFUSED], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED ")]
    assert out.returncode == 3 and len(refused) == 1, (out.stdout + out.stderr)[-3000:]
    message = refused[0].removeprefix("REFUSED ")
    assert message.startswith("ray.address: auto found ") and " Ray instances on this machine: " in message, message
    for address, temp_dir in zip(addresses, temp_dirs):
        assert f"{address} ({temp_dir}/session_" in message, message
    assert message.endswith("set ray.address to the GCS address (host:port) of the one to join")


def _noop_fit():
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    storage = tempfile.mkdtemp(prefix="bp-leftovers-")
    try:
        TorchTrainer(
            lambda config: None, scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(storage_path=storage)
        ).fit()
    finally:
        shutil.rmtree(storage, ignore_errors=True)


def _detached_alive(ray) -> list[str]:
    """Class names of this job's detached actors that are alive, from Ray's state API (at
    the dashboard address ensure_ray gives the workers)."""
    return sorted(actor.class_name for actor in job_actors(ray) if actor.is_detached)


def test_drop_train_leftovers_removes_the_detached_actors_a_fit_leaves(ray_cluster):
    """After a two-worker TorchTrainer.fit(), Ray Data's autoscaling coordinator is the one
    detached actor of this job still alive; drop_train_leftovers kills it (and says so) and a
    second call finds nothing. That a fit after the drop still works is every later
    in-process pretrain run's (launch.fit drops after each fit: test_pretrain_stage.py runs
    several in one Ray)."""
    ray = ray_cluster
    from pipelines.ray_runtime import drop_train_leftovers

    drop_train_leftovers(
        any_job=True
    )  # a driver another test SIGKILLed mid-fit leaves its job's one, which fit() would reuse
    _noop_fit()
    assert _detached_alive(ray) == ["_AutoscalingCoordinatorActor"]
    assert drop_train_leftovers() == ["AutoscalingCoordinator/AutoscalingCoordinator"]
    assert _detached_alive(ray) == []
    with pytest.raises(ValueError):
        ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
    assert drop_train_leftovers() == []
