"""The stages on a real multi-process Ray cluster (`ray start --head` plus a second node
joining it, each with one CPU and its own temp dir), driven as on a cluster: a driver
process with `ray.address` set. The output must be byte-identical to the embedded-Ray run.

The driver is a subprocess because this pytest process may already hold the session's
embedded Ray (the `ray_cluster` fixture), and one process joins one Ray at a time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from processes import free_port, stop

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))

# Runs stages against `ray.address`; prints one RESULT line with every shard's sha256.
DRIVER = r"""
import json, sys, time
import ray
from pipelines.ray_runtime import ensure_ray
from pipelines.registry import PipelineConfig
from pipelines.runner import Pipeline

cfg = PipelineConfig.model_validate_json(open(sys.argv[1]).read())
ensure_ray(cfg.ray)
deadline = time.monotonic() + 120
while sum(node["Alive"] for node in ray.nodes()) < int(sys.argv[3]):
    assert time.monotonic() < deadline, "the worker node did not join"
    time.sleep(0.5)


@ray.remote(num_cpus=1)
def where():
    import pipelines.corpus  # the project's code must import on every node
    return ray.get_runtime_context().get_node_id()


from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
probed = ray.get([where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes])
pipeline = Pipeline(cfg)
out = {"nodes": nodes, "probed": probed, "stages": {}}
for name in sys.argv[2].split(","):
    manifest, computed = pipeline.run(name)
    out["stages"][name] = {"fingerprint": manifest.fingerprint, "computed": computed, "shards": {s.path: s.sha256 for s in manifest.shards}}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def two_node_cluster():
    """A Ray head and a worker node on this machine; yields (address, driver env, node temp dirs).

    Token authentication is on, as on a real cluster: every node and the driver get the
    token through RAY_AUTH_TOKEN. Short temp dirs keep Ray's socket paths under the limit.
    """
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    temp_dirs = [tempfile.mkdtemp(prefix="bpray-", dir="/tmp") for _ in range(2)]
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus", "1", "--object-store-memory", str(150 * 2**20), "--disable-usage-stats", "--block"]
    commands = [
        ["--head", "--port", str(port), "--include-dashboard", "false", "--dashboard-port", str(free_port())],
        ["--address", address],
    ]
    logs = [open(Path(temp_dir) / "start.log", "wb") for temp_dir in temp_dirs]
    procs: list[subprocess.Popen] = []
    try:
        for node, (command, temp_dir, log) in enumerate(zip(commands, temp_dirs, logs)):
            procs.append(
                subprocess.Popen([RAY, "start", *command, "--temp-dir", temp_dir, *common], env=env, stdout=log, stderr=subprocess.STDOUT)
            )
            if node == 0:  # the worker node joins once the head's GCS listens
                deadline = time.monotonic() + 120
                while True:
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=1).close()
                        break
                    except OSError:
                        assert procs[0].poll() is None, (Path(temp_dir) / "start.log").read_text()[-3000:]
                        assert time.monotonic() < deadline, "the Ray head did not start"
                        time.sleep(0.5)
        yield address, env, temp_dirs
    finally:
        stop(*procs)
        for log in logs:
            log.close()
        for path in temp_dirs:
            shutil.rmtree(path, ignore_errors=True)


def _task_names_in_logs(temp_dir: str) -> set[str]:
    """Names of the tasks a node's workers ran: Ray marks each task's output in the worker's
    log files with `:task_name:<name>`."""
    names: set[str] = set()
    for path in Path(temp_dir).glob("session_*/logs/worker-*"):
        names.update(re.findall(r":task_name:(\w+)", path.read_text(errors="replace")))
    return names


@pytest.mark.slow
def test_stages_on_a_two_node_cluster_match_embedded_ray(two_node_cluster, demo_pipeline, tmp_path):
    address, env, temp_dirs = two_node_cluster
    reference_cfg, reference = demo_pipeline
    cfg = reference_cfg.model_copy(
        update={
            "run": reference_cfg.run.model_copy(update={"root": str(tmp_path / "run")}),
            "ray": reference_cfg.ray.model_copy(update={"address": address}),
        }
    )
    config_file = tmp_path / "config.json"
    config_file.write_text(cfg.model_dump_json())
    stages = ["corpus", "vocab", "examples"]
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, str(config_file), ",".join(stages), "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    results = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and results, out.stderr[-4000:]
    result = json.loads(results[-1].removeprefix("RESULT "))

    assert len(result["nodes"]) == 2 and sorted(result["probed"]) == sorted(result["nodes"])
    for name in stages:
        got = result["stages"][name]
        assert got["computed"]
        assert got["fingerprint"] == reference[name].fingerprint, name
        assert got["shards"] == {s.path: s.sha256 for s in reference[name].shards}, name
    # both nodes did stage work, not only the probe
    for temp_dir in temp_dirs:
        assert _task_names_in_logs(temp_dir) - {"where"}, f"no stage task ran on the node of {temp_dir}"


# -- the cluster files in infra/ --------------------------------------------------------------


def _image_tag(image: str) -> str:
    return image.rsplit(":", 1)[1]


def test_cluster_launcher_file_passes_rays_own_validation():
    import copy

    import ray
    import yaml
    from jsonschema import ValidationError
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((ROOT / "infra" / "ray" / "cluster.yaml").read_text())
    # what `ray up` does before it contacts the cloud: merge the provider's defaults, then
    # check against ray/autoscaler/ray-schema.json and the node-type rules
    config = prepare_config(copy.deepcopy(raw))
    validate_config(config)

    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"].get("CPU") == 0
    gpu = [t for t in types.values() if "gpu" in t.get("docker", {}).get("worker_image", "")]
    assert gpu and all(t["node_config"]["InstanceType"].startswith(("g", "p")) and t["max_workers"] >= 1 for t in gpu)
    # nodes must run the driver's Ray and Python, or the driver cannot join
    python_tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    for image in [config["docker"]["image"], *(t["docker"]["worker_image"] for t in gpu)]:
        assert _image_tag(image).startswith(f"{ray.__version__}-{python_tag}-"), image
    assert any("/home/ray/bertpipe" in command for command in config["setup_commands"])

    broken = copy.deepcopy(raw)
    broken["available_node_types"]["gpu_worker"]["min_worker"] = 1  # a typo must not pass
    with pytest.raises(ValidationError):
        validate_config(prepare_config(broken))


def test_kuberay_file_is_a_complete_raycluster():
    import ray
    import yaml

    doc = yaml.safe_load((ROOT / "infra" / "k8s" / "raycluster.yaml").read_text())
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster" and doc["metadata"]["name"]
    spec = doc["spec"]
    assert spec["rayVersion"] == ray.__version__
    head = spec["headGroupSpec"]
    groups = spec["workerGroupSpecs"]
    assert head["rayStartParams"]["num-cpus"] == "0" and groups
    for group in [head, *groups]:
        # KubeRay reads rayStartParams as map[string]string: a bare number is rejected
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
        containers = group["template"]["spec"]["containers"]
        assert containers and all(c["image"] and c["name"] for c in containers)
    for group in groups:
        assert group["groupName"] and 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    gpu_limits = [
        c["resources"]["limits"].get("nvidia.com/gpu")
        for g in groups
        for c in g["template"]["spec"]["containers"]
    ]
    assert any(int(limit) >= 1 for limit in gpu_limits if limit is not None)
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            requests, limits = container["resources"]["requests"], container["resources"]["limits"]
            # Kubernetes requires an extended resource's request to equal its limit
            assert requests.get("nvidia.com/gpu") == limits.get("nvidia.com/gpu")
