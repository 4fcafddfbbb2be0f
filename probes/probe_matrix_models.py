"""Issue 26's adversarial matrix (model folders, export targets, evaluate task files), as a
script (not part of the pytest suite). Each case runs `bertpipe` in a child process, polls
the RSS of its process tree every 0.5 s, and gets one verdict:

  clear error    exit 2, exactly one `bertpipe: error:` line, the last non-empty line of stderr, no traceback
  handled        correct completion, nothing lost
  traceback      Traceback text anywhere, the error line not last, or an unexpected exit
  hang           no answer within the case's timeout
  silent loss    success while data was overwritten/lost, or a wrong result with no word
  code executed  a planted pickle payload ran
  escape         a file outside where it may write changed, or a process tree over 3 GiB ("memory bomb")

    nice python probes/probe_matrix_models.py [--workdir DIR] [--only SUBSTRING] [--keep]

Covered so far: export targets, model folders as distill.teacher and pretrain.init_from (preflight refusals),
evaluate task files. Not yet written: staleness, interrupts, worker-side failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_matrix import Probe, begin, copy_root, finish, reference_run, tiny_recipe

VERDICTS = ("clear error", "handled", "traceback", "hang", "silent loss", "code executed", "escape")
BOMB = 3 << 30


class ModelProbe(Probe):
    def record(self, group, case, verdict, detail):
        assert verdict in VERDICTS, verdict
        self.rows.append((group, case, verdict, detail))
        print(f"| {group} | {case} | {verdict} | {detail} |", flush=True)

    def run(self, *args, env=None, timeout=300.0):
        import psutil

        started = time.monotonic()
        process, out_path, err_path = self.start(list(args), env)
        peak = [0]
        stop = threading.Event()

        def poll():
            while not stop.is_set():
                try:
                    tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
                    total = 0
                    for q in tree:
                        try:
                            total += q.memory_info().rss
                        except psutil.NoSuchProcess:
                            pass
                    peak[0] = max(peak[0], total)
                except psutil.NoSuchProcess:
                    return
                time.sleep(0.5)

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        ran = self.finish(process, out_path, err_path, timeout, started)
        stop.set()
        thread.join()
        ran.peak = peak[0]
        return ran


def verdict_of(ran, bomb: int = BOMB) -> tuple[str, str]:
    mem = f"; peak RSS {ran.peak / 2**20:.0f} MiB; {ran.seconds} s"
    if ran.peak > bomb:
        return "escape", f"memory bomb: {ran.peak / 2**30:.1f} GiB" + mem
    if ran.timed_out:
        return "hang", f"no answer in {ran.seconds:.0f} s" + mem
    lines = [x for x in ran.err.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("bertpipe: error:")]
    if "Traceback" in ran.err or "Traceback" in ran.out:
        return "traceback", f"exit {ran.rc}: {' / '.join(lines[-2:])[:200]}" + mem
    if ran.rc == 2 and len(errors) == 1 and lines[-1] == errors[0]:
        return "clear error", errors[0][17:][:220] + mem
    return "traceback", f"exit {ran.rc}, {len(errors)} error lines, last: {(lines[-1] if lines else '')[:200]}" + mem


def tree_hash(folder: Path) -> dict[str, str]:
    if not folder.exists():
        return {}
    if folder.is_file():
        return {"": hashlib.sha256(folder.read_bytes()).hexdigest()}
    return {
        str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(folder.rglob("*"))
        if f.is_file() and not f.is_symlink()
    }


# -- export targets ----------------------------------------------------------------------------


def exports(p: ModelProbe, ref: Path) -> None:
    recipe = p.workdir / "reference.yaml"
    other = p.workdir / "other-root"
    if not other.exists():
        copy_root(ref, other, ("corpus",))
    alien = p.workdir / "alien-model"
    alien.mkdir(exist_ok=True)
    (alien / "config.json").write_text('{"mine": 1}')
    (alien / "model.int8.onnx").write_bytes(b"user's own model")
    (alien / "_manifest.json").write_text('{"stage": "somebody-else", "shards": []}')
    forged = p.workdir / "forged-model"
    forged.mkdir(exist_ok=True)
    (forged / "config.json").write_text('{"mine": 1}')
    (forged / "model.int8.onnx").write_bytes(b"user's own model")
    (forged / "_manifest.json").write_text('{"stage": "export-onnx", "shards": []}')
    afile = p.workdir / "a-file.txt"
    afile.write_text("keep me\n")
    link = p.workdir / "link-to-pretrain"
    if not os.path.lexists(link):
        os.symlink(ref / "pretrain", link)
    new = p.workdir / "export-new"
    shutil.rmtree(new, ignore_errors=True)
    cases = [
        ("--out R/pretrain", ref / "pretrain", ref / "pretrain", False),
        ("--out R/pretrain/model-mlm", ref / "pretrain" / "model-mlm", ref / "pretrain", False),
        ("--out R/eval", ref / "eval", ref / "eval", False),
        ("--out R (the run root)", ref, ref, False),
        ("--out R/../other-root/corpus", Path(f"{ref}/../other-root/corpus"), other, False),
        ("--out a user's folder with config.json, model.int8.onnx, a foreign _manifest.json", alien, alien, False),
        ("--out a user's folder whose _manifest.json forges stage export-onnx", forged, forged, False),
        ("--out an existing file", afile, afile, False),
        ("--out a symlink to R/pretrain", link, ref / "pretrain", False),
        ("--out R/pretrain/../vocab (.. into a stage dir)", Path(f"{ref}/pretrain/../vocab"), ref / "vocab", False),
        ("--out a new folder", new, None, True),
    ]
    for case, out, watch, should_work in cases:
        before = tree_hash(watch) if watch else {}
        ran = p.run("export", "--format", "onnx", "--out", str(out), "-c", str(recipe), timeout=300)
        after = tree_hash(watch) if watch else {}
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if changed and not should_work:
            p.record("export", case, "escape", f"exit {ran.rc}; changed: {changed[:4]}; {ran.seconds} s")
        elif should_work:
            ok = ran.rc == 0 and (new / "model.onnx").exists()
            p.record(
                "export",
                case,
                "handled" if ok else verdict_of(ran)[0],
                f"exit {ran.rc}, files {sorted(tree_hash(new))[:8]}; {ran.seconds} s",
            )
        elif ran.rc == 0:
            p.record("export", case, "silent loss", f"export succeeded into {out}; {ran.seconds} s")
        else:
            v, d = verdict_of(ran)
            if case == "--out an existing file" and ran.seconds > 15:
                d += " (slow: not refused at once)"
            p.record("export", case, v, d)
    # re-export into the same folder with a user's extra file
    if (new / "_manifest.json").exists():
        (new / "my-notes.txt").write_text("the user's\n")
        old = tree_hash(new)
        ran = p.run("export", "--format", "onnx", "--out", str(new), "-c", str(recipe), timeout=300)
        kept = (new / "my-notes.txt").exists() and (new / "my-notes.txt").read_text() == "the user's\n"
        replaced = (new / "_manifest.json").exists() and tree_hash(new).get("_manifest.json") != old.get(
            "_manifest.json"
        )
        verdict = (
            "handled" if ran.rc == 0 and kept and replaced else ("silent loss" if ran.rc == 0 else verdict_of(ran)[0])
        )
        p.record(
            "export",
            "re-export into that folder with a user's extra file",
            verdict,
            f"exit {ran.rc}; user's file kept: {kept}; manifest rewritten: {replaced}; {ran.seconds} s",
        )
    q = p.workdir / "export-int8"
    shutil.rmtree(q, ignore_errors=True)
    ran = p.run("export", "--format", "onnx", "--quantize", "int8", "--out", str(q), "-c", str(recipe), timeout=400)
    ok = ran.rc == 0 and (q / "model.int8.onnx").exists()
    p.record(
        "export",
        "--quantize int8 into a new folder",
        "handled" if ok else verdict_of(ran)[0],
        f"exit {ran.rc}; {sorted(tree_hash(q))}; {ran.seconds} s" if ok else verdict_of(ran)[1],
    )


# -- model folders ----------------------------------------------------------------------------


def _config_edit(**changes):
    def make(folder: Path):
        data = json.loads((folder / "config.json").read_text())
        data.update(changes)
        (folder / "config.json").write_text(json.dumps(data))

    return make


def _write(name, data):
    def make(folder: Path):
        (folder / name).write_bytes(data)

    return make


def _big_config(folder: Path):
    with open(folder / "config.json", "w") as handle:
        handle.write('{"pad": "')
        chunk = "x" * (1 << 20)
        for _ in range(200):
            handle.write(chunk)
        handle.write('"}')


def _header(folder: Path, header: dict, extra: int = 0):
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * extra)


def _offsets_beyond(folder: Path):
    _header(
        folder,
        {"bert.embeddings.word_embeddings.weight": {"dtype": "F32", "shape": [1000, 128], "data_offsets": [0, 512000]}},
        16,
    )


def _bad_shapes(folder: Path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    key = next(k for k in tensors if k.endswith("word_embeddings.weight"))
    tensors[key] = tensors[key][:500].clone()
    save_file(tensors, folder / "model.safetensors")


def _truncate(folder: Path):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


class _Planted:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def _bin_only(folder: Path):
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def _bin_payload(marker):
    def make(folder: Path):
        import torch

        torch.save({"bert.embeddings.word_embeddings.weight": _Planted(str(marker))}, folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()

    return make


def _fifo(folder: Path):
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")


def _symlink_out(p):
    def make(folder: Path):
        outside = p.workdir / "outside-weights.safetensors"
        shutil.copy(folder / "model.safetensors", outside)
        (folder / "model.safetensors").unlink()
        os.symlink(outside, folder / "model.safetensors")

    return make


def model_folders(p: ModelProbe, ref: Path) -> None:
    source = ref / "pretrain" / "model-mlm"
    marker = p.workdir / "the-payload-ran"
    cases = [
        ("num_hidden_layers 100000", _config_edit(num_hidden_layers=100000)),
        ("hidden_size 10000008", _config_edit(hidden_size=10000008)),
        ("num_attention_heads 0", _config_edit(num_attention_heads=0)),
        ("hidden_size not divisible by heads", _config_edit(num_attention_heads=3)),
        ("vocab_size 10**10", _config_edit(vocab_size=10**10)),
        ("max_position_embeddings 10**9", _config_edit(max_position_embeddings=10**9)),
        ("intermediate_size 10**9", _config_edit(intermediate_size=10**9)),
        ("config.json not JSON", _write("config.json", b"{not json")),
        ("config.json a JSON list", _write("config.json", b"[1, 2]")),
        ("config.json of 200 MB", _big_config),
        ("no config.json", lambda f: (f / "config.json").unlink()),
        ("no weights file", lambda f: (f / "model.safetensors").unlink()),
        ("model.safetensors truncated", _truncate),
        (
            "safetensors header length 2**60",
            lambda f: (f / "model.safetensors").write_bytes(struct.pack("<Q", 2**60) + b"{}"),
        ),
        ("safetensors header offsets beyond the file", _offsets_beyond),
        ("safetensors shapes not matching config.json", _bad_shapes),
        ("pytorch_model.bin only (real weights)", _bin_only),
        ("pytorch_model.bin with a pickle payload", _bin_payload(marker)),
        ("model.safetensors is a FIFO", _fifo),
        ("folder path is a regular file", None),
        ("folder does not exist", None),
    ]
    for key in ("distill.teacher", "pretrain.init_from"):
        for case, make in cases:
            if p.only_case and p.only_case not in case:
                continue
            folder = p.workdir / "models" / f"{key}-{case}".replace(" ", "_").replace("*", "")
            if folder.is_dir() and not folder.is_symlink():
                shutil.rmtree(folder)
            elif os.path.lexists(folder):
                folder.unlink()
            folder.parent.mkdir(parents=True, exist_ok=True)
            if case == "folder path is a regular file":
                folder.write_text("not a folder\n")
            elif case != "folder does not exist":
                shutil.copytree(source, folder)
                make(folder)
            root = p.workdir / "mf-root"
            copy_root(ref, root, ("corpus",))
            data = tiny_recipe(root)
            data["vocab"] = {"source": "pretrained"}
            if key == "distill.teacher":
                data["distill"] = {
                    "enabled": True,
                    "teacher": str(folder),
                    "student": {"num_hidden_layers": 1},
                    "num_workers": 1,
                    "phases": [{"name": "seq64", "steps": 2, "batch_size": 8}],
                    "loss": {"soft_targets": 0.0, "hidden": 1.0, "mlm": 0.1},
                }
                only = "vocab,examples,distill"
            else:
                data["pretrain"]["init_from"] = str(folder)
                only = "vocab,examples,pretrain"
            if marker.exists():
                marker.unlink()
            ran = p.run("run", "-c", str(p.recipe("mf", data)), "--only", only, timeout=120)
            pre = not (root / "vocab" / "_manifest.json").exists()
            if marker.exists():
                p.record(key, case, "code executed", f"the payload ran; exit {ran.rc}")
            elif ran.rc == 0:
                p.record(key, case, "silent loss", f"the run succeeded on a hostile folder; {ran.seconds} s")
            else:
                v, d = verdict_of(ran)
                if "pytorch_model.bin only" in case and ("weights_only" in ran.err or "safetensors" not in ran.err):
                    v, d = "traceback", "message names weights_only or lacks safetensors: " + d
                p.record(key, case, v, d + f"; preflight (before vocab): {pre}")


# -- evaluate task files ------------------------------------------------------------------------


def task_files(p: ModelProbe, ref: Path) -> None:
    d = p.workdir / "tasks"
    d.mkdir(exist_ok=True)
    (d / "empty.tsv").write_text("")
    (d / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"good film number {i}\t{i % 2}\n" for i in range(20)))
    (d / "empty.conll").write_text("")
    (d / "squad-empty.json").write_text('{"data": []}')
    (d / "squad-bad.json").write_text("not json at all {")
    (d / "empty.ft").write_text("")
    (d / "dir").mkdir(exist_ok=True)
    (d / "cols.tsv").write_text("sentence\tlabel\n" + "".join(f"a b c {i}\n" for i in range(10)))
    (d / "sts.tsv").write_text("sentence1\tsentence2\tscore\n" + "".join(f"a {i}\tb {i}\thigh\n" for i in range(10)))
    (d / "garbage.bin").write_bytes(os.urandom(4096))
    (d / "oneclass.ft").write_text("".join(f"__label__pos good film {i}\n" for i in range(20)))
    base = {"seeds": [1], "epochs": 1, "batch_size": 8, "max_seq_length": 32}
    cases = [
        (
            "empty validation TSV",
            {
                "type": "classification",
                "format": "tsv",
                "train": str(d / "train.tsv"),
                "validation": str(d / "empty.tsv"),
            },
            "empty.tsv",
        ),
        (
            "empty CoNLL file",
            {
                "type": "token_classification",
                "format": "conll",
                "train": str(d / "empty.conll"),
                "cross_validation_folds": 2,
            },
            "empty.conll",
        ),
        (
            'SQuAD {"data": []}',
            {
                "type": "qa",
                "format": "squad",
                "train": str(d / "squad-empty.json"),
                "cross_validation_folds": 2,
                "max_seq_length": 128,
            },
            "squad-empty.json",
        ),
        (
            "SQuAD file not JSON",
            {
                "type": "qa",
                "format": "squad",
                "train": str(d / "squad-bad.json"),
                "cross_validation_folds": 2,
                "max_seq_length": 128,
            },
            "squad-bad.json",
        ),
        (
            "empty fastText train file",
            {"type": "classification", "format": "fasttext", "train": str(d / "empty.ft"), "cross_validation_folds": 2},
            "empty.ft",
        ),
        (
            "task file does not exist",
            {"type": "classification", "format": "tsv", "train": str(d / "nope.tsv"), "cross_validation_folds": 2},
            "nope.tsv",
        ),
        (
            "task path is a directory",
            {"type": "classification", "format": "tsv", "train": str(d / "dir"), "cross_validation_folds": 2},
            "dir",
        ),
        (
            "TSV with the wrong number of columns",
            {"type": "classification", "format": "tsv", "train": str(d / "cols.tsv"), "cross_validation_folds": 2},
            "cols.tsv",
        ),
        (
            "STS file with non-numeric scores",
            {
                "type": "regression",
                "format": "tsv",
                "text_a": "sentence1",
                "text_b": "sentence2",
                "label_column": "score",
                "train": str(d / "sts.tsv"),
                "cross_validation_folds": 2,
            },
            "sts.tsv",
        ),
        (
            "binary garbage file",
            {"type": "classification", "format": "tsv", "train": str(d / "garbage.bin"), "cross_validation_folds": 2},
            "garbage.bin",
        ),
        (
            "labels all one class",
            {
                "type": "classification",
                "format": "fasttext",
                "train": str(d / "oneclass.ft"),
                "cross_validation_folds": 2,
            },
            "oneclass.ft",
        ),
    ]
    for case, task, name in cases:
        if p.only_case and p.only_case not in case:
            continue
        root = p.workdir / "eval-root"
        copy_root(ref, root, ("corpus", "vocab", "examples", "pretrain"))
        data = tiny_recipe(root)
        data["evaluate"]["tasks"] = [{"name": "probe", **base, **task}]
        ran = p.run("run", "-c", str(p.recipe("task", data)), "--only", "evaluate", timeout=300)
        if ran.rc == 0:
            p.record("task files", case, "silent loss", f"evaluate succeeded; {ran.seconds} s")
            continue
        v, dd = verdict_of(ran)
        named = name in ran.err
        tuned = (root / "eval" / "_progress").exists() and any((root / "eval" / "_progress").iterdir())
        p.record("task files", case, v, dd + f"; names the file: {named}; fine-tuning started: {tuned}")


def main() -> None:
    p, group_filter, args, started = begin(
        __doc__, "bertpipe-models-", ModelProbe, "groups (function names) holding this; 'group:case' also filters cases"
    )
    workdir = p.workdir
    ref = workdir / "reference"
    if not (ref / "eval" / "_manifest.json").exists():
        ref = reference_run(p)
        if ref is None:
            sys.exit(1)
    for group in (exports, model_folders, task_files):
        if group_filter and group_filter not in group.__name__:
            continue
        try:
            group(p, ref)
        except Exception as exc:  # noqa: BLE001 - the probe itself failed: say so and go on
            print(f"| probe | {group.__name__} | (probe failed) | {type(exc).__name__}: {exc} |"[:300], flush=True)
    finish(p.rows, VERDICTS, started, workdir, keep=args.keep or bool(args.workdir))


if __name__ == "__main__":
    main()
