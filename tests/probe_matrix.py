"""The adversarial matrix of issue 18, as a script (not part of the pytest suite: it runs
`bertpipe` some forty times, killing some of the runs, and takes most of an hour on a
2-core machine). Every case runs the real command in a child process and gets one verdict:

  clear error            exit 2, one `bertpipe: error:` line, no traceback
  counted skip           the bad input is listed under `skipped` (or counted as dropped), the rest kept
  recovered identically  the run (or the run after the interrupted one) ends with the output it should have
  silent loss            the run succeeds but input or output is missing with no word of it
  escape                 a file outside the run root was read, hashed or deleted, a secret reached disk,
                         a socket listened beyond loopback, or planted code ran
  hang                   no answer within the case's timeout
  crash                  a traceback, or an exit that is none of the above

    nice python tests/probe_matrix.py [--workdir DIR] [--only SUBSTRING] [--keep]

It prints one row per case, then the count per verdict. Run it on a quiet machine if you can.
"""

from __future__ import annotations

import argparse
import bz2
import collections
import gzip
import hashlib
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
VERDICTS = ("clear error", "counted skip", "recovered identically", "silent loss", "escape", "hang", "crash")
STAGES = ("corpus", "vocab", "examples", "pretrain", "evaluate")
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def tiny_recipe(root: Path) -> dict:
    """The smallest recipe that runs every stage: the news text, a 1,000-entry vocabulary,
    one pass of seq64 examples, 30 steps of BERT-tiny on 2 workers, one polarity fold pair."""
    return {
        "run": {"root": str(root), "seed": 7},
        "ray": {"num_cpus": 2},
        "corpus": {"inputs": [{"uri": "{demo_data}/lee_background.cor", "format": "lines", "name": "news"}],
                   "validation_fraction": 0.1, "shard_chars": 100_000},
        "vocab": {"vocab_size": 1000, "min_frequency": 2},
        "examples": {"dupe_factor": 1, "phases": [{"name": "seq64", "max_seq_length": 64, "max_predictions_per_seq": 10}]},
        "pretrain": {"model_size": "tiny", "num_workers": 2, "zero_stage": 2, "learning_rate": 1e-3, "warmup_steps": 3,
                     "phases": [{"name": "seq64", "steps": 30, "batch_size": 16}], "checkpoint_every": 10, "log_every": 10,
                     "eval_every": 30, "validation_batches": 2},
        "evaluate": {"baseline": False, "embeddings": {"sentences": 50, "num_pairs": 50},
                     "intrinsic": {"max_batches": 2, "fill_mask": 1},
                     "tasks": [{"name": "polarity", "type": "classification", "format": "fasttext",
                                "train": "{demo_data}/pang_lee_polarity.cor", "encoding": "cp1252", "cross_validation_folds": 2,
                                "seeds": [1], "epochs": 1, "batch_size": 16, "max_seq_length": 64}]},
    }


# -- running bertpipe ---------------------------------------------------------------------------


@dataclass
class Ran:
    rc: int | None
    out: str
    err: str
    timed_out: bool = False
    seconds: float = 0.0
    leftovers: list[int] = field(default_factory=list)


class Probe:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "AWS_ENDPOINT"))}
        self.env.update(PREFECT_HOME=str(workdir / "prefect"), BERTPIPE_CACHE_DIR=str(workdir / "cache"), PYTHONPATH=str(ROOT))
        self.rows: list[tuple[str, str, str, str]] = []

    def recipe(self, name: str, data: dict) -> Path:
        path = self.workdir / f"{name}.yaml"
        path.write_text(json.dumps(data))
        return path

    def start(self, args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, Path, Path]:
        out_path, err_path = Path(tempfile.mktemp(dir=self.workdir, suffix=".out")), Path(tempfile.mktemp(dir=self.workdir, suffix=".err"))
        process = subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, env={**self.env, **(env or {})},
                                   stdout=open(out_path, "w"), stderr=open(err_path, "w"), start_new_session=True)
        return process, out_path, err_path

    def finish(self, process: subprocess.Popen, out_path: Path, err_path: Path, timeout: float, started: float) -> Ran:
        timed_out = False
        try:
            process.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        leftovers = group_members(process.pid)
        if leftovers:  # processes this run started that outlived it: reported, then ended
            time.sleep(5)
            leftovers = group_members(process.pid)
            for pid in leftovers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return Ran(None if timed_out else process.returncode, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"),
                   timed_out, round(time.monotonic() - started, 1), leftovers)

    def run(self, *args: str, env: dict | None = None, timeout: float = 900) -> Ran:
        started = time.monotonic()
        process, out_path, err_path = self.start(list(args), env)
        return self.finish(process, out_path, err_path, timeout, started)

    def interrupt(self, args: list[str], trigger: str, sig: int, delay: float, timeout: float = 900) -> tuple[Ran, bool]:
        """Run, and send `sig` `delay` seconds after `trigger` appears in stderr (SIGINT to
        the process group, as Ctrl-C does; SIGKILL to the command alone, as the OOM killer
        does). Returns (what ran, whether the signal was sent)."""
        started = time.monotonic()
        process, out_path, err_path = self.start(args)
        sent = False
        while process.poll() is None and time.monotonic() - started < timeout:
            if trigger in err_path.read_text(errors="replace"):
                time.sleep(delay)
                if process.poll() is None:
                    if sig == signal.SIGINT:
                        os.killpg(process.pid, sig)
                    else:
                        os.kill(process.pid, sig)
                    sent = True
                break
            time.sleep(0.2)
        return self.finish(process, out_path, err_path, timeout, started), sent

    def record(self, group: str, case: str, verdict: str, detail: str) -> None:
        assert verdict in VERDICTS, verdict
        self.rows.append((group, case, verdict, detail))
        print(f"| {group} | {case} | {verdict} | {detail} |", flush=True)


def group_members(pgid: int) -> list[int]:
    import psutil

    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == pgid:
                found.append(process.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return found


def error_lines(ran: Ran) -> list[str]:
    return [line for line in ran.err.splitlines() if line.startswith("bertpipe: error:")]


def failure_verdict(ran: Ran) -> tuple[str, str]:
    if ran.timed_out:
        return "hang", f"no answer in {ran.seconds:.0f} s"
    errors = error_lines(ran)
    if ran.rc == 2 and len(errors) == 1 and "Traceback" not in ran.err:
        return "clear error", errors[0].removeprefix("bertpipe: error: ")[:160]
    tail = " / ".join(ran.err.strip().splitlines()[-2:])[:200]
    return "crash", f"exit {ran.rc}: {tail}"


def manifest(root: Path, stage: str) -> dict | None:
    path = root / ("eval" if stage == "evaluate" else stage) / "_manifest.json"
    return json.loads(path.read_text()) if path.exists() else None


def shard_hashes(root: Path, stage: str) -> dict[str, str]:
    found = manifest(root, stage)
    return {s["path"]: s["sha256"] for s in found["shards"]} if found else {}


def same_outputs(root: Path, reference: Path, stages=STAGES) -> tuple[bool, str]:
    """Whether every stage's shards equal the reference's (pretrain: same steps and losses
    within 1e-4 when the weights differ in their last bits; evaluate: the same scores)."""
    for stage in stages:
        got, want = shard_hashes(root, stage), shard_hashes(reference, stage)
        if not got:
            return False, f"{stage}: no complete output"
        if got == want:
            continue
        if stage == "pretrain":
            ours = [json.loads(x) for x in (root / "pretrain" / "metrics.jsonl").read_text().splitlines() if x.strip()]
            theirs = [json.loads(x) for x in (reference / "pretrain" / "metrics.jsonl").read_text().splitlines() if x.strip()]
            if [r["step"] for r in ours] == [r["step"] for r in theirs] and all(abs(a["loss"] - b["loss"]) < 1e-4 for a, b in zip(ours, theirs)):
                continue
            return False, f"pretrain: steps or losses differ from the uninterrupted run ({len(ours)} vs {len(theirs)} steps)"
        if stage == "evaluate":
            ours = json.loads((root / "eval" / "metrics.json").read_text())["tasks"]
            theirs = json.loads((reference / "eval" / "metrics.json").read_text())["tasks"]
            if json.dumps(ours, sort_keys=True) == json.dumps(theirs, sort_keys=True):
                continue
        differing = sorted(set(got.items()) ^ set(want.items()))[:2]
        return False, f"{stage}: shards differ from the uninterrupted run ({differing})"
    return True, "same shards as the uninterrupted run" + (" (pretrain: same steps and losses)" if "pretrain" in stages else "")


def copy_root(reference: Path, target: Path, keep: tuple[str, ...]) -> None:
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for stage in keep:
        directory = "eval" if stage == "evaluate" else stage
        shutil.copytree(reference / directory, target / directory, symlinks=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
