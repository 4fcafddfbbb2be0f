"""Issue 26's matrix, the groups that train (a script, not part of the pytest suite): what goes
stale when an outside model folder changes, Ctrl-C and SIGKILL of training runs, and errors
raised inside Ray workers. It builds on probes/probe_matrix_models.py (its verdicts, its runner
that polls the peak memory of each run's process tree) and probes/probe_matrix.py (the tiny
recipe, the process-tree helpers). Every case runs `bertpipe` in a child process.

  staleness   a run distils a 1-layer student from a tiny outside teacher (a BertModel folder
              the probe writes: 2 layers x 32, safetensors), then the teacher's weights change:
              `status` must show distill and evaluate stale; `run --only evaluate` must not score
              the new teacher against the old student without a word; the advised rerun works
              with a planted pytorch_model.bin beside the weights; with only that pickle there,
              nothing runs and no message passes on torch's weights_only advice; and the same
              folder as pretrain.init_from makes pretrain stale.
  interrupts  SIGINT (to the process group, as Ctrl-C) and SIGKILL (the command alone) during
              distillation and during pretraining: `status` while it trains says `running (pid,
              host, since)`; Ctrl-C ends it within seconds with one error line, last; no process
              of the run (the tree listed before the signal) is alive 5 s after it ended; the
              rerun takes the root at once and ends with model.safetensors equal to an
              uninterrupted run's.
  workers     errors raised inside a Ray worker (a training rank's loader, an evaluate job) by a
              file the driver accepted: one error line, last, naming the stage, the file and the
              rank where there is one; Ray's traceback in <run.root>/<stage>/_logs/.

Verdicts are probes/probe_matrix_models.py's, with two readings for these groups: a process of a
killed run alive 5 s after it ended is an escape; a `status` that does not show a training stage
as running is an unclear answer, counted with the tracebacks (as the issue counted it).

    nice python probes/probe_matrix_runs.py [--workdir DIR] [--only GROUP[:CASE]] [--keep]

The reference runs (a distillation with evaluate, and a pretraining from the teacher folder)
are made once per work folder and reused with --workdir.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))  # tiny_bert
sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_matrix import begin, copy_root, descendants, finish, tiny_recipe
from probe_matrix_models import VERDICTS, ModelProbe, verdict_of

STEPS = 1500
"""Training steps of every run here (about 45 s of a tiny model on 2 workers): time to ask
`status` after the first progress line and still interrupt the training."""
LOG_EVERY, CHECKPOINT_EVERY = 50, 300
BOMB = 8 << 30
"""A process tree over this is a memory bomb (a training run here peaks at about 5 GiB: two
training workers, Ray, Prefect's server and evaluate's jobs)."""
WORST = ("code executed", "escape", "silent loss", "hang", "traceback", "clear error", "handled")
DATA = ("corpus", "vocab", "examples")


RAY_START = "The current node timed out during startup"
"""Ray's own start-up timeout (30 s, fixed in Ray), which a machine loaded far beyond its cores hits."""


class RunsProbe(ModelProbe):
    """A run that Ray could not start on an overloaded machine is run again (up to twice),
    and counted: it says nothing about bertpipe."""

    ray_retries = 0

    def run(self, *args, env=None, timeout=300.0):
        for _ in range(3):
            ran = super().run(*args, env=env, timeout=timeout)
            if ran.rc == 0 or RAY_START not in ran.err:
                return ran
            self.ray_retries += 1
        return ran


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "(none)"


def errors_of(ran) -> list[str]:
    return [line for line in ran.err.splitlines() if line.startswith("bertpipe: error:")]


class Setup:
    """The teacher folder, the recipes, and the two reference runs, made when first asked for."""

    def __init__(self, p: RunsProbe):
        self.p = p
        self.teacher = p.workdir / "teacher"

    def make_teacher(self) -> Path:
        if not (self.teacher / "model.safetensors").exists():
            import torch
            import transformers

            from bertcore.sample_data import gensim_data_dir
            from tiny_bert import save_tiny_bert

            lines = (gensim_data_dir() / "lee_background.cor").read_text(errors="replace").splitlines()
            save_tiny_bert(self.teacher, lines, vocab_size=1000, layers=2, max_positions=128)
            torch.manual_seed(0)  # a BertModel (no heads), as all-MiniLM-L6-v2 is
            transformers.BertModel(transformers.BertConfig.from_pretrained(self.teacher)).save_pretrained(self.teacher)
        return self.teacher

    def distill(self, root: Path) -> Path:
        data = tiny_recipe(root)
        data["vocab"] = {"source": "pretrained"}  # vocab.pretrained defaults to distill.teacher
        data["distill"] = {
            "enabled": True,
            "teacher": str(self.make_teacher()),
            "student": {"num_hidden_layers": 1},
            "num_workers": 2,
            "zero_stage": 2,
            "learning_rate": 1e-3,
            "warmup_steps": 3,
            "phases": [{"name": "seq64", "steps": STEPS, "batch_size": 8}],
            "checkpoint_every": CHECKPOINT_EVERY,
            "log_every": LOG_EVERY,
            "eval_every": STEPS,
            "validation_batches": 2,
            "loss": {"soft_targets": 0.0, "hidden": 1.0, "mlm": 0.1},
        }
        data["evaluate"]["speed"] = {"passes": 1, "batch_size": 8, "max_seq_length": 64}
        return self.p.recipe(f"distill-{root.name}", data)

    def pretrain(self, root: Path, evaluate: dict | None = None) -> Path:
        data = tiny_recipe(root)
        data["vocab"] = {"source": "pretrained"}  # vocab.pretrained defaults to pretrain.init_from
        data["pretrain"].update(
            init_from=str(self.make_teacher()),
            phases=[{"name": "seq64", "steps": STEPS, "batch_size": 16}],
            checkpoint_every=CHECKPOINT_EVERY,
            log_every=LOG_EVERY,
            eval_every=STEPS,
        )
        if evaluate is not None:
            data["evaluate"] = evaluate
        return self.p.recipe(f"pretrain-{root.name}", data)

    def reference(self, stage: str) -> Path:
        """The uninterrupted run: distill-ref (corpus to evaluate, distilling) or pretrain-ref
        (its corpus, vocab and examples, then pretraining from the teacher folder)."""
        root = self.p.workdir / f"{stage}-ref"
        done = root / ("eval" if stage == "distill" else "pretrain") / "_manifest.json"
        if done.exists():
            return root
        if stage == "distill":
            ran = self.p.run("run", "-c", str(self.distill(root)), timeout=1800)
        else:
            copy_root(self.reference("distill"), root, DATA)
            ran = self.p.run("run", "-c", str(self.pretrain(root)), "--only", "pretrain", timeout=1800)
        if ran.rc != 0:
            raise RuntimeError(f"the reference {stage} run failed: {verdict(ran)[1]}")
        print(f"(reference {stage} run: {ran.seconds} s, peak RSS {ran.peak / 2**20:.0f} MiB)", flush=True)
        return root


def verdict(ran) -> tuple[str, str]:
    return verdict_of(ran, BOMB)


def worst(*verdicts: str) -> str:
    return min(verdicts, key=WORST.index)


# -- staleness ----------------------------------------------------------------------------------


def _nudge(weights: Path) -> None:
    """Add 0.01 to the word embeddings: the same file names and shapes, other weights."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    key = next(k for k in tensors if k.endswith("word_embeddings.weight"))
    tensors[key] = tensors[key] + 0.01
    save_file(tensors, weights, metadata={"format": "pt"})


class _Planted:
    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def _plant(folder: Path, marker: Path) -> None:
    import torch

    torch.save({"embeddings.word_embeddings.weight": _Planted(str(marker))}, folder / "pytorch_model.bin")


def _states(ran) -> dict[str, dict]:
    return {r["stage"]: r for r in json.loads(ran.out)} if ran.rc == 0 else {}


def staleness(p: RunsProbe, s: Setup) -> None:
    ref = s.reference("distill")
    pre = s.reference("pretrain")
    root, proot = p.workdir / "stale", p.workdir / "stale-init"
    copy_root(ref, root, (*DATA, "distill", "evaluate"))
    copy_root(pre, proot, (*DATA, "pretrain"))
    recipe, precipe = s.distill(root), s.pretrain(proot)
    before = _states(p.run("status", "-c", str(recipe), "--json", timeout=120))
    if {before.get(k, {}).get("state") for k in ("distill", "evaluate")} != {"complete"}:
        raise RuntimeError(
            f"the copied root is not complete before the change: { {k: v.get('state') for k, v in before.items()} }"
        )
    weights, marker = s.teacher / "model.safetensors", p.workdir / "the-payload-ran"
    original = weights.read_bytes()
    student = sha256(root / "distill" / "model" / "model.safetensors")
    metrics = sha256(root / "eval" / "metrics.json")
    try:
        _nudge(weights)
        ran = p.run("status", "-c", str(recipe), "--json", timeout=120)
        rows = _states(ran)
        d, e = rows.get("distill", {}), rows.get("evaluate", {})
        ok = (
            d.get("state") == "stale"
            and e.get("state") == "stale"
            and any("teacher" in c for c in d.get("changed", []))
        )
        p.record(
            "staleness",
            "status after the teacher's weights changed",
            "handled" if ok else ("silent loss" if ran.rc == 0 else verdict(ran)[0]),
            (
                f"distill {d.get('state')} ({'; '.join(d.get('changed', []))[:120]}), evaluate {e.get('state')} "
                f"({'; '.join(e.get('changed', []))[:80]})"
            ),
        )

        for case, extra in (
            ("run --only evaluate after the teacher changed", ()),
            ("run --only evaluate --force after the teacher changed", ("--force",)),
        ):
            ran = p.run("run", "-c", str(recipe), "--only", "evaluate", *extra, timeout=900)
            changed = sha256(root / "eval" / "metrics.json") != metrics
            if ran.rc == 0 and changed:
                p.record(
                    "staleness",
                    case,
                    "silent loss",
                    f"evaluate scored the new teacher against the old student; {ran.seconds} s",
                )
            elif ran.rc == 0:  # kept: the old teacher against the old student, which is fine when the run says so
                said = [line[9:200] for line in ran.err.splitlines() if "WARNING" in line and "stale" in line]
                p.record(
                    "staleness",
                    case,
                    "handled" if said else "silent loss",
                    f"exit 0, evaluate cached; said: {said[0]}"
                    if said
                    else "exit 0, 'evaluate: cached' and no word that status calls it stale",
                )
            else:
                v, detail = verdict(ran)
                p.record("staleness", case, v, detail + ("" if "teacher" in ran.err else "; names no teacher"))

        ran = p.run("status", "-c", str(precipe), "--json", timeout=120)
        row = _states(ran).get("pretrain", {})
        ok = row.get("state") == "stale" and any("init_from" in c for c in row.get("changed", []))
        p.record(
            "staleness",
            "status after pretrain.init_from's weights changed",
            "handled" if ok else ("silent loss" if ran.rc == 0 else verdict(ran)[0]),
            f"pretrain {row.get('state')} ({'; '.join(row.get('changed', []))[:160]})",
        )

        _plant(s.teacher, marker)  # beside the new model.safetensors, which is what is read
        ran = p.run("run", "-c", str(recipe), "--only", "distill,evaluate", timeout=1800)
        after = _states(p.run("status", "-c", str(recipe), "--json", timeout=120))
        retrained = sha256(root / "distill" / "model" / "model.safetensors") != student
        case = "the advised run --only distill,evaluate, a planted pytorch_model.bin beside the weights"
        if marker.exists():
            p.record("staleness", case, "code executed", f"the payload ran; exit {ran.rc}")
        elif ran.rc != 0:
            p.record("staleness", case, *verdict(ran))
        else:
            states = {k: after.get(k, {}).get("state") for k in ("distill", "evaluate")}
            ok = retrained and set(states.values()) == {"complete"}
            p.record(
                "staleness",
                case,
                "handled" if ok else "silent loss",
                f"student retrained: {retrained}; then {states}; {ran.seconds} s",
            )

        weights.unlink()  # only the pickle is left
        for case, args in (
            ("status with only a planted pytorch_model.bin", ("status", "--json")),
            (
                "run --only evaluate --force with only a planted pytorch_model.bin",
                ("run", "--only", "evaluate", "--force"),
            ),
            (
                "run --only distill,evaluate with only a planted pytorch_model.bin",
                ("run", "--only", "distill,evaluate"),
            ),
        ):
            ran = p.run(args[0], "-c", str(recipe), *args[1:], timeout=900)
            advice = "weights_only" in ran.err + ran.out
            if marker.exists():
                p.record("staleness", case, "code executed", f"the payload ran; exit {ran.rc}")
            elif args[0] == "status":
                row = _states(ran).get("distill", {})
                ok = (
                    ran.rc == 0
                    and row.get("state") not in ("complete", "stale")
                    and not advice
                    and "safetensors" in row.get("note", "")
                )
                p.record(
                    "staleness",
                    case,
                    "handled" if ok else "traceback" if ran.rc else "silent loss",
                    f"exit {ran.rc}; distill {row.get('state')}: {row.get('note', '')[:150]}",
                )
            elif ran.rc == 0:
                p.record(
                    "staleness",
                    case,
                    "silent loss",
                    f"the run succeeded without the teacher's weights; {ran.seconds} s",
                )
            else:
                v, detail = verdict(ran)
                if advice or "safetensors" not in ran.err:
                    v, detail = "traceback", "passes on weights_only or names no safetensors: " + detail
                p.record("staleness", case, v, detail)
    finally:
        weights.write_bytes(original)
        for leftover in (s.teacher / "pytorch_model.bin", marker):
            leftover.unlink(missing_ok=True)


# -- interrupts ---------------------------------------------------------------------------------


def _tree(pid: int) -> dict[int, tuple[float, str]]:
    """pid -> (start time, name) of every process below `pid`."""
    import psutil

    found = {}
    for child in descendants(pid):
        try:
            q = psutil.Process(child)
            found[child] = (q.create_time(), q.name())
        except psutil.NoSuchProcess:
            pass
    return found


def _alive(tree: dict[int, tuple[float, str]]) -> list[str]:
    """'name pid' of those still running (a zombie has let go of everything but its pid)."""
    import psutil

    found = []
    for pid, (created, name) in tree.items():
        try:
            q = psutil.Process(pid)
            if q.create_time() == created and q.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{name} {pid}")
        except psutil.NoSuchProcess:
            pass
    return found


def _interrupt(p: RunsProbe, recipe: Path, stage: str, sig: int, timeout: float = 1200):
    """Run `--only stage`; at its first progress line after the first checkpoint ask
    `status`, list the process tree, then send `sig` (SIGINT to the group, SIGKILL to the
    command alone). Returns (what ran, whether the signal was sent, seconds from it to the
    end, the status answer, the pid, and (the processes of the tree alive 5 s after the end,
    those alive 30 s after it, how many were listed))"""
    started = time.monotonic()
    process, out_path, err_path = p.start(["run", "-c", str(recipe), "--only", stage])
    sent, status, tree = None, None, {}
    trigger = f"{stage}: steps {CHECKPOINT_EVERY + 1}-{CHECKPOINT_EVERY + LOG_EVERY}/"
    while process.poll() is None and time.monotonic() - started < timeout:
        if trigger in err_path.read_text(errors="replace"):
            status = p.run("status", "-c", str(recipe), "--json", timeout=120)
            tree = _tree(process.pid)
            if process.poll() is None:
                os.killpg(process.pid, sig) if sig == signal.SIGINT else os.kill(process.pid, sig)
                sent = time.monotonic()
            break
        time.sleep(0.2)
    ended, late = None, ([], [], len(tree))
    while sent and process.poll() is None and time.monotonic() - sent < 120:
        time.sleep(0.1)
    if sent and process.poll() is not None:
        ended, gone = round(time.monotonic() - sent, 1), time.monotonic()
        time.sleep(max(0.0, 5 - (time.monotonic() - gone)))
        late = (_alive(tree), [], len(tree))
        while _alive(tree) and time.monotonic() - gone < 30:
            time.sleep(1)
        late = (late[0], _alive(tree), len(tree))
    ran = p.finish(
        process, out_path, err_path, timeout, started, {pid: created for pid, (created, _) in tree.items()}
    )  # ends what is left
    ran.peak = 0
    return ran, sent is not None, ended, status, process.pid, late


def _tensor_gap(a: Path, b: Path) -> str:
    from safetensors.torch import load_file

    x, y = load_file(a), load_file(b)
    if set(x) != set(y):
        return "different tensor names"
    return f"max |difference| {max(float((x[k] - y[k]).abs().max()) for k in x):.3g}"


def interrupts(p: RunsProbe, s: Setup) -> None:
    for stage in ("distill", "pretrain"):
        ref = s.reference(stage)
        want = ref / stage / "model" / "model.safetensors"
        for sig in (signal.SIGINT, signal.SIGKILL):
            case = f"{sig.name} during {stage}"
            if p.only_case and p.only_case not in case:
                continue
            root = p.workdir / f"killed-{stage}-{sig.name}"
            copy_root(ref, root, DATA)
            recipe = s.distill(root) if stage == "distill" else s.pretrain(root)
            ran, sent, ended, status, pid, (at5, at30, listed) = _interrupt(p, recipe, stage, sig)
            if not sent:
                print(
                    (
                        f"| interrupts | {case} | (not reached) | the run ended (exit {ran.rc}, {ran.seconds} s) "
                        "before its trigger line |"
                    ),
                    flush=True,
                )
                continue
            row = _states(status).get(stage, {}) if status is not None else {}
            shown = row.get("running") or {}
            p.record(
                "interrupts",
                f"status while {stage} trains ({sig.name} case)",
                "handled" if shown.get("pid") == pid else "traceback",
                f"{stage}: running (pid {shown.get('pid')}, host {shown.get('host')}, since {shown.get('since')})"
                if shown
                else f"{stage}: {row.get('state')} (the run's pid is {pid})",
            )
            verdicts, notes = [], [f"exit {ran.rc} {ended} s after the signal"]
            if sig == signal.SIGINT:
                lines = [x for x in ran.err.splitlines() if x.strip()]
                one_last = (
                    len(errors_of(ran)) == 1 and lines and lines[-1] == errors_of(ran)[0] and "Traceback" not in ran.err
                )
                if ended is None or ended > 60:
                    verdicts.append("hang")
                elif not (ran.rc == 130 and one_last and ended <= 10):
                    verdicts.append("traceback")
                notes.append(
                    f"one error line, last: {bool(one_last)}"
                    + (
                        f" ({errors_of(ran)[0][17:100]})"
                        if errors_of(ran)
                        else f"; last: {lines[-1][:120] if lines else ''}"
                    )
                )
            if at5:
                verdicts.append("escape")
                notes.append(
                    f"{len(at5)} processes of the run alive 5 s after it ended ({', '.join(at5[:6])}), "
                    f"{len(at30)} after 30 s"
                )
            else:
                notes.append(f"none of the {listed} processes listed before the signal alive 5 s after it ended")
            again = p.run("run", "-c", str(recipe), "--only", stage, timeout=1800)
            if again.rc != 0:
                verdicts.append(verdict(again)[0])
                notes.append(
                    f"rerun: {verdict(again)[1][:200]}"
                    + (" (refused by the dead run's lease)" if "in use by" in again.err else "")
                )
            else:
                got = root / stage / "model" / "model.safetensors"
                same = sha256(got) == sha256(want)
                verdicts.append("handled" if same else "silent loss")
                resumed = re.search(r"resuming from step \d+", again.err)
                notes.append(
                    f"rerun {again.seconds} s, {resumed.group(0) if resumed else 'from scratch'}: "
                    f"model.safetensors {'equals' if same else 'differs from'} the uninterrupted run's"
                    + ("" if same else f" ({_tensor_gap(got, want)})")
                )
            p.record("interrupts", case, worst(*verdicts), "; ".join(notes))


# -- failures inside Ray workers ----------------------------------------------------------------


def _forge(root: Path, stage: str, relative: str, data: bytes) -> None:
    """Write `data` as a shard and its manifest entry to match (a damaged shard that every
    integrity check passes: what only the reader finds)."""
    (root / stage / relative).write_bytes(data)
    path = root / stage / "_manifest.json"
    manifest = json.loads(path.read_text())
    entry = next(x for x in manifest["shards"] if x["path"] == relative)
    entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), stamp="")
    path.write_text(json.dumps(manifest))


def _ids_beyond(path: Path, shift: int) -> bytes:
    """The shard with every token id moved `shift` up: a shard made with a larger vocabulary."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import ipc

    table = ipc.open_file(pa.memory_map(str(path))).read_all()
    ids = table.column("input_ids").combine_chunks()
    moved = pa.ListArray.from_arrays(
        ids.offsets, pc.add(ids.flatten(), pa.scalar(shift, ids.type.value_type)).cast(ids.type.value_type)
    )
    table = table.set_column(table.schema.get_field_index("input_ids"), table.schema.field("input_ids"), moved)
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _first_shard(root: Path, split: str) -> str:
    manifest = json.loads((root / "examples" / "_manifest.json").read_text())
    return next(x["path"] for x in manifest["shards"] if f"/{split}/" in x["path"] and x["rows"])


def workers(p: RunsProbe, s: Setup) -> None:
    tasks = p.workdir / "worker-tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "four.tsv").write_text("sentence\tlabel\n" + "".join(f"a good film {i}\t{i % 2}\n" for i in range(4)))
    (tasks / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"a good film {i}\t{i % 2}\n" for i in range(20)))
    (tasks / "new-label.tsv").write_text("sentence\tlabel\n" + "".join(f"a fine film {i}\t{i % 3}\n" for i in range(9)))
    task = {
        "name": "probe",
        "type": "classification",
        "format": "tsv",
        "seeds": [1],
        "epochs": 1,
        "batch_size": 8,
        "max_seq_length": 32,
    }
    quiet = {"baseline": False, "intrinsic": {"enabled": False}, "embeddings": {"enabled": False}}
    cases = [
        (
            "distill: a train shard that is not Arrow (its manifest entry rewritten to match)",
            "distill",
            "train",
            b"not an arrow file\n" * 64,
            None,
        ),
        (
            "pretrain: a train shard that is not Arrow (its manifest entry rewritten to match)",
            "pretrain",
            "train",
            b"not an arrow file\n" * 64,
            None,
        ),
        ("distill: a train shard whose token ids exceed the vocabulary", "distill", "train", "ids", None),
        (
            "evaluate: a validation shard that is not Arrow, read by the intrinsic job",
            "evaluate",
            "validation",
            b"not an arrow file\n" * 64,
            {"baseline": False, "intrinsic": {"max_batches": 2, "fill_mask": 0}, "embeddings": {"enabled": False}},
        ),
        (
            "evaluate: 5 folds of a 4-line train file",
            "evaluate",
            None,
            None,
            {**quiet, "tasks": [{**task, "train": str(tasks / "four.tsv"), "cross_validation_folds": 5}]},
        ),
        (
            "evaluate: a validation file with a label the train file lacks",
            "evaluate",
            None,
            None,
            {
                **quiet,
                "tasks": [{**task, "train": str(tasks / "train.tsv"), "validation": str(tasks / "new-label.tsv")}],
            },
        ),
    ]
    for case, stage, split, data, evaluate in cases:
        if p.only_case and p.only_case not in case:
            continue
        kind = "distill" if stage == "distill" else "pretrain"
        ref = s.reference(kind)
        root = p.workdir / "worker-root"
        copy_root(ref, root, DATA + (("pretrain",) if stage == "evaluate" else ()))
        named = None
        if split is not None:
            relative = _first_shard(root, split)
            _forge(
                root, "examples", relative, _ids_beyond(root / "examples" / relative, 3000) if data == "ids" else data
            )
            named = Path(relative).name
        recipe = s.distill(root) if kind == "distill" else s.pretrain(root, evaluate)
        ran = p.run("run", "-c", str(recipe), "--only", stage, timeout=1200)
        if ran.rc == 0:
            p.record(
                "workers",
                case,
                "silent loss",
                f"the run succeeded on a file that should have stopped it; {ran.seconds} s",
            )
            continue
        v, detail = verdict(ran)
        line = errors_of(ran)[-1] if errors_of(ran) else ""
        named = named or next((f.name for f in tasks.iterdir() if f.name in line), None)
        logs = sorted((root / ("eval" if stage == "evaluate" else stage) / "_logs").glob("*"))
        checks = [f"names the stage: {f'{stage}:' in line}", f"the file: {bool(named and named in line)}"]
        if stage != "evaluate":
            checks.append(f"the rank: {'rank' in line}")
        checks.append(f"traceback in {stage}/_logs: {any('Traceback' in f.read_text(errors='replace') for f in logs)}")
        p.record("workers", case, v, detail + "; " + ", ".join(checks))


def main() -> None:
    p, group_filter, args, started = begin(
        __doc__,
        "bertpipe-runs-",
        RunsProbe,
        "groups (staleness, interrupts, workers) holding this; 'group:case' also filters cases",
    )
    workdir = p.workdir
    setup = Setup(p)
    for group in (staleness, interrupts, workers):
        if group_filter and group_filter not in group.__name__:
            continue
        try:
            group(p, setup)
        except Exception as exc:  # noqa: BLE001 - the probe itself failed: say so and go on
            print(f"| probe | {group.__name__} | (probe failed) | {type(exc).__name__}: {exc} |"[:400], flush=True)
    if p.ray_retries:
        print(f"(runs repeated because Ray did not start within its 30 s on this machine: {p.ray_retries})")
    finish(p.rows, VERDICTS, started, workdir, keep=args.keep or bool(args.workdir))


if __name__ == "__main__":
    main()
