"""torch.distributed under Ray Train, on the loopback interface when Ray runs on this
machine only.

Ray Train's own set-up (`TorchConfig`) starts torch.distributed's TCP store on the first
worker, and that store listens on every interface whatever MASTER_ADDR says, with no
authentication. When every node of the Ray cluster is at 127.0.0.1 (the embedded Ray,
pipelines/ray_runtime.py, or another process's embedded Ray joined as one), the training
stages use `LoopbackTorchConfig` instead: the first worker binds the store's socket to
127.0.0.1 itself and hands it to the store (`master_listen_fd`), every worker joins it there,
and gloo (and NCCL's bootstrap) use the loopback interface. On a real cluster Ray Train's
set-up is used as it is. tests/stages/test_security.py checks every listening socket while a
pretrain stage trains.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import ray
from ray.train._internal.worker_group import WorkerGroup as V1WorkerGroup
from ray.train.torch import TorchConfig
from ray.train.torch.config import _set_torch_distributed_env_vars, _TorchBackend

LOOPBACK = "127.0.0.1"
_listener_fd: int | None = None
"""The first worker's listening socket, bound to 127.0.0.1, until its store takes it over."""


def loopback_cluster() -> bool:
    """Whether every live node of the connected Ray is at 127.0.0.1."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    return bool(nodes) and all(node.get("NodeManagerAddress") == LOOPBACK for node in nodes)


def torch_config(use_gpu: bool) -> TorchConfig:
    """The process-group set-up of a training stage's TorchTrainer (see the module docstring)."""
    backend = "nccl" if use_gpu else "gloo"
    return LoopbackTorchConfig(backend=backend) if loopback_cluster() else TorchConfig(backend=backend)


@dataclass
class LoopbackTorchConfig(TorchConfig):
    """TorchConfig whose store and sockets stay on 127.0.0.1 (one machine only)."""

    @property
    def backend_cls(self):
        return _LoopbackBackend


def _loopback_interface() -> str:
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == LOOPBACK for a in addresses):
            return name
    return "lo"


def _listen() -> int:
    """On the first worker: a socket listening on 127.0.0.1, kept for the store; its port."""
    global _listener_fd
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind((LOOPBACK, 0))
    server.listen(128)
    port = server.getsockname()[1]
    _listener_fd = server.detach()  # the store owns it from here
    return port


def _join(backend: str, world_rank: int, world_size: int, port: int, timeout_s: int) -> None:
    """On every worker: join the store on 127.0.0.1 (the first worker serves it) and start
    the process group with gloo/NCCL on the loopback interface."""
    import torch.distributed as dist

    interface = _loopback_interface()
    os.environ.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    timeout = timedelta(seconds=timeout_s)
    if world_rank == 0:
        store = dist.TCPStore(
            LOOPBACK, port, world_size, True, timeout, wait_for_workers=False, master_listen_fd=_listener_fd
        )
    else:
        store = dist.TCPStore(LOOPBACK, port, world_size, False, timeout)
    dist.init_process_group(backend, store=store, rank=world_rank, world_size=world_size, timeout=timeout)


class _LoopbackBackend(_TorchBackend):
    def on_start(self, worker_group, backend_config: LoopbackTorchConfig) -> None:
        port = worker_group.execute_single(0, _listen)
        if not isinstance(worker_group, V1WorkerGroup):  # LOCAL_RANK, RANK, ... as Ray Train's own set-up does
            worker_group.execute(_set_torch_distributed_env_vars)
        ray.get(
            [
                worker_group.execute_single_async(
                    i,
                    _join,
                    backend=backend_config.backend,
                    world_rank=i,
                    world_size=len(worker_group),
                    port=port,
                    timeout_s=backend_config.timeout_s,
                )
                for i in range(len(worker_group))
            ]
        )
