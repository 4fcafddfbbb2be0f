"""`bertpipe inspect STAGE`: what a stage produced, read from its complete output through
its manifest (pipelines/stage.py) and shared shard I/O (pipelines/shards.py), without Ray.

Each stage has one function returning a JSON-able dict (`--json` prints it) and one that
renders it as lines for people:

- corpus:   documents of a split with their sentences, or (`--dropped FILTER`) samples of
            what a filter or drop reason removed;
- vocab:    size, alphabet, special tokens, the most frequent and the longest pieces, and
            how a given text tokenizes (`--text`);
- examples: sequences decoded to text with [MASK]ed, replaced and kept positions marked,
            the segment boundary and the next-sentence label, like Google's example dump;
- pretrain: the complete checkpoints with their step, loss and size, and the model folder;
- evaluate: the metrics table (pretrained against random init).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bertcore import figures
from bertcore.errors import ConfigError
from bertcore.eval.scores import score_rows
from bertcore.examples.decode import LEGEND, NSP_LABELS, decode_example
from bertcore.model.hf_files import MLM_SUFFIX, MODEL_DIR
from bertcore.train import metrics_log
from bertcore.train.checkpoint import CHECKPOINTS, COMPLETE
from bertcore.train.metrics_log import METRICS
from bertcore.vocab.config import BPE_SPECIAL_TOKENS, tokenizer_files
from bertcore.vocab.tokenizer import PREFIX, SPECIAL_TOKENS, UNK, load_tokenizer, vocab_list
from pipelines.progress import count, duration, size
from pipelines.registry import REGISTRY
from pipelines.shards import local_folder, read_batches
from pipelines.stage import UpstreamMissing
from pipelines.stage_dir import Manifest, StageDir
from pipelines.storage import Storage

SENTENCES_SHOWN = 8
"""Sentences of a document shown as text (`--json` has them all)."""


@dataclass
class Options:
    n: int = 3
    split: str = "train"
    phase: str | None = None
    text: str | None = None
    dropped: str | None = None


def stage_dir(storage: Storage, root: str, name: str) -> tuple[StageDir, Manifest]:
    """A stage's directory and manifest; UpstreamMissing (one line) when it is not complete."""
    if name not in REGISTRY:
        raise ConfigError(f"unknown stage {name!r}; stages are: {', '.join(REGISTRY)}")
    directory = StageDir(storage, root, REGISTRY[name].directory)
    manifest = directory.manifest()
    if manifest is None:
        raise UpstreamMissing(
            f"the {name} stage has no complete output under {directory.uri}: run `bertpipe run --only {name}` first"
        )
    return directory, manifest


def _rows(directory: StageDir, manifest: Manifest, prefix: str, n: int) -> tuple[list[tuple[str, int, dict]], int]:
    """Up to `n` records (shard path, row, record) of the shards under `prefix`, in shard
    order, reading record batches only until there are enough; and the rows there in all."""
    shards = [s for s in manifest.shards_under(prefix) if s.rows]
    found: list[tuple[str, int, dict]] = []
    for shard in shards:
        if len(found) >= n:
            break
        row = 0
        for batch in read_batches(directory.storage, directory.path(shard.path)):
            for record in batch.slice(0, n - len(found)).to_pylist():
                found.append((shard.path, row, record))
                row += 1
            if len(found) >= n:
                break
    return found, sum(s.rows for s in shards)


# -- corpus -------------------------------------------------------------------------------------


def corpus(directory: StageDir, manifest: Manifest, opts: Options, root: str) -> dict[str, Any]:
    if opts.dropped is not None:
        return corpus_dropped(manifest, opts, directory.uri)
    found, total = _rows(directory, manifest, f"{opts.split}/", opts.n)
    return {
        "stage": "corpus",
        "uri": directory.uri,
        "split": opts.split,
        "documents_in_split": total,
        "splits": {k: v.get("documents") for k, v in manifest.stats.get("splits", {}).items()},
        "documents": [{"shard": path, "row": row, **record} for path, row, record in found],
    }


def corpus_dropped(manifest: Manifest, opts: Options, uri: str) -> dict[str, Any]:
    """Samples of what one filter removed, as the stage kept them (the same whatever the
    number of workers: pipelines/stages/corpus/dropped.py)."""
    samples = manifest.stats.get("dropped_samples", {})
    filters = manifest.stats.get("filters", {})
    if opts.dropped not in samples:
        known = (
            ", ".join(sorted(samples)) or "none (this corpus was made before samples were kept, or nothing was dropped)"
        )
        raise ConfigError(
            f"--dropped {opts.dropped}: no samples of that filter under {uri}; filters with samples: {known}"
        )
    return {
        "stage": "corpus",
        "uri": uri,
        "filter": opts.dropped,
        "counts": filters.get(opts.dropped, {}),
        "samples": [{k: v for k, v in s.items() if k not in ("rank", "file")} for s in samples[opts.dropped][: opts.n]],
    }


def render_corpus(data: dict[str, Any]) -> list[str]:
    if "filter" in data:
        c = data["counts"]
        lines = [
            (
                f"corpus: {data['filter']} dropped {count(c.get('documents', 0))} documents and removed "
                f"{count(c.get('lines', 0))} lines "
                f"({count(c.get('characters', 0))} characters) under {data['uri']}; {len(data['samples'])} samples:"
            )
        ]
        if c.get("rules"):
            lines.append(
                "rules: "
                + ", ".join(f"{rule} {count(n)}" for rule, n in sorted(c["rules"].items(), key=lambda r: -r[1]))
            )
        for i, sample in enumerate(data["samples"], 1):
            why = f"{sample['rule']}: {sample['detail']}" if sample["detail"] else sample["rule"] or data["filter"]
            lines.append(f"[{i}] {sample['url'] or sample['title']}  (doc {sample['doc_id']}; {why})")
            lines.extend(f"    {line}" for line in sample["text"].splitlines()[:SENTENCES_SHOWN])
        return lines
    splits = ", ".join(f"{k} {count(v)}" for k, v in data["splits"].items())
    lines = [f"corpus: {splits} documents under {data['uri']}; the first {len(data['documents'])} of {data['split']}:"]
    for i, doc in enumerate(data["documents"], 1):
        sentences = doc["sentences"]
        lines.append(
            f"[{i}] {doc['title'] or '(untitled)'}  ({doc['source']}, doc {doc['doc_id']}, {len(sentences)} "
            f"sentences, {doc['shard']} row {doc['row']})"
        )
        lines.extend(f"    {k:>3}  {s}" for k, s in enumerate(sentences[:SENTENCES_SHOWN], 1))
        if len(sentences) > SENTENCES_SHOWN:
            lines.append(f"         … {len(sentences) - SENTENCES_SHOWN} more sentences (--json shows all)")
    return lines


# -- vocab --------------------------------------------------------------------------------------


def _tokenizer(directory: StageDir, manifest: Manifest):
    files = tokenizer_files(s.path for s in manifest.shards)  # WordPiece's or byte-level BPE's
    return load_tokenizer(local_folder(directory.storage, directory.uri, files, f"inspect-{manifest.fingerprint}"))


def vocab(directory: StageDir, manifest: Manifest, opts: Options, root: str) -> dict[str, Any]:
    tokenizer = _tokenizer(directory, manifest)
    pieces = vocab_list(tokenizer)
    specials = {*SPECIAL_TOKENS, *BPE_SPECIAL_TOKENS}
    learned = [p for p in pieces if p not in specials and not p.startswith("[unused")]
    stats = manifest.stats
    data: dict[str, Any] = {
        "stage": "vocab",
        "uri": directory.uri,
        "vocab_size": len(pieces),
        "special_tokens": [p for p in pieces if p in specials],
        "alphabet": sorted(p for p in learned if len(p) == 1),
        "continuations": sum(p.startswith(PREFIX) for p in learned),
        "top_pieces": stats.get("top_pieces", []),
        "longest_pieces": sorted(learned, key=lambda p: (-len(p.removeprefix(PREFIX)), p))[: max(opts.n, 10)],
        "held_out": {k: stats.get(k) for k in ("unk_rate", "pieces_per_word", "vocab_used_fraction", "sentences")},
    }
    if opts.text is not None:
        encoding = tokenizer.encode(opts.text, add_special_tokens=False)
        data["text"] = {
            "input": opts.text,
            "pieces": encoding.tokens,
            "ids": encoding.ids,
            "unk": encoding.tokens.count(UNK),
        }
    return data


def render_vocab(data: dict[str, Any]) -> list[str]:
    held = data["held_out"]
    lines = [
        (
            f"vocab: {count(data['vocab_size'])} entries under {data['uri']} ({count(data['continuations'])} ## "
            "continuations)"
        ),
        f"special tokens: {' '.join(data['special_tokens'])}",
        f"alphabet ({len(data['alphabet'])} characters): {''.join(data['alphabet'])[:160]}",
    ]
    if held.get("unk_rate") is not None:
        lines.append(
            f"on {count(held['sentences'] or 0)} held-out sentences: [UNK] {held['unk_rate']:.2%} of pieces, "
            f"{held['pieces_per_word']:.2f} pieces per word, {held['vocab_used_fraction']:.0%} of the vocabulary used"
        )
    if data["top_pieces"]:
        lines.append("most frequent there: " + "  ".join(f"{p} ({count(n)})" for p, n in data["top_pieces"][:15]))
    lines.append("longest pieces: " + "  ".join(data["longest_pieces"]))
    if "text" in data:
        text = data["text"]
        lines.append(f"{text['input']!r} -> {len(text['pieces'])} pieces, {text['unk']} [UNK]:")
        lines.append("    " + " ".join(text["pieces"]))
        lines.append("    " + " ".join(map(str, text["ids"])))
    return lines


# -- examples -----------------------------------------------------------------------------------


def examples(directory: StageDir, manifest: Manifest, opts: Options, root: str) -> dict[str, Any]:
    phases = [p["name"] for p in manifest.config.get("phases", [])]
    phase = opts.phase or phases[0]
    if phase not in phases:
        raise ConfigError(f"--phase {phase}: the examples stage made phases {', '.join(phases)}")
    vocab_dir, vocab_manifest = stage_dir(directory.storage, root, "vocab")
    if vocab_manifest.fingerprint != manifest.inputs.get("vocab"):
        raise UpstreamMissing(
            f"{vocab_dir.uri} holds another vocabulary than the one {directory.uri} was made with; "
            "run `bertpipe run --from vocab` to make them agree"
        )
    pieces = vocab_list(_tokenizer(vocab_dir, vocab_manifest))
    found, total = _rows(directory, manifest, f"{phase}/{opts.split}/", opts.n)
    decoded = []
    for path, row, record in found:
        example = decode_example(record, pieces)
        decoded.append(
            {"shard": path, "row": row, "length": record["length"], **example.to_json(), "_lines": example.render()}
        )
    return {
        "stage": "examples",
        "uri": directory.uri,
        "phase": phase,
        "split": opts.split,
        "objective": manifest.config.get("objective"),
        "masking": manifest.config.get("masking"),
        "sequences_in_split": total,
        "examples": decoded,
    }


def render_examples(data: dict[str, Any]) -> list[str]:
    lines = [
        (
            f"examples: {count(data['sequences_in_split'])} sequences in {data['phase']}/{data['split']} "
            f"({data['objective']}, {data['masking']} masking); the first {len(data['examples'])}:"
        ),
        LEGEND,
    ]
    for i, ex in enumerate(data["examples"], 1):
        label = ex["next_sentence_label"]
        lines.append(
            f"[{i}] {ex['shard']} row {ex['row']} · {ex['length']} tokens · segment B from token "
            f"{ex['segment_b_start']} · NSP label {label} ({NSP_LABELS.get(label, '?')})"
        )
        lines.extend(ex["_lines"])
    return lines


# -- pretrain, distill: a training stage --------------------------------------------------------


def pretrain(directory: StageDir, manifest: Manifest, opts: Options, root: str) -> dict[str, Any]:
    """A training stage's checkpoints, final figures and model folders (pretrain's, or distill's student)."""
    storage = directory.storage
    records: list[dict] = []
    if storage.exists(directory.path(METRICS)):
        for line in storage.read_text(directory.path(METRICS)).splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                records.append(record)
    records.sort(key=lambda r: r["step"])
    every = int(manifest.config.get("log_every") or 1)
    checkpoints = []
    for tag in storage.listdir(directory.path(CHECKPOINTS)):
        folder = directory.path(f"{CHECKPOINTS}/{tag}")
        if not storage.exists(f"{folder}/{COMPLETE}"):
            continue
        marker = storage.read_json(f"{folder}/{COMPLETE}")
        fs, path = storage.fs(folder)
        interval = metrics_log.at_step(records, marker["step"], every) or {}
        checkpoints.append(
            {
                "tag": tag,
                "step": marker["step"],
                "phase": marker.get("phase"),
                "loss": interval.get("loss"),
                "mlm_accuracy": interval.get("mlm_accuracy"),
                "interval": metrics_log.steps_text(interval) if interval else None,
                "tokens_seen": marker.get("tokens_seen"),
                "train_time_s": marker.get("train_time_s"),
                "bytes": fs.du(path, total=True),
                "stopped_by": marker.get("stopped_by"),
                "written_at": marker.get("written_at"),
            }
        )
    models = {
        folder: {
            "uri": directory.path(folder),
            "files": [
                {"file": s.path.removeprefix(f"{folder}/"), "bytes": s.bytes}
                for s in manifest.shards_under(f"{folder}/")
            ],
        }
        for folder in (MODEL_DIR, MODEL_DIR + MLM_SUFFIX)
    }
    stats = manifest.stats
    return {
        "stage": directory.directory,
        "uri": directory.uri,
        "steps": stats.get("steps"),
        "log_every": every,
        "final": metrics_log.final(records, every) if records else stats.get("final"),
        "validation": stats.get("validation"),
        "loss_jumps": stats.get("loss_jumps") or [],
        "checkpoints": sorted(checkpoints, key=lambda c: c["step"]),
        "model": models[MODEL_DIR],
        "model_mlm": models[MODEL_DIR + MLM_SUFFIX] if models[MODEL_DIR + MLM_SUFFIX]["files"] else None,
    }


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A plain fixed-width table; numbers and text left as given."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip()] + [fmt.format(*r).rstrip() for r in rows]


def render_pretrain(data: dict[str, Any]) -> list[str]:
    final, validation = data["final"] or {}, data["validation"] or {}
    lines = [
        (
            f"{data['stage']}: {data['steps']} steps under {data['uri']}; training figures are means over "
            f"intervals of {data['log_every']} steps"
        )
    ]
    if final:
        lines.append(
            f"final training figures ({metrics_log.steps_text(final)}): loss {figures.loss(final.get('loss'))}, "
            f"MLM accuracy {figures.percent(final.get('mlm_accuracy'))}"
        )
    if validation:
        lines.append(
            f"validation at step {validation.get('step')} ({count(validation.get('sequences') or 0)} held-out "
            f"sequences): loss {figures.loss(validation.get('loss'))}, MLM accuracy "
            f"{figures.percent(validation.get('mlm_accuracy'))}"
        )
    for jump in data["loss_jumps"][:10]:
        lines.append(
            f"loss jump at step {jump['step']}: {jump['loss']:.2f}, {jump['factor']:.1f}x the running mean "
            "(training went on)"
        )
    lines.append("checkpoints (loss and MLM accuracy: means of the interval up to the checkpoint):")
    rows = [
        [
            c["tag"],
            c["phase"] or "-",
            figures.loss(c["loss"]),
            figures.percent(c["mlm_accuracy"]),
            count(c["tokens_seen"] or 0),
            duration(c["train_time_s"]),
            size(c["bytes"]),
            c["stopped_by"] or "",
        ]
        for c in data["checkpoints"]
    ]
    lines += [
        "    " + line
        for line in table(["checkpoint", "phase", "loss", "MLM acc.", "tokens", "time", "size", "stopped by"], rows)
    ]
    files = ", ".join(f"{f['file']} ({size(f['bytes'])})" for f in data["model"]["files"])
    lines.append(f"model: {data['model']['uri']}: {files}")
    if data.get("model_mlm"):
        lines.append(f"the same as a BertForMaskedLM (for AutoModelForMaskedLM): {data['model_mlm']['uri']}")
    return lines


# -- evaluate -----------------------------------------------------------------------------------


def evaluate(directory: StageDir, manifest: Manifest, opts: Options, root: str) -> dict[str, Any]:
    metrics = directory.storage.read_json(directory.path("metrics.json"))
    return {
        "stage": "evaluate",
        "uri": directory.uri,
        "report": directory.path(manifest.report) if manifest.report else None,
        "scores": score_rows(metrics),
        "subject": metrics.get("subject", "pretrained"),
        "verdicts": metrics.get("verdicts", []),
        "notes": metrics.get("notes", []),
    }


def _score(metric: str, value: Any) -> str:
    return figures.metric(metric, value)


def _gain(metric: str, value: Any) -> str:
    return figures.points(value) if figures.is_score(metric) else figures.metric(metric, value)


def _seeds(row: dict[str, Any]) -> str:
    """3, or "1 vs 19" when random init was drawn more often (a task that trains nothing)."""
    mine, theirs = row["seeds"], row.get("random_init_seeds")
    if mine is None:
        return "-"
    return str(mine) if theirs in (None, mine) else f"{mine} vs {theirs}"


def render_evaluate(data: dict[str, Any]) -> list[str]:
    """The scores grouped by section, each beside random init and what learning nothing
    scores (accuracy in percent, correlations x 100, gains in points), then the verdicts
    as the report words them."""
    subject = data.get("subject", "pretrained")
    lines = [
        (
            f"evaluate: scores under {data['uri']} ({subject} median over seeds; accuracy in %, correlations x "
            "100, gains in points)"
        )
    ]
    for section in dict.fromkeys(r["section"] for r in data["scores"]):
        rows = [
            [
                r["name"],
                figures.name(r["metric"]),
                _score(r["metric"], r["pretrained"]),
                _score(r["metric"], r["random_init"]),
                _gain(r["metric"], r["gain"]),
                f"{_score(r['metric'], r['baseline'])} ({r['baseline_name']})" if r["baseline"] is not None else "-",
                _seeds(r),
            ]
            for r in data["scores"]
            if r["section"] == section
        ]
        lines.append(f"{section}:")
        lines += [
            "    " + line
            for line in table(["name", "metric", subject, "random init", "gain", "learning nothing", "seeds"], rows)
        ]
    if data["verdicts"]:
        lines.append("verdicts:")
        lines += [f"    {verdict}" for verdict in data["verdicts"]]
    lines += [f"note: {n}" for n in data["notes"]]
    if data["report"]:
        lines.append(f"report: {data['report']}")
    return lines


INSPECTORS: dict[str, tuple[Callable[..., dict], Callable[[dict], list[str]]]] = {
    "corpus": (corpus, render_corpus),
    "vocab": (vocab, render_vocab),
    "examples": (examples, render_examples),
    "pretrain": (pretrain, render_pretrain),
    "distill": (pretrain, render_pretrain),
    "evaluate": (evaluate, render_evaluate),
}


def inspect(storage: Storage, root: str, name: str, opts: Options) -> tuple[dict[str, Any], list[str]]:
    """(the data `--json` prints, the lines printed for people) of one stage's output."""
    if name not in INSPECTORS:
        raise ConfigError(f"unknown stage {name!r}; stages are: {', '.join(INSPECTORS)}")
    directory, manifest = stage_dir(storage, root, name)
    gather, render = INSPECTORS[name]
    data = gather(directory, manifest, opts, root)
    lines = render(data)
    for item in data.get("examples", []):
        item.pop("_lines", None)
    return data, lines
