"""The stages on a real multi-process Ray cluster (`ray start --head` plus a second node
joining it, each with one CPU and its own temp dir), driven as on a cluster: a driver
process with `ray.address` set. The output must be byte-identical to the embedded-Ray run.

The driver is a subprocess because this pytest process may already hold the session's
embedded Ray (the `ray_cluster` fixture), and one process joins one Ray at a time.

Loopback only: Ray 2.60 binds a node's servers to 127.0.0.1 only when the node's address
is 127.0.0.1 (otherwise the GCS, raylet, dashboard agent and metrics ports listen on every
interface, `--node-ip-address` or not), and `ray start` keeps 127.0.0.1 as the address only
where multi-node clusters are switched off (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), which
refuses a second node. No Ray setting binds a two-node cluster to loopback, so both nodes
and every driver run in a network namespace of their own that holds only a loopback
interface (`unshare -n`, `ip link set lo up`; root or CAP_SYS_ADMIN): there Ray finds
127.0.0.1 as the node address and binds everything to it, and nothing is reachable from
outside the machine in any case. `test_every_socket_of_the_cluster_is_a_loopback_one`
checks it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from processes import free_port, stop

ROOT = Path(__file__).resolve().parents[2]
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
    import pipelines.stages.corpus.work  # the project's code must import on every node
    return ray.get_runtime_context().get_node_id()


from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
probed = ray.get(
    [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes]
)
pipeline = Pipeline(cfg)
out = {"nodes": nodes, "probed": probed, "stages": {}}
for name in sys.argv[2].split(","):
    manifest, computed = pipeline.run(name)
    out["stages"][name] = {
        "fingerprint": manifest.fingerprint,
        "computed": computed,
        "shards": {s.path: s.sha256 for s in manifest.shards},
    }
print("RESULT " + json.dumps(out))
"""


# Prints one JSON list: every listening inet socket of the given processes and their
# descendants, as [pid, process name, ip, port]. Run inside the cluster's namespace: psutil
# reads the socket tables of the namespace it runs in.
LISTENERS = r"""
import json, sys, psutil
found = []
for pid in map(int, sys.argv[1:]):
    try:
        processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        continue
    for process in processes:
        try:
            found += [[process.pid, process.name(), c.laddr.ip, c.laddr.port]
                      for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except psutil.NoSuchProcess:
            pass
print(json.dumps(found))
"""


def listening(pids, enter=()) -> list[tuple[int, str, str, int]]:
    """(pid, name, ip, port) of every listening socket of `pids` and their descendants;
    `enter` is the command prefix that runs the lister in their network namespace."""
    out = subprocess.run(
        [*enter, sys.executable, "-c", LISTENERS, *map(str, pids)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [tuple(entry) for entry in json.loads(out.stdout)]


def beyond_loopback(sockets) -> list[str]:
    """The sockets not bound to a loopback address, one 'name (pid) ip:port' each."""

    def loopback(ip: str) -> bool:
        address = ipaddress.ip_address(ip)
        return (getattr(address, "ipv4_mapped", None) or address).is_loopback

    return sorted(f"{name} ({pid}) {ip}:{port}" for pid, name, ip, port in sockets if not loopback(ip))


NODE_OPTIONS = [
    "--node-ip-address",
    "127.0.0.1",
    "--num-cpus",
    "1",
    "--object-store-memory",
    str(150 * 2**20),
    "--disable-usage-stats",
    "--block",
]
"""What every test node gets: one CPU, a small object store, and `--block` (the `ray start`
process stays, the parent of the node's raylet and, through it, of its workers)."""


@dataclass
class TwoNodes:
    address: str  # the head's GCS, inside the namespace
    dashboard_port: int
    env: dict  # the token and settings every node and driver gets
    temp_dirs: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)  # the `ray start --block` processes, the head's first
    enter: list[str] = field(default_factory=list)  # runs a command in the cluster's network namespace

    def start_node(self, *how: str) -> subprocess.Popen:
        """`ray start --block` of one node (`how`: the head's options, or `--address`), with
        its own short temp dir (Ray's socket paths stay under the limit) and its start.log there."""
        temp_dir = tempfile.mkdtemp(prefix="bpray-", dir="/tmp")
        self.temp_dirs.append(temp_dir)
        with open(Path(temp_dir) / "start.log", "wb") as log:
            proc = subprocess.Popen(
                [*self.enter, RAY, "start", *how, "--temp-dir", temp_dir, *NODE_OPTIONS],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc

    def join_node(self) -> subprocess.Popen:
        """A worker node joining the head (again, after one was lost: under a new node id)."""
        return self.start_node("--address", self.address)

    def driver(self, script: str, *args: str, **kwargs) -> subprocess.Popen:
        """A driver process running `script` in the cluster's namespace, with its env."""
        return subprocess.Popen([*self.enter, sys.executable, "-c", script, *args], env=self.env, **kwargs)

    def run_driver(self, script: str, *args: str, cwd, timeout: float = 600) -> subprocess.CompletedProcess:
        """Run a driver to its end (killed after `timeout`); its output as text."""
        command = [*self.enter, sys.executable, "-c", script, *args]
        return subprocess.run(command, env=self.env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _loopback_namespace():
    """A process holding a new network namespace with nothing but `lo`, up; None where this
    machine allows none (then its message)."""
    holder = subprocess.Popen(
        ["unshare", "--net", "--", "sh", "-c", "ip link set lo up && echo up && exec sleep infinity"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if holder.stdout.readline().strip() == "up":
        return holder, None
    holder.wait(timeout=10)
    return None, holder.stderr.read().strip()


@contextlib.contextmanager
def loopback_only() -> Iterator[list[str]]:
    """A new loopback-only network namespace (see the module docstring) while the block
    runs; yields the command prefix that runs a command in it."""
    holder, why = _loopback_namespace()
    # every machine this suite runs on (developers' and CI's) runs it as root, where unshare
    # works: a cluster test that cannot bind loopback only must fail, never pass unseen
    assert holder is not None, (
        f"no network namespace for a loopback-only cluster (unshare -n: {why}); run the suite as root"
    )
    try:
        yield ["nsenter", f"--net=/proc/{holder.pid}/ns/net", "--"]
    finally:
        stop(holder)


@contextlib.contextmanager
def two_nodes(enter: list[str]) -> Iterator[TwoNodes]:
    """A Ray head (with its dashboard) and a worker node on this machine, started with the
    command prefix `enter` (a loopback-only namespace's); yields a TwoNodes, and stops every
    node it then holds (those started later included) and removes their temp dirs on exit.

    Token authentication is on, as on a real cluster: every node and the driver get the
    token through RAY_AUTH_TOKEN.
    """
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    port, dashboard_port = free_port(), free_port()
    cluster = TwoNodes(f"127.0.0.1:{port}", dashboard_port, env, enter=enter)
    try:
        head = cluster.start_node(
            "--head",
            "--port",
            str(port),
            "--include-dashboard",
            "true",
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(dashboard_port),
        )
        deadline = time.monotonic() + 120
        while not any(
            socket_port == port for *_, socket_port in listening([head.pid], enter)
        ):  # the worker node joins once the GCS listens
            assert head.poll() is None, (Path(cluster.temp_dirs[0]) / "start.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(1)
        cluster.join_node()
        yield cluster
    finally:
        # `ray start --block` given SIGTERM stops its node gracefully, which took up to 30 s
        # a node (a teardown of 31 s in the suite); a test node is thrown away, so 5 s, then
        # SIGKILL for it and everything under it
        stop(*cluster.procs, timeout=5)
        for path in cluster.temp_dirs:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def two_node_cluster():
    """The two nodes of `two_nodes` in a loopback-only namespace of their own."""
    with loopback_only() as enter, two_nodes(enter) as cluster:
        yield cluster


def _task_names_in_logs(temp_dir: str) -> set[str]:
    """Names of the tasks a node's workers ran: Ray marks each task's output in the worker's
    log files with `:task_name:<name>`."""
    names: set[str] = set()
    for path in Path(temp_dir).glob("session_*/logs/worker-*"):
        names.update(re.findall(r":task_name:(\w+)", path.read_text(errors="replace")))
    return names


@pytest.mark.slow
def test_stages_on_a_two_node_cluster_match_embedded_ray(two_node_cluster, demo_pipeline, tmp_path):
    cluster = two_node_cluster
    reference_cfg, reference = demo_pipeline
    cfg = reference_cfg.model_copy(
        update={
            "run": reference_cfg.run.model_copy(update={"root": str(tmp_path / "run")}),
            "ray": reference_cfg.ray.model_copy(update={"address": cluster.address}),
        }
    )
    config_file = tmp_path / "config.json"
    config_file.write_text(cfg.model_dump_json())
    stages = ["corpus", "vocab", "examples"]
    out = cluster.run_driver(DRIVER, str(config_file), ",".join(stages), "2", cwd=tmp_path)
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
    for temp_dir in cluster.temp_dirs:
        assert _task_names_in_logs(temp_dir) - {"where"}, f"no stage task ran on the node of {temp_dir}"


# Joins the cluster, holds one actor on every node (so both nodes have a worker process
# up), prints READY and waits for a line on stdin before it exits.
HOLD = r"""
import sys, time
import ray
from bertcore.config import RayConfig
from pipelines.ray_runtime import ensure_ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ensure_ray(RayConfig(address=sys.argv[1]))
deadline = time.monotonic() + 120
while sum(node["Alive"] for node in ray.nodes()) < 2:
    assert time.monotonic() < deadline, "the worker node did not join"
    time.sleep(0.5)


@ray.remote(num_cpus=0)
class Probe:
    def node(self):
        return ray.get_runtime_context().get_node_id()


nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
probes = [Probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes]
assert sorted(ray.get([p.node.remote() for p in probes])) == sorted(nodes)
print("READY", flush=True)
sys.stdin.readline()
"""


@pytest.mark.slow
def test_every_socket_of_the_cluster_is_a_loopback_one(two_node_cluster):
    """Every socket that the head's and the worker node's processes (GCS, raylets, dashboard,
    agents, client server, monitor, workers) and a joined driver listen on is bound to a
    loopback address."""
    cluster = two_node_cluster
    driver = cluster.driver(
        HOLD, cluster.address, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        ready = driver.stdout.readline()  # READY, or "" when the driver failed
        assert ready.strip() == "READY", driver.communicate(timeout=60)[1][-3000:]
        sockets = listening([*(proc.pid for proc in cluster.procs), driver.pid], cluster.enter)
    finally:
        if driver.poll() is None:
            try:
                driver.communicate("\n", timeout=60)
            except subprocess.TimeoutExpired:
                stop(driver)
    # what there must be to look at: the GCS, both raylets, the dashboard, a worker on each node, the driver
    processes = sorted({(pid, name) for pid, name, *_ in sockets})
    names = [name for _, name in processes]
    assert "gcs_server" in names and names.count("raylet") == 2 and names.count("ray::Probe") == 2, processes
    assert cluster.dashboard_port in {port for *_, port in sockets} and driver.pid in dict(processes), processes
    exposed = beyond_loopback(sockets)
    assert not exposed, "listening beyond loopback: " + "; ".join(exposed)


# A two-worker TorchTrainer.fit() on the cluster, long enough for Ray Train's
# PlacementGroupCleaner to query the controller's state a few times; prints how many Ray
# instances this machine runs and the RAY_ADDRESS each training worker had.
TRAIN = r"""
import json, os, sys, tempfile, time
import ray
from bertcore.config import RayConfig
from pipelines.ray_runtime import ensure_ray, local_ray_instances

ensure_ray(RayConfig(address=sys.argv[1]))
deadline = time.monotonic() + 120
while sum(node["Alive"] for node in ray.nodes()) < 2:
    assert time.monotonic() < deadline, "the worker node did not join"
    time.sleep(0.5)
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def loop(config):
    import os, time
    import ray.train
    time.sleep(6)
    with open(os.path.join(config["out"], str(ray.train.get_context().get_world_rank())), "w") as f:
        f.write(os.environ.get("RAY_ADDRESS", ""))


out = os.path.abspath(tempfile.mkdtemp(dir="."))  # the driver runs in the test's tmp_path
TorchTrainer(loop, train_loop_config={"out": out}, scaling_config=ScalingConfig(num_workers=2),
             run_config=RunConfig(storage_path=os.path.abspath(tempfile.mkdtemp(dir=".")))).fit()
given = sorted(open(os.path.join(out, name)).read() for name in os.listdir(out))
print("RESULT " + json.dumps({"instances": len(local_ray_instances()), "ray_address": given}))
"""


@pytest.mark.slow
def test_ray_train_on_the_cluster_asks_its_own_dashboard(two_node_cluster, ray_cluster, tmp_path):
    """With another Ray on the machine (this session's embedded one), Ray Train's actors on
    the cluster find the cluster's dashboard from the RAY_ADDRESS the driver gives them, and
    never log Ray's "Found multiple active Ray instances" guess or a traceback."""
    cluster = two_node_cluster
    out = cluster.run_driver(TRAIN, cluster.address, cwd=tmp_path)
    results = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and results, out.stderr[-4000:]
    result = json.loads(results[-1].removeprefix("RESULT "))
    assert result["instances"] >= 2  # the situation in which Ray would have to guess
    output = out.stdout + out.stderr
    assert "Found multiple active Ray instances" not in output, output[-4000:]
    # Ray Train's controller prints one traceback of its own, that it calls safe to ignore, when
    # a CPU-starved machine delays its resource request: that one is not ours to judge
    lines = output.splitlines()
    ours = [
        i
        for i, line in enumerate(lines)
        if "Traceback (most recent call last)" in line and not (i and "Failed to send resource request" in lines[i - 1])
    ]
    assert not ours, output[-4000:]
    assert result["ray_address"] == [cluster.address] * 2  # what each training worker was given


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
        c["resources"]["limits"].get("nvidia.com/gpu") for g in groups for c in g["template"]["spec"]["containers"]
    ]
    assert any(int(limit) >= 1 for limit in gpu_limits if limit is not None)
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            requests, limits = container["resources"]["requests"], container["resources"]["limits"]
            # Kubernetes requires an extended resource's request to equal its limit
            assert requests.get("nvidia.com/gpu") == limits.get("nvidia.com/gpu")
