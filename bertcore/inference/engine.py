"""A served model: its own tokenizer, a runtime (an ONNX Runtime session of the export, or
the PyTorch model the export traces), and what turns the graph's outputs into answers.
With a task head there are two graphs: the model itself (for /embed and /fill-mask) and the
model the evaluate stage fine-tuned on the task (for /classify).

`Engine.run(jobs)` takes the jobs of one batch of requests (validate.py), of any endpoint:

1. Each text becomes rows of token ids, read as its endpoint says (`Reading`): cut at
   max_tokens, or in overlapping windows (bertcore/eval/windows.py) when the evaluate
   stage read long inputs so. /fill-mask always cuts.
2. The rows of each graph are cut into model calls within the token budget (batching.py)
   and run; a call of the model gives its rows their last hidden states, so one call
   serves embeddings and masked words alike; a call of the task model gives logits.
3. Each job gets its answer: /embed pools each row (pooling.py), a windowed text's rows
   into one vector, and normalises if asked; /classify averages a windowed text's logits
   (or takes the first window's, as the head's `window_pool` says) and gives every label
   its softmax score, largest first (regression: the value); /fill-mask puts the hidden
   state of each [MASK] through the model's masked-LM head and gives the top_k tokens.

Nothing here knows of HTTP or Ray; the runtime runs in the calling thread.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bertcore.eval.windows import Windowing, split_windows
from bertcore.inference import batching, pooling
from bertcore.inference.validate import Job


@dataclass(frozen=True)
class Reading:
    """How an endpoint reads a text: at most `max_tokens` tokens per row (special tokens
    included), a longer text cut (windows None) or read in windows."""

    max_tokens: int
    windows: Windowing | None = None

    @property
    def long_inputs(self) -> str:
        return "truncate" if self.windows is None else f"windows ({self.windows.pool} of at most {self.windows.max_windows})"


@dataclass(frozen=True)
class EngineSpec:
    """What a replica loads, all local paths. `folder`: config.json and the tokenizer files.
    The model: `onnx_file` for ONNX Runtime, else `torch_dir` (a model folder) for
    PyTorch. With a task head (`head`: the TaskHead fields of bertcore/eval/heads.py), the
    fine-tuned model too: `task_onnx_file` (the export with its logits), else `head_file`
    (the evaluate stage's saved task model) on `torch_dir`'s architecture. `mlm_dir`: a
    model folder whose weights hold the masked-LM head (None: no /fill-mask)."""

    folder: str
    embed: Reading
    classify: Reading | None = None
    fill_mask_tokens: int = 128
    onnx_file: str | None = None
    torch_dir: str | None = None
    head: dict | None = None
    task_onnx_file: str | None = None
    head_file: str | None = None
    mlm_dir: str | None = None
    budget: int = 8192
    threads: int = 1


@dataclass
class Call:
    """One model call: rows, tokens computed (padding included), seconds."""

    rows: int
    tokens: int
    seconds: float


@dataclass
class _Row:
    job: int
    text: int
    ids: list[int]
    types: list[int] = field(default_factory=list)


class Engine:
    def __init__(self, spec: EngineSpec):
        from bertcore.eval.encoder import load_tokenizer

        self.spec = spec
        self.tokenizer = load_tokenizer(spec.folder)
        self._runs = {False: _onnx_runner(spec.onnx_file, spec.threads) if spec.onnx_file else _torch_runner(spec.torch_dir, None, spec.threads)}
        if spec.head is not None:
            self._runs[True] = _onnx_runner(spec.task_onnx_file, spec.threads) if spec.task_onnx_file else _torch_runner(spec.torch_dir, spec.head_file, spec.threads)
        self._mlm = None
        if spec.mlm_dir is not None:
            from bertcore.inference.export import mlm_head

            self._mlm = mlm_head(spec.mlm_dir)

    def run(self, jobs: Sequence[Job]) -> tuple[list[dict], list[Call]]:
        """The answer of each job (see the module docstring), and the model calls made."""
        rows, read = self._rows(jobs)
        per_row: list[dict] = [{} for _ in rows]
        calls = []
        for task, run in self._runs.items():  # the model's rows, then the task model's
            mine = [i for i, row in enumerate(rows) if (jobs[row.job].kind == "classify") == task]
            for call in batching.plan([len(rows[i].ids) for i in mine], self.spec.budget):
                call = [mine[k] for k in call]
                feed = batching.pad([rows[i].ids for i in call], self.tokenizer.pad_token_id or 0, [rows[i].types for i in call])
                started = time.perf_counter()
                out = run(feed)
                calls.append(Call(len(call), feed["input_ids"].size, time.perf_counter() - started))
                for slot, i in enumerate(call):
                    per_row[i] = self._keep(jobs[rows[i].job], rows[i], out, feed, slot)
        grouped: list[list[list[dict]]] = [[[] for _ in job.texts] for job in jobs]
        for row, kept in zip(rows, per_row):
            grouped[row.job][row.text].append(kept)
        return [self._answer(job, grouped[j], read[j]) for j, job in enumerate(jobs)], calls

    # -- 1. texts to rows --------------------------------------------------------------------

    def _reading(self, kind: str) -> Reading:
        if kind == "embed":
            return self.spec.embed
        if kind == "classify":
            return self.spec.classify
        return Reading(self.spec.fill_mask_tokens)

    def _rows(self, jobs: Sequence[Job]) -> tuple[list[_Row], list[list[tuple[int, bool]]]]:
        """Every text's rows, and per job and text (tokens read, text left unread)."""
        rows: list[_Row] = []
        read: list[list[tuple[int, bool]]] = []
        for j, job in enumerate(jobs):
            reading = self._reading(job.kind)
            read.append([])
            if reading.windows is not None:
                for t, text in enumerate(job.texts):
                    windows = split_windows(self.tokenizer, text, None, reading.windows)
                    rows += [_Row(j, t, ids, types) for ids, types in zip(windows.input_ids, windows.token_type_ids)]
                    read[j].append((sum(map(len, windows.input_ids)), windows.cut))
                continue
            encoded = self.tokenizer(
                list(job.texts), truncation=True, max_length=reading.max_tokens, return_overflowing_tokens=True, return_token_type_ids=True
            )
            owners = encoded["overflow_to_sample_mapping"]
            pieces = Counter(owners)
            for r, t in enumerate(owners):
                if r == 0 or owners[r - 1] != t:  # a text's first piece is the text cut; the others are what was cut off
                    rows.append(_Row(j, t, list(encoded["input_ids"][r]), list(encoded["token_type_ids"][r])))
                    read[j].append((len(encoded["input_ids"][r]), pieces[t] > 1))
        return rows, read

    # -- 2. what each row keeps of a call's outputs -------------------------------------------

    def _keep(self, job: Job, row: _Row, out: dict[str, np.ndarray], feed: dict[str, np.ndarray], slot: int) -> dict:
        hidden, mask = out["last_hidden_state"][slot : slot + 1], feed["attention_mask"][slot : slot + 1]  # (1, T, H), (1, T)
        if job.kind == "embed":
            return {"vector": pooling.pool(hidden, mask, job.pooling)[0]}
        if job.kind == "classify":
            return {"logits": out["logits"][slot]}
        positions = [p for p, token in enumerate(row.ids) if token == self.tokenizer.mask_token_id]
        return {"masked": hidden[0, positions]}  # (M, H)

    # -- 3. answers ----------------------------------------------------------------------------

    def _answer(self, job: Job, texts: list[list[dict]], read: list[tuple[int, bool]]) -> dict:
        answer: dict = {"tokens": [tokens for tokens, _ in read], "truncated": [cut for _, cut in read]}
        if job.kind == "embed":
            window_pool = self.spec.embed.windows.pool if self.spec.embed.windows else "first"
            vectors = np.stack([pooling.pool_windows(np.stack([r["vector"] for r in rows]), window_pool) for rows in texts])
            if job.normalize:
                vectors = pooling.normalized(vectors)
            answer.update(embeddings=vectors.astype(np.float32).tolist(), pooling=job.pooling, normalized=job.normalize)
        elif job.kind == "classify":
            answer["predictions"] = [self._classes(rows) for rows in texts]
        else:
            answer["predictions"] = [self._fill(rows[0]["masked"], job.top_k) for rows in texts]
        return answer

    def _classes(self, rows: list[dict]) -> list[dict] | dict:
        head = self.spec.head
        window_pool = self.spec.classify.windows.pool if self.spec.classify and self.spec.classify.windows else "first"
        logits = np.stack([r["logits"] for r in rows])
        logits = logits[0] if window_pool == "first" else logits.mean(0)  # mean: exact for a linear head on pooled windows
        if head["type"] == "regression":
            return {"score": float(logits[0])}
        scores = np.exp(logits - logits.max())
        scores /= scores.sum()
        labels = head["labels"] or [str(i) for i in range(len(scores))]
        return [{"label": labels[i], "score": float(scores[i])} for i in np.argsort(-scores, kind="stable")]

    def _fill(self, masked: np.ndarray, top_k: int) -> list[list[dict]]:
        import torch

        if not len(masked):
            return []
        with torch.no_grad():
            logits = self._mlm(torch.from_numpy(np.ascontiguousarray(masked, dtype=np.float32))).float()  # (M, V)
        probs = logits.softmax(-1)
        top = probs.topk(top_k, dim=-1)
        return [
            [{"token": int(t), "token_str": self.tokenizer.decode([int(t)]).strip(), "score": float(s)} for s, t in zip(scores, tokens)]
            for scores, tokens in zip(top.values.tolist(), top.indices.tolist())
        ]


def _onnx_runner(path: str, threads: int):
    """feed -> {output name: array} through an ONNX Runtime session of an export."""
    from bertcore.inference.onnx import session

    sess = session(path, threads, spin=False)  # idle threads sleep: the replica's HTTP and batching share the cores
    names = [o.name for o in sess.get_outputs() if o.name in ("last_hidden_state", "logits")]
    return lambda feed: dict(zip(names, sess.run(names, feed)))


def _torch_runner(model_dir: str, head_file: str | None, threads: int):
    """feed -> {output name: array} through the PyTorch model an export would trace."""
    import torch

    from bertcore.inference.export import inference_model

    torch.set_num_threads(threads)
    model, _ = inference_model(model_dir, head_file)
    names = model.output_names

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            values = model(*(torch.from_numpy(feed[name]) for name in ("input_ids", "attention_mask", "token_type_ids")))
        return {name: value.float().numpy() for name, value in zip(names, values) if name in ("last_hidden_state", "logits")}

    return run
