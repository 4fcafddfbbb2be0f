"""DeepSpeed's compiled ops: what is built, said before it starts, and no silent wait on a
build that died.

DeepSpeed compiles some ops on first use with torch.utils.cpp_extension into
`$TORCH_EXTENSIONS_DIR` (default `~/.cache/torch_extensions/py<ver>_<cpu|cuXY>/<op>/`),
guarded by a `lock` file that the building process holds open. A build killed part-way
(Ctrl-C, OOM, a CI timeout) leaves the lock behind, and every later process that loads the
op waits for it forever (torch's FileBaton polls the file), printing nothing.

- The CPU communication op (`deepspeed_shm_comm`) is never built: DeepSpeed builds it for
  every process group on CPU, but uses it only in `inference_all_reduce` (tensor-parallel
  inference); training's all-reduce, all-gather and reduce-scatter go through
  torch.distributed (gloo) either way. Building it cost about two minutes of gcc on the
  development machine, once, and a killed build hung every later run.
- Ops a setting asks for (`torch_adam: false`: fused Adam; LAMB on GPU: fused LAMB) are
  announced in one line before DeepSpeed builds them; a lock no running process holds is
  reported in one line naming the file (`StaleBuildLock`) instead of waiting. It is not
  removed: a build on another machine sharing the folder cannot be seen from here.
"""

from __future__ import annotations

import logging
import os
import sys

from bertcore.errors import BertpipeError

log = logging.getLogger(__name__)

SHM_OP = "deepspeed_shm_comm"


class StaleBuildLock(BertpipeError):
    """A DeepSpeed op build's lock file that no running process holds."""


# Packages DeepSpeed imports at start-up only to offer features bertpipe never calls: MLflow
# for its autotuner's logging, transformers for OPT's position embeddings in its inference
# engine. Left out, `import deepspeed` takes 5.7 s instead of 10.7 s (farm-bench medians;
# `python -X importtime` names the two), in each training worker; both import normally
# later when a tracker or an export asks for them.
_NOT_FOR_DEEPSPEED = ("mlflow", "transformers")


def import_deepspeed():
    """`import deepspeed`, leaving out the packages it would load only for features
    bertpipe does not use (_NOT_FOR_DEEPSPEED). A package that is already imported stays."""
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    blocked = [name for name in _NOT_FOR_DEEPSPEED if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # makes `import name` raise ImportError, which DeepSpeed catches
    try:
        import deepspeed
    finally:
        for name in blocked:  # a None entry is never replaced by an import: only ours to remove
            del sys.modules[name]
    return deepspeed


def skip_shm_op() -> None:
    """Make DeepSpeed's communication backend leave out its CPU shared-memory op (call
    before deepspeed.init_distributed or deepspeed.initialize): DeepSpeed builds it only
    when its compatibility table says the op can run, and reads that table each time."""
    import_deepspeed().ops.__compatible_ops__[SHM_OP] = False


def extensions_root() -> str:
    """The folder torch builds extensions in (as torch.utils.cpp_extension names it)."""
    if explicit := os.environ.get("TORCH_EXTENSIONS_DIR"):
        return explicit
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    accelerator = (
        f"rocm{torch.version.hip.replace('.', '')}"
        if torch.version.hip
        else (f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu")
    )
    return os.path.join(
        get_default_build_root(),
        f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_{accelerator}",
    )


def lock_holders(path: str) -> list[int] | None:
    """The ids of the processes on this machine that have `path` open (a builder holds
    its lock open for the whole build); None where that cannot be seen (no /proc)."""
    if not os.path.isdir("/proc"):
        return None
    target = os.path.realpath(path)
    holders = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == target for fd in fds):
                holders.append(int(pid))
        except OSError:  # gone, or another user's
            continue
    return holders


def ops_to_build(use_gpu: bool, optimizer: str, torch_adam: bool) -> list[str]:
    """The DeepSpeed ops these settings make DeepSpeed load (and build when not built yet)."""
    if optimizer == "adamw" and not torch_adam:
        return ["fused_adam"]
    if optimizer == "lamb" and use_gpu:
        return ["fused_lamb"]
    return []


def _prebuilt(op: str) -> bool:
    try:
        from deepspeed.git_version_info import installed_ops
    except ImportError:  # pragma: no cover - no DeepSpeed
        return False
    return bool(installed_ops.get(op))


def prepare_builds(ops: list[str], announce: bool = True) -> None:
    """Before DeepSpeed loads `ops`: StaleBuildLock for a lock no process holds; one line
    per op that is about to be compiled (when `announce`: one process per machine says it)
    or whose build another process is running."""
    root = extensions_root()
    for op in ops:
        if _prebuilt(op):
            continue
        folder = os.path.join(root, op)
        lock = os.path.join(folder, "lock")
        if os.path.exists(lock):
            holders = lock_holders(lock)
            if holders == []:
                raise StaleBuildLock(
                    f"{lock}: a build of DeepSpeed's {op} op left this lock and no running process holds it (the build "
                    f"was killed part-way); delete it (rm {lock}) and run again, or rm -r {folder} to build afresh"
                )
            if announce:
                who = f"process {', '.join(map(str, holders))}" if holders else "another process"
                log.info("DeepSpeed's %s op is being built by %s; waiting for it (lock %s)", op, who, lock)
        elif announce and not any(name.endswith(".so") for name in _names(folder)):
            log.info(
                "DeepSpeed compiles its %s op now, once for this machine and Python (a few minutes; cached in %s)",
                op,
                folder,
            )


def _names(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []
