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
  handled                (cases with nothing to report) the run completes correctly and nothing escapes
  not reached            the case's moment never came (an interruption whose trigger line was not printed):
                         a defect of the probe, not a result

    nice python probes/probe_matrix.py [--workdir DIR] [--only SUBSTRING] [--keep]

It prints one row per case, then the count per verdict. Run it on a quiet machine if you can.
(One file of about 700 lines: the cases share one reference run and the helpers that run
and classify `bertpipe`; it is a script, not a library.)
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
VERDICTS = (
    "clear error",
    "counted skip",
    "recovered identically",
    "silent loss",
    "escape",
    "hang",
    "crash",
    "handled",
    "not reached",
)
STAGES = ("corpus", "vocab", "examples", "pretrain", "evaluate")
CASE_FILTER = ""
"""Run only the interruption cases whose name holds this (`--case "SIGINT during pretrain"`)."""
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def tiny_recipe(root: Path) -> dict:
    """The smallest recipe that runs every stage: the news text, a 1,000-entry vocabulary,
    one pass of seq64 examples, 30 steps of BERT-tiny on 2 workers, one polarity fold pair."""
    return {
        "run": {"root": str(root), "seed": 7},
        "ray": {"num_cpus": 2},
        "corpus": {
            "inputs": [{"uri": "{demo_data}/lee_background.cor", "format": "lines", "name": "news"}],
            "validation_fraction": 0.1,
            "shard_chars": 100_000,
        },
        "vocab": {"vocab_size": 1000, "min_frequency": 2},
        "examples": {
            "dupe_factor": 1,
            "phases": [{"name": "seq64", "max_seq_length": 64, "max_predictions_per_seq": 10}],
        },
        "pretrain": {
            "model_size": "tiny",
            "num_workers": 2,
            "zero_stage": 2,
            "learning_rate": 1e-3,
            "warmup_steps": 3,
            "phases": [{"name": "seq64", "steps": 30, "batch_size": 16}],
            "checkpoint_every": 10,
            "log_every": 10,
            "eval_every": 30,
            "validation_batches": 2,
        },
        "evaluate": {
            "baseline": False,
            "embeddings": {"sentences": 50, "num_pairs": 50},
            "intrinsic": {"max_batches": 2, "fill_mask": 1},
            "tasks": [
                {
                    "name": "polarity",
                    "type": "classification",
                    "format": "fasttext",
                    "train": "{demo_data}/pang_lee_polarity.cor",
                    "encoding": "cp1252",
                    "cross_validation_folds": 2,
                    "seeds": [1],
                    "epochs": 1,
                    "batch_size": 16,
                    "max_seq_length": 64,
                }
            ],
        },
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
    after_signal: float | None = None
    """Seconds from the signal to the end of the process (interrupted runs)."""


class Probe:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "AWS_ENDPOINT"))}
        self.env.update(
            PREFECT_HOME=str(workdir / "prefect"), BERTPIPE_CACHE_DIR=str(workdir / "cache"), PYTHONPATH=str(ROOT)
        )
        self.rows: list[tuple[str, str, str, str]] = []

    def recipe(self, name: str, data: dict) -> Path:
        path = self.workdir / f"{name}.yaml"
        path.write_text(json.dumps(data))
        return path

    def start(self, args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, Path, Path]:
        out_path, err_path = (
            Path(tempfile.mktemp(dir=self.workdir, suffix=".out")),
            Path(tempfile.mktemp(dir=self.workdir, suffix=".err")),
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=open(out_path, "w"),
            stderr=open(err_path, "w"),
            start_new_session=True,
        )
        return process, out_path, err_path

    def finish(
        self,
        process: subprocess.Popen,
        out_path: Path,
        err_path: Path,
        timeout: float,
        started: float,
        family: dict | None = None,
    ) -> Ran:
        timed_out = False
        try:
            process.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            timed_out = True
            family = {**(family or {}), **descendants(process.pid)}
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        time.sleep(5 if family else 0)
        leftovers = alive(family or {}) + [pid for pid in group_members(process.pid) if pid not in (family or {})]
        for pid in leftovers:  # processes this run started that outlived it: reported, then ended
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return Ran(
            None if timed_out else process.returncode,
            out_path.read_text(errors="replace"),
            err_path.read_text(errors="replace"),
            timed_out,
            round(time.monotonic() - started, 1),
            leftovers,
        )

    def run(self, *args: str, env: dict | None = None, timeout: float = 900) -> Ran:
        started = time.monotonic()
        process, out_path, err_path = self.start(list(args), env)
        return self.finish(process, out_path, err_path, timeout, started)

    def interrupt(
        self, args: list[str], trigger: str, sig: int, delay: float, timeout: float = 900
    ) -> tuple[Ran, bool]:
        """Run, and send `sig` `delay` seconds after `trigger` appears in stderr (SIGINT to
        the process group, as Ctrl-C does; SIGKILL to the command alone, as the OOM killer
        does). Returns (what ran, whether the signal was sent)."""
        started = time.monotonic()
        process, out_path, err_path = self.start(args)
        sent = False
        family: dict = {}
        while process.poll() is None and time.monotonic() - started < timeout:
            if trigger in err_path.read_text(errors="replace"):
                time.sleep(delay)
                family = descendants(process.pid)  # Ray's and Prefect's processes, to find any that outlive the kill
                if process.poll() is None:
                    if sig == signal.SIGINT:
                        os.killpg(process.pid, sig)
                    else:
                        os.kill(process.pid, sig)
                    sent = time.monotonic()
                break
            time.sleep(0.2)
        ran = self.finish(process, out_path, err_path, timeout, started, family)
        ran.after_signal = round(time.monotonic() - sent, 1) if sent else None
        return ran, bool(sent)

    def record(self, group: str, case: str, verdict: str, detail: str) -> None:
        assert verdict in VERDICTS, verdict
        self.rows.append((group, case, verdict, detail))
        print(f"| {group} | {case} | {verdict} | {detail} |", flush=True)


def descendants(pid: int) -> dict[int, float]:
    """pid -> start time of every process below `pid`."""
    import psutil

    try:
        return {c.pid: c.create_time() for c in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return {}


def alive(family: dict[int, float]) -> list[int]:
    import psutil

    found = []
    for pid, created in family.items():
        try:
            if psutil.Process(pid).create_time() == created:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


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


RELAYED = ("(RayTrainWorker", "(TrainController", "(pid=", "(raylet")


def failure_verdict(ran: Ran) -> tuple[str, str]:
    if ran.timed_out:
        return "hang", f"no answer in {ran.seconds:.0f} s"
    errors = error_lines(ran)
    if ran.rc == 2 and len(errors) == 1:  # the line the user reads; say what was printed above it
        lines = ran.err.splitlines()
        relayed = any("Traceback" in line and any(mark in line for mark in RELAYED) for line in lines)
        logged = any(line.startswith("Traceback") for line in lines)
        above = [
            what
            for what, seen in (("Ray Train's relayed worker traceback", relayed), ("a logged traceback", logged))
            if seen
        ]
        return "clear error", errors[0].removeprefix("bertpipe: error: ")[:160] + (
            f" (below {' and '.join(above)})" if above else ""
        )
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
            theirs = [
                json.loads(x) for x in (reference / "pretrain" / "metrics.jsonl").read_text().splitlines() if x.strip()
            ]
            if [r["step"] for r in ours] == [r["step"] for r in theirs] and all(
                abs(a["loss"] - b["loss"]) < 1e-4 for a, b in zip(ours, theirs)
            ):
                continue
            return (
                False,
                f"pretrain: steps or losses differ from the uninterrupted run ({len(ours)} vs {len(theirs)} steps)",
            )
        if stage == "evaluate":  # the same scores; how long each fine-tuning run took differs
            ours = _untimed(json.loads((root / "eval" / "metrics.json").read_text())["tasks"])
            theirs = _untimed(json.loads((reference / "eval" / "metrics.json").read_text())["tasks"])
            if json.dumps(ours, sort_keys=True) == json.dumps(theirs, sort_keys=True):
                continue
        differing = sorted(set(got.items()) ^ set(want.items()))[:2]
        return False, f"{stage}: shards differ from the uninterrupted run ({differing})"
    return True, "same shards as the uninterrupted run" + (
        " (pretrain: same steps and losses)" if "pretrain" in stages else ""
    )


def _untimed(value):
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def copy_root(reference: Path, target: Path, keep: tuple[str, ...]) -> None:
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for stage in keep:
        directory = "eval" if stage == "evaluate" else stage
        shutil.copytree(reference / directory, target / directory, symlinks=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the cases -------------------------------------------------------------------------------------


def poll_listeners(pid: int, stop: threading.Event, seen: dict) -> None:
    """Every listening socket of `pid`'s descendants, with the process name, until `stop`."""
    import psutil

    while not stop.is_set():
        try:
            processes = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for process in processes:
            try:
                name = process.name()
                for conn in process.net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN:
                        seen.setdefault(name, set()).add(conn.laddr.ip)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        time.sleep(0.3)


def reference_run(p: Probe) -> Path | None:
    """The tiny recipe, uninterrupted, with every listening socket polled while it runs (case 3)."""
    root = p.workdir / "reference"
    recipe = p.recipe("reference", tiny_recipe(root))
    started = time.monotonic()
    process, out_path, err_path = p.start(["run", "-c", str(recipe)])
    seen: dict = {}
    stop = threading.Event()
    poller = threading.Thread(target=poll_listeners, args=(process.pid, stop, seen), daemon=True)
    poller.start()
    ran = p.finish(process, out_path, err_path, 1800, started)
    stop.set()
    poller.join()
    if ran.rc != 0:
        p.record("8 cases", "reference run of the tiny recipe", *failure_verdict(ran))
        return None
    exposed = {name: sorted(ips - LOOPBACK) for name, ips in seen.items() if ips - LOOPBACK}
    trainers = [name for name in seen if "RayTrainWorker" in name]
    if exposed:
        p.record(
            "8 cases",
            "3: listening sockets during a full run (pretrain included)",
            "escape",
            f"non-loopback: {exposed}",
        )
    else:
        p.record(
            "8 cases",
            "3: listening sockets during a full run (pretrain included)",
            "handled",
            f"{sum(len(v) for v in seen.values())} listening addresses in {len(seen)} process kinds, all loopback "
            f"(Ray Train workers seen listening: {bool(trainers)}); run took {ran.seconds:.0f} s",
        )
    return root


BAD_INPUTS = {
    # name: (file name, bytes or None for special handling, format)
    "zero-byte-bz2": ("empty.txt.bz2", b"", "lines"),
    "gz-that-is-text": ("plain.txt.gz", b"this is plain text, not gzip\n" * 20, "lines"),
    "mixed-encodings": ("mixed.txt", None, "lines"),
    "csv-quoted-newlines": ("quoted.csv", None, "csv"),
    "wiki-page-without-text": ("notext.xml", None, "wikipedia"),
    "non-string-text": ("nonstr.jsonl", None, "jsonl"),
}
LONG = "The river rose in the night and the town woke to water in the streets. " * 4


def _bad_files(folder: Path) -> None:
    for file, data, _ in BAD_INPUTS.values():
        if data is not None:
            (folder / file).write_bytes(data)
    (folder / "mixed.txt").write_bytes(
        ("A first line in UTF-8, café and naïve. " * 6 + "\n").encode()
        + ("Une ligne en latin-1, café. " * 8 + "\n").encode("latin-1")
    )
    rows = ["text,title"] + [
        f'"Record {i}. {LONG}\nA second paragraph of record {i}, after a newline inside the quotes. {LONG}",doc{i}'
        for i in range(3)
    ]
    (folder / "quoted.csv").write_text("\n".join(rows) + "\n")
    page = "<page><title>{t}</title><ns>0</ns><id>{i}</id><revision><id>{i}</id>{body}</revision></page>"
    (folder / "notext.xml").write_text(
        "<mediawiki "
        'xmlns="http://www.mediawiki.org/xml/export-0.10/"><siteinfo><sitename>W</sitename><dbname>w</dbname>'
        '<base>https://w/wiki/Main</base><namespaces><namespace key="0" case="first-letter" /></namespaces></siteinfo>'
        + page.format(t="No text", i=1, body="")
        + page.format(t="Has text", i=2, body=f'<text xml:space="preserve">{LONG} {LONG}</text>')
        + "</mediawiki>\n"
    )
    records = [
        {"text": 123},
        {"text": None},
        {"text": ["a", "b"]},
        {"text": {"x": 1}},
        {"text": True},
        {"text": f"{LONG} {LONG}"},
    ]
    (folder / "nonstr.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "globbed").mkdir()
    (folder / "globbed" / "x.jsonl").mkdir()  # a folder a glob meets
    (folder / "globbed" / "x.jsonl" / "inside.jsonl").write_text(json.dumps({"text": f"{LONG} {LONG}"}) + "\n")
    (folder / "globbed" / "real.jsonl").write_text(json.dumps({"text": f"{LONG} {LONG}"}) + "\n")


def bad_inputs(p: Probe) -> None:
    """Every bad input of the issue in one corpus run with on_error: skip, beside good news text."""
    folder = p.workdir / "bad"
    folder.mkdir(exist_ok=True)
    _bad_files(folder)
    inputs = [{"uri": "{demo_data}/lee_background.cor", "format": "lines", "name": "news"}]
    inputs += [{"uri": str(folder / file), "format": fmt, "name": name} for name, (file, _, fmt) in BAD_INPUTS.items()]
    inputs += [
        {"uri": str(folder / "globbed" / "*.jsonl"), "format": "jsonl", "name": "glob-meets-a-folder"},
        {"uri": str(folder / "nothing-here" / "*.txt"), "format": "lines", "name": "glob-matches-nothing"},
    ]
    root = p.workdir / "bad-run"
    data = tiny_recipe(root)
    data["corpus"].update(inputs=inputs, on_error="skip")
    ran = p.run("run", "-c", str(p.recipe("bad", data)), "--only", "corpus", timeout=900)
    if ran.rc != 0:
        p.record("bad inputs", "all of them, on_error: skip", *failure_verdict(ran))
        return
    found = manifest(root, "corpus")
    per_source, skipped = found["stats"]["per_source"], found["skipped"]
    expectations = {"csv-quoted-newlines": 3, "non-string-text": 1, "wiki-page-without-text": 1}
    for name in [*BAD_INPUTS, "glob-meets-a-folder", "glob-matches-nothing"]:
        source = per_source.get(name, {})
        listed = [
            s
            for s in skipped
            if Path(s["file"]).name in (BAD_INPUTS.get(name, ("",))[0],)
            or (name == "glob-meets-a-folder" and s["file"].endswith("x.jsonl"))
            or (name == "glob-matches-nothing" and "nothing-here" in s["file"])
        ]
        read, kept, dropped = source.get("read", 0), source.get("kept", 0), source.get("dropped", {})
        if name in expectations and read >= expectations[name] and not listed:
            if name == "csv-quoted-newlines":
                verdict = "handled" if read == 3 and kept == 3 else "silent loss"
            else:  # some records are not documents: counted as dropped, the rest kept
                verdict = "counted skip" if dropped or read > expectations[name] else "silent loss"
            p.record("bad inputs", name, verdict, f"read {read}, kept {kept}, dropped {dropped}")
        elif listed:
            extra = f"; the glob's other file read ({read} read)" if name == "glob-meets-a-folder" else ""
            p.record("bad inputs", name, "counted skip", f"skipped: {listed[0]['reason'][:120]}{extra}")
        else:
            p.record(
                "bad inputs",
                name,
                "silent loss",
                f"neither skipped nor read as expected (read {read}, kept {kept}, dropped {dropped})",
            )
    news = per_source.get("news", {})
    if not news.get("kept"):
        p.record("bad inputs", "the good input beside them", "silent loss", f"news: {news}")


def interruptions(p: Probe, reference: Path) -> None:
    """SIGINT (Ctrl-C, to the whole process group) and SIGKILL (the command alone) during
    each stage, then the same command again: the outputs must equal the uninterrupted run's."""
    triggers = {
        "corpus": ("corpus: start", 0.3),
        "vocab": ("vocab: start", 0.5),
        "examples": ("examples: start", 1.0),
        "pretrain": ("pretrain: steps 1-10/", 0.5),
        "evaluate": ("evaluate: start", 3.0),
    }
    for stage in STAGES:
        for sig in (signal.SIGINT, signal.SIGKILL):
            root = p.workdir / f"killed-{stage}-{sig.name}"
            copy_root(reference, root, STAGES[: STAGES.index(stage)])
            recipe = p.recipe(f"killed-{stage}", tiny_recipe(root))
            case = f"{sig.name} during {stage}"
            if CASE_FILTER and CASE_FILTER not in case:
                continue
            trigger, delay = triggers[stage]
            ran, sent = p.interrupt(["run", "-c", str(recipe)], trigger, sig, delay)
            if not sent:
                p.record("interrupted", case, *failure_verdict(ran)) if ran.rc != 0 else p.record(
                    "interrupted",
                    case,
                    "not reached",
                    f"the run ended ({ran.seconds:.0f} s) before {trigger!r} appeared: nothing was interrupted",
                )
                continue
            notes = [
                f"killed run exit {ran.rc} {ran.after_signal} s after the signal"
                + (f", {len(ran.leftovers)} of its processes outlived it" if ran.leftovers else "")
            ]
            interrupt_verdict = None
            if sig == signal.SIGINT:
                if ran.rc == 130 and len(error_lines(ran)) == 1 and ran.after_signal < 60:
                    notes.append(f"Ctrl-C: one line: {error_lines(ran)[-1][17:90]}")
                else:  # Ctrl-C itself went wrong, whatever the rerun does
                    interrupt_verdict = "hang" if ran.timed_out or ran.after_signal >= 60 else failure_verdict(ran)[0]
                    notes.append(
                        f"Ctrl-C: {interrupt_verdict}: exit {ran.rc} after {ran.after_signal} s: "
                        f"{failure_verdict(ran)[1][:90]}"
                    )
            again = p.run("run", "-c", str(recipe), timeout=1800)
            if again.rc == 2 and "is in use by" in again.err:
                notes.append("rerun refused by the dead run's lease until it expired")
                time.sleep(125)
                again = p.run("run", "-c", str(recipe), timeout=1800)
            if again.rc != 0:
                verdict, detail = failure_verdict(again)
                p.record("interrupted", case, verdict, f"rerun: {detail}; " + "; ".join(notes))
                continue
            same, detail = same_outputs(root, reference)
            verdict = "silent loss" if not same else interrupt_verdict or "recovered identically"
            p.record("interrupted", case, verdict, f"{detail}; " + "; ".join(notes))
            if same:
                shutil.rmtree(root, ignore_errors=True)


def full_disk(p: Probe, reference: Path) -> None:
    """The run root on a 3 MB tmpfs: the corpus, vocabulary and examples fit, the pretraining
    checkpoints do not."""
    mount = p.workdir / "full"
    mount.mkdir(exist_ok=True)
    mounted = (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True).returncode
        == 0
    )
    if not mounted:
        p.record(
            "full disk",
            "run root on a 3 MB file system",
            "crash",
            "could not mount a tmpfs here (no privilege): not probed",
        )
        return
    try:
        root = mount / "run"
        ran = p.run("run", "-c", str(p.recipe("full", tiny_recipe(root))), timeout=1800)
        verdict, detail = (
            failure_verdict(ran) if ran.rc != 0 else ("silent loss", "the run claims success on a full disk")
        )
        p.record("full disk", "run root on a 3 MB file system", verdict, detail)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


class _Planted:
    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def planted_pickle(p: Probe, reference: Path) -> None:
    """pretrain.init_from: a model folder whose pytorch_model.bin would create a file when unpickled."""
    import torch

    model = p.workdir / "planted-model"
    shutil.copytree(reference / "pretrain" / "model", model, dirs_exist_ok=True)
    (model / "model.safetensors").unlink()
    marker = p.workdir / "the-payload-ran"
    torch.save({"bert.embeddings.word_embeddings.weight": _Planted(str(marker))}, model / "pytorch_model.bin")
    root = p.workdir / "planted-run"
    copy_root(reference, root, ("corpus",))
    data = tiny_recipe(root)
    data["vocab"] = {"source": "pretrained"}
    data["pretrain"]["init_from"] = str(model)
    ran = p.run("run", "-c", str(p.recipe("planted", data)), "--only", "vocab,examples,pretrain", timeout=1800)
    if marker.exists():
        p.record("planted pickle", "init_from folder with a pickle payload", "escape", "the payload ran")
    elif ran.rc == 0:
        p.record(
            "planted pickle",
            "init_from folder with a pickle payload",
            "silent loss",
            "the run succeeded on a planted model",
        )
    else:
        p.record("planted pickle", "init_from folder with a pickle payload", *failure_verdict(ran))


def case_1_links(p: Probe, reference: Path) -> None:
    root = p.workdir / "case1"
    copy_root(reference, root, ("corpus",))
    outside = p.workdir / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "victim.txt").write_text("not bertpipe's\n")
    os.symlink(outside, root / "corpus" / "evil")
    path = root / "corpus" / "_manifest.json"
    data = json.loads(path.read_text())
    data["shards"].append(
        {"path": "evil/victim.txt", "rows": 1, "bytes": 15, "sha256": "0" * 64, "extra": {}, "stamp": ""}
    )
    path.write_text(json.dumps(data))
    recipe = p.recipe("case1", tiny_recipe(root))
    atime = (outside / "victim.txt").stat().st_atime_ns
    verified = p.run("verify", "corpus", "-c", str(recipe), timeout=600)
    ran = p.run("run", "-c", str(recipe), "--only", "corpus", timeout=900)
    if not (outside / "victim.txt").exists():
        p.record(
            "8 cases", "1: a link in a stage directory, run --only corpus", "escape", "the outside file was deleted"
        )
    elif ran.rc != 0:
        p.record("8 cases", "1: a link in a stage directory, run --only corpus", *failure_verdict(ran))
    else:
        same, detail = same_outputs(root, reference, ("corpus",))
        read = (outside / "victim.txt").stat().st_atime_ns != atime
        p.record(
            "8 cases",
            "1: a link in a stage directory, run --only corpus",
            "recovered identically" if same else "silent loss",
            f"verify exit {verified.rc} ({'damaged' if 'damaged' in verified.out else '?'}); link removed: "
            f"{not os.path.lexists(root / 'corpus' / 'evil')}; outside file "
            f"intact{', but read' if read else ''}; {detail}",
        )


def case_2_secret(p: Probe, reference: Path) -> None:
    root = p.workdir / "case2"
    secret = "PROBE-PASSWORD-5e1d"
    ran = p.run(
        "run",
        "-c",
        str(p.recipe("case2", tiny_recipe(root))),
        "--only",
        "corpus",
        "--set",
        f"storage.endpoint_url=http://USER:{secret}@127.0.0.1:9000",
        timeout=900,
    )
    places = [
        str(f)
        for folder in (root, p.workdir / "prefect")
        for f in folder.rglob("*")
        if f.is_file() and not f.is_symlink() and secret.encode() in f.read_bytes()
    ]
    if places:
        p.record("8 cases", "2: a password in --set storage.endpoint_url", "escape", f"found in {places[:3]}")
    elif ran.rc != 0:
        p.record("8 cases", "2: a password in --set storage.endpoint_url", *failure_verdict(ran))
    else:
        p.record(
            "8 cases",
            "2: a password in --set storage.endpoint_url",
            "handled",
            "in no file of the run root or of Prefect's home (database and WAL included)",
        )


def case_4_recipes(p: Probe) -> None:
    bomb = "corpus: {inputs: [a.txt]}\npretrain:\n  model_overrides:\n    a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n"
    for level, name in zip("bcdefghi", "abcdefgh"):
        bomb += f"    {level}: &{level} [{', '.join(['*' + name] * 9)}]\n"
    (p.workdir / "bomb.yaml").write_text(bomb)
    ran = p.run("config", "show", "-c", str(p.workdir / "bomb.yaml"), timeout=120)
    p.record("8 cases", f"4: a {len(bomb)}-byte YAML alias bomb (config show)", *failure_verdict(ran))
    big = p.workdir / "big.yaml"
    big.write_text("corpus: {inputs: [a.txt]}\n" + "".join(f"k{i}: {i}\n" for i in range(1_000_000)))
    ran = p.run("config", "show", "-c", str(big), timeout=300)
    p.record("8 cases", f"4: a {big.stat().st_size >> 20} MB recipe (config show)", *failure_verdict(ran))
    for root, label in (("", "empty"), ("/", "/"), ("$BERTPIPE_PROBE_UNSET/x", "$UNSET/x")):
        ran = p.run(
            "run",
            "-c",
            str(p.recipe("root", tiny_recipe(Path("/tmp")))),
            "--set",
            f"run.root={root}",
            "--only",
            "corpus",
            timeout=300,
        )
        p.record("8 cases", f"6: run.root={label}", *failure_verdict(ran))
    home = p.workdir / "home"
    ran = p.run(
        "config",
        "show",
        "-c",
        str(p.recipe("root", tiny_recipe(Path("/tmp")))),
        "--set",
        "run.root=$HOME/x",
        "--json",
        env={"HOME": str(home)},
        timeout=300,
    )
    expanded = ran.rc == 0 and json.loads(ran.out)["run"]["root"] == str(home / "x")
    p.record(
        "8 cases",
        "6: run.root=$HOME/x",
        "handled" if expanded else "silent loss",
        f"expanded to {home / 'x'}" if expanded else f"exit {ran.rc}: {ran.out[-200:]}",
    )


def case_4_5_folders(p: Probe) -> None:
    folder = p.workdir / "fifo-input"
    folder.mkdir(exist_ok=True)
    shutil.copy(
        Path(__import__("bertcore.sample_data", fromlist=["x"]).gensim_data_dir()) / "lee_background.cor",
        folder / "news.txt",
    )
    if not (folder / "pipe.txt").exists():
        os.mkfifo(folder / "pipe.txt")
    if not os.path.lexists(folder / "self"):
        os.symlink(folder, folder / "self")
    data = tiny_recipe(p.workdir / "fifo-run")
    data["corpus"]["inputs"] = [{"uri": str(folder), "format": "lines"}]
    ran = p.run("status", "-c", str(p.recipe("fifo", data)), "--json", timeout=300)
    if ran.rc == 0:
        row = {r["stage"]: r for r in json.loads(ran.out)}["corpus"]
        p.record(
            "8 cases",
            "4+5: status on an input folder with a FIFO and a link to itself",
            "counted skip",
            f"corpus {row['state']}, fingerprint computed; the FIFO and the link are left out",
        )
    else:
        p.record("8 cases", "4+5: status on an input folder with a FIFO and a link to itself", *failure_verdict(ran))
    run = p.run("run", "-c", str(p.recipe("fifo", data)), "--only", "corpus", timeout=900)
    if run.rc == 0:
        skipped = {Path(s["file"]).name: s["reason"] for s in manifest(p.workdir / "fifo-run", "corpus")["skipped"]}
        p.record(
            "8 cases",
            "4+5: run --only corpus on that folder",
            "counted skip",
            "; ".join(f"{k}: {v}" for k, v in sorted(skipped.items())),
        )
    else:
        p.record("8 cases", "4+5: run --only corpus on that folder", *failure_verdict(run))


def case_5_lease_and_prefect(p: Probe, reference: Path) -> None:
    root = p.workdir / "case5"
    copy_root(reference, root, ("corpus",))
    (root / "_lease.json").write_text(
        json.dumps(
            {
                "holder": "x",
                "host": "h",
                "pid": 1,
                "token": "t",
                "acquired_at": 0,
                "heartbeat_at": 0,
                "expires_at": "later",
            }
        )
    )
    ran = p.run("run", "-c", str(p.recipe("case5", tiny_recipe(root))), "--only", "corpus", timeout=900)
    if ran.rc == 0:
        warned = [line for line in ran.err.splitlines() if "damaged lease file" in line]
        p.record(
            "8 cases",
            '5: _lease.json with "expires_at": "later"',
            "recovered identically",
            f"taken over with one warning: {warned[0][9:150] if warned else '(none seen)'}",
        )
    else:
        p.record("8 cases", '5: _lease.json with "expires_at": "later"', *failure_verdict(ran))
    ran = p.run(
        "run",
        "-c",
        str(p.recipe("case5", tiny_recipe(root))),
        "--only",
        "corpus",
        env={
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "0",
            "PREFECT_HOME": str(p.workdir / "prefect-timeout"),
        },
        timeout=300,
    )
    p.record("8 cases", "5: Prefect's temporary server does not start in time", *failure_verdict(ran))


def case_7_edit_in_place(p: Probe, reference: Path) -> None:
    from bertcore.sample_data import gensim_data_dir

    folder = p.workdir / "case7-in"
    folder.mkdir(exist_ok=True)
    news = folder / "news.txt"
    shutil.copy(gensim_data_dir() / "lee_background.cor", news)
    data = tiny_recipe(p.workdir / "case7")
    data["corpus"]["inputs"] = [{"uri": str(news), "format": "lines", "name": "news"}]
    recipe = p.recipe("case7", data)
    first = p.run("run", "-c", str(recipe), "--only", "corpus", timeout=900)
    before = os.stat(news)
    with open(news, "r+b") as handle:
        handle.seek(200)
        handle.write(b"EDITED")
    os.utime(news, ns=(before.st_atime_ns, before.st_mtime_ns))
    plain = p.run("status", "-c", str(recipe), "--json", timeout=300)
    verify = p.run("status", "-c", str(recipe), "--json", "--verify", timeout=300)
    rerun = p.run("run", "-c", str(recipe), "--only", "corpus", "--verify", timeout=900)
    fresh_data = json.loads(json.dumps(data))
    fresh_data["run"]["root"] = str(p.workdir / "case7-fresh")
    fresh = p.run("run", "-c", str(p.recipe("case7-fresh", fresh_data)), "--only", "corpus", timeout=900)
    states = [
        ({r["stage"]: r for r in json.loads(x.out)}["corpus"]["state"] if x.rc == 0 else f"exit {x.rc}")
        for x in (plain, verify)
    ]
    if first.rc or rerun.rc or fresh.rc:
        p.record(
            "8 cases",
            "7: an input edited in place, same size, mtime and inode",
            *failure_verdict(next(x for x in (first, rerun, fresh) if x.rc)),
        )
        return
    same = shard_hashes(p.workdir / "case7", "corpus") == shard_hashes(p.workdir / "case7-fresh", "corpus")
    p.record(
        "8 cases",
        "7: an input edited in place, same size, mtime and inode",
        "recovered identically" if states[1] == "stale" and same else "silent loss",
        (
            f"status: {states[0]} (the cache's trade-off); status --verify: {states[1]}; run --verify output "
            f"equals a fresh run's: {same}"
        ),
    )


def case_8_build_locks(p: Probe, reference: Path) -> None:
    extensions = p.workdir / "torch_extensions"
    (extensions / "deepspeed_shm_comm").mkdir(parents=True, exist_ok=True)
    (extensions / "deepspeed_shm_comm" / "lock").touch()
    root = p.workdir / "case8"
    copy_root(reference, root, ("corpus", "vocab", "examples"))
    recipe = p.recipe("case8", tiny_recipe(root))
    ran = p.run(
        "run", "-c", str(recipe), "--only", "pretrain", env={"TORCH_EXTENSIONS_DIR": str(extensions)}, timeout=1200
    )
    if ran.rc == 0:
        same, detail = same_outputs(root, reference, ("pretrain",))
        p.record(
            "8 cases",
            "8: a dead build's lock on the shm op",
            "recovered identically" if same else "silent loss",
            f"trained without waiting; {detail}",
        )
    else:
        p.record("8 cases", "8: a dead build's lock on the shm op", *failure_verdict(ran))
    (extensions / "fused_adam").mkdir(exist_ok=True)
    (extensions / "fused_adam" / "lock").touch()
    ran = p.run(
        "run",
        "-c",
        str(recipe),
        "--only",
        "pretrain",
        "--force",
        "--set",
        "pretrain.torch_adam=false",
        env={"TORCH_EXTENSIONS_DIR": str(extensions)},
        timeout=1200,
    )
    p.record("8 cases", "8: a dead build's lock on an op a setting asks for (torch_adam: false)", *failure_verdict(ran))


def begin(doc: str, prefix: str, make_probe, only_help: str, extra=None):
    """The command line every probe script shares (--workdir, --only, --keep, and `extra`'s
    options), its work folder, its probe and the table's header: (probe, group filter after
    --only's 'group:case', args, start time)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--only", default="", help=only_help)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    if extra:
        extra(parser)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=prefix))
    workdir.mkdir(parents=True, exist_ok=True)
    p = make_probe(workdir)
    group_filter, _, p.only_case = args.only.partition(":")
    print(f"work folder: {workdir}\n\n| group | case | verdict | detail |\n|---|---|---|---|", flush=True)
    return p, group_filter, args, time.monotonic()


def finish(rows: list, verdicts: tuple[str, ...], started: float, workdir: Path, keep: bool) -> None:
    """The count per verdict after the rows; the work folder removed unless it is to be kept."""
    counts = collections.Counter(verdict for *_, verdict, _ in rows)
    print(
        f"\n{len(rows)} cases in {time.monotonic() - started:.0f} s: "
        + ", ".join(f"{v} {counts.get(v, 0)}" for v in verdicts)
    )
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    p, _, args, started = begin(
        __doc__,
        "bertpipe-probe-",
        Probe,
        "run only the case groups whose function name holds this",
        lambda parser: parser.add_argument(
            "--case", default="", help="interruptions: only the cases whose name holds this"
        ),
    )
    global CASE_FILTER
    CASE_FILTER = args.case
    workdir = p.workdir
    reference = workdir / "reference"
    if not (reference / "eval" / "_manifest.json").exists():
        reference = reference_run(p)
    if reference is None:
        sys.exit(1)
    groups = [
        case_4_recipes,
        case_4_5_folders,
        bad_inputs,
        case_1_links,
        case_2_secret,
        case_5_lease_and_prefect,
        case_7_edit_in_place,
        case_8_build_locks,
        planted_pickle,
        full_disk,
        interruptions,
    ]
    for group in groups:
        if args.only and args.only not in group.__name__:
            continue
        try:
            group(p, reference) if group.__code__.co_argcount == 2 else group(p)
        except Exception as exc:  # noqa: BLE001 - the probe itself failed: say so and go on
            p.record("probe", group.__name__, "crash", f"the probe script failed: {type(exc).__name__}: {exc}"[:200])
    finish(p.rows, VERDICTS, started, workdir, keep=args.keep or bool(args.workdir))


if __name__ == "__main__":
    main()
