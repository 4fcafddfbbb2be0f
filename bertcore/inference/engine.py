"""A served model: its own tokenizer, a runtime (an ONNX Runtime session of the export, or
the PyTorch model the export traces), and what turns the graph's outputs into answers.
With a task head there are two graphs: the model itself (for embeddings and masked words)
and the model the evaluate stage fine-tuned on the task (for predictions).

`Engine.run(jobs)` takes the jobs of one batch of requests (validate.py), of any kind:

1. Each input becomes rows of token ids, read as its kind says (`Reading`): cut at
   max_tokens, or in overlapping windows (bertcore/eval/windows.py) when the evaluate
   stage read long inputs so. A pair is laid out `[CLS] a [SEP] b [SEP]`, token types 0
   then 1, as fine-tuning read it. Masked words are always cut. Token ids (the model's
   own) that already begin with [CLS] and end with [SEP] are not wrapped again. A job with
   `truncate` false that would leave text unread is refused (413), the other jobs of the
   batch run. Each input's unknown tokens ([UNK]: what the vocabulary could not read, in
   the whole input, read or cut) are counted; an input that is nothing but unknown tokens
   is `unreadable`: flagged in its answer, or its job refused (422) when the spec says
   `unreadable="refuse"`.
2. The rows of each graph are cut into model calls within the token budget (batching.py)
   and run; a call of the model gives its rows their last hidden states, so one call
   serves embeddings and masked words alike; a call of the task model gives logits.
3. Each job gets its answer, NumPy arrays where it holds vectors (the route families of
   routes/ shape it for their clients): embeddings pool each row (pooling.py), a windowed
   text's rows into one vector, and normalise if asked; predictions average a windowed
   text's logits (or take the first window's, as the head's `window_pool` says);
   masked words put the hidden state of each [MASK] through the model's masked-LM head
   and give the top_k tokens (or the `targets`' scores). `tokenize` jobs need no model.

Nothing here knows of HTTP or Ray; the runtime runs in the calling thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from bertcore.eval.windows import Windowing, split_windows
from bertcore.inference import batching, pooling
from bertcore.inference.validate import Job, RequestError

UNREADABLE = "unreadable"
"""The code of the RequestError that refuses an input of nothing but unknown tokens."""
ALL_WINDOWS = 1 << 20
"""max_windows when truncation keeps the end: every window, the last ones kept."""


@dataclass(frozen=True)
class Reading:
    """How a kind of job reads an input: at most `max_tokens` tokens per row (special
    tokens included), a longer one cut (windows None) or read in windows."""

    max_tokens: int
    windows: Windowing | None = None

    @property
    def long_inputs(self) -> str:
        return (
            "truncate"
            if self.windows is None
            else f"windows ({self.windows.pool} of at most {self.windows.max_windows})"
        )


@dataclass(frozen=True)
class EngineSpec:
    """What a server loads, all local paths. `folder`: config.json and the tokenizer files.
    The model: `onnx_file` for ONNX Runtime, else `torch_dir` (a model folder) for
    PyTorch. With a task head (`head`: the TaskHead fields of bertcore/eval/heads.py), the
    fine-tuned model too: `task_onnx_file` (the export with its logits), else `head_file`
    (the evaluate stage's saved task model) on `torch_dir`'s architecture. `mlm_dir`: a
    model folder whose weights hold the masked-LM head (None: no masked words)."""

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
    unreadable: str = "flag"
    """An input that is nothing but unknown tokens: `flag` (answered, flagged) or `refuse` (its job gets a 422)."""


@dataclass
class Call:
    """One model call: rows, tokens computed (padding included), seconds, and the tokens
    that were not padding."""

    rows: int
    tokens: int
    seconds: float
    read: int = 0


@dataclass(frozen=True)
class _Read:
    """What the model made of one input: tokens read (special tokens included), whether
    text was left unread, and of the input's own tokens (all of it, special tokens not
    counted) how many are unknown."""

    tokens: int
    cut: bool
    unknown: int = 0
    whole: int = 0

    @property
    def unreadable(self) -> bool:
        return self.whole > 0 and self.unknown == self.whole


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
        self._runs = {
            False: _onnx_runner(spec.onnx_file, spec.threads)
            if spec.onnx_file
            else _torch_runner(spec.torch_dir, None, spec.threads)
        }
        if spec.head is not None:
            task_run = (
                _onnx_runner(spec.task_onnx_file, spec.threads)
                if spec.task_onnx_file
                else _torch_runner(spec.torch_dir, spec.head_file, spec.threads)
            )
            self._runs[True] = task_run
        self._mlm = None
        if spec.mlm_dir is not None:
            from bertcore.inference.export import mlm_head

            self._mlm = mlm_head(spec.mlm_dir)
        self._prefix, self._suffix = _specials(self.tokenizer)

    def run(self, jobs: Sequence[Job]) -> tuple[list[dict | RequestError], list[Call]]:
        """The answer of each job (or the RequestError that refuses it; see the module
        docstring), and the model calls made."""
        rows: list[_Row] = []
        read: list[list[_Read]] = []
        refused: dict[int, RequestError] = {}
        for j, job in enumerate(jobs):
            try:
                mine, counts = self._rows(j, job)
            except RequestError as exc:
                refused[j], mine, counts = exc, [], []
            rows += mine
            read.append(counts)
        per_row: list[dict] = [{} for _ in rows]
        calls = []
        for task, run in self._runs.items():  # the model's rows, then the task model's
            mine = [i for i, row in enumerate(rows) if (jobs[row.job].kind == "classify") == task]
            for call in batching.plan([len(rows[i].ids) for i in mine], self.spec.budget):
                call = [mine[k] for k in call]
                feed = batching.pad(
                    [rows[i].ids for i in call], self.tokenizer.pad_token_id or 0, [rows[i].types for i in call]
                )
                started = time.perf_counter()
                out = run(feed)
                calls.append(
                    Call(
                        len(call),
                        feed["input_ids"].size,
                        time.perf_counter() - started,
                        int(feed["attention_mask"].sum()),
                    )
                )
                for slot, i in enumerate(call):
                    per_row[i] = self._keep(jobs[rows[i].job], rows[i], out, feed, slot)
        grouped: list[list[list[dict]]] = [[[] for _ in range(job.size)] for job in jobs]
        for row, kept in zip(rows, per_row):
            grouped[row.job][row.text].append(kept)
        return [
            refused[j] if j in refused else self._answer(job, grouped[j], read[j]) for j, job in enumerate(jobs)
        ], calls

    # -- 1. inputs to rows ---------------------------------------------------------------------

    def reading(self, kind: str) -> Reading:
        if kind == "embed":
            return self.spec.embed
        if kind == "classify":
            return self.spec.classify
        return Reading(self.spec.fill_mask_tokens)

    def _rows(self, j: int, job: Job) -> tuple[list[_Row], list[_Read]]:
        """One job's rows, and what the model made of each input (see `_Read`)."""
        if job.kind == "tokenize":
            return [], []
        reading = self.reading(job.kind)
        if job.second is not None and (reading.windows is None or job.token_ids is not None):
            rows, read = self._pairs(j, job, reading.max_tokens)
            return rows, self._checked(job, read)
        bodies = (
            [self._unwrapped(list(ids)) for ids in job.token_ids]
            if job.token_ids is not None
            else self.tokenizer(list(job.texts), add_special_tokens=False, verbose=False)["input_ids"]
        )
        unknown = [self._unknown(body) for body in bodies]
        rows: list[_Row] = []
        read: list[_Read] = []
        if reading.windows is not None and job.token_ids is None:
            spec = replace(reading.windows, max_windows=ALL_WINDOWS) if job.left else reading.windows
            if job.second is not None:
                seconds = self.tokenizer(list(job.second), add_special_tokens=False, verbose=False)["input_ids"]
                unknown = [(a + b, n + m) for (a, n), (b, m) in zip(unknown, map(self._unknown, seconds))]
            for t, text in enumerate(job.texts):
                windows = split_windows(self.tokenizer, text, job.second[t] if job.second else None, spec)
                ids, types = windows.input_ids, windows.token_type_ids
                cut = windows.cut or len(ids) > reading.windows.max_windows
                if cut and job.truncate is False:
                    raise RequestError(
                        413,
                        f"{_where(job, t)} needs more than the {reading.windows.max_windows} windows of "
                        f"{reading.max_tokens} tokens the model reads; send truncate: true to read only those, "
                        "or split the text",
                    )
                keep = slice(-reading.windows.max_windows, None) if job.left else slice(None)
                rows += [_Row(j, t, i, y) for i, y in zip(ids[keep], types[keep])]
                read.append(_Read(sum(map(len, ids[keep])), cut, *unknown[t]))
            return rows, self._checked(job, read)
        room = reading.max_tokens - len(self._prefix) - len(self._suffix)
        for t, body in enumerate(bodies):
            body = list(body)
            cut = len(body) > room
            if cut and job.truncate is False:
                raise RequestError(
                    413,
                    f"{_where(job, t)} is {len(body) + len(self._prefix) + len(self._suffix)} tokens, over the "
                    f"{reading.max_tokens} the model reads; send truncate: true to cut it, or split the text",
                )
            if cut:
                body = body[len(body) - room :] if job.left else body[:room]
            ids = self._prefix + body + self._suffix
            rows.append(_Row(j, t, ids, [0] * len(ids)))
            read.append(_Read(len(ids), cut, *unknown[t]))
        return rows, self._checked(job, read)

    def _unwrapped(self, ids: list[int]) -> list[int]:
        """Token ids without the special tokens around them, when they came with them (ids
        copied from /tokenize hold [CLS] and [SEP] already)."""
        head, tail = len(self._prefix), len(self._suffix)
        if len(ids) >= head + tail and ids[:head] == self._prefix and ids[len(ids) - tail :] == self._suffix:
            return ids[head : len(ids) - tail]
        return ids

    def _unknown(self, body: Sequence[int]) -> tuple[int, int]:
        """(unknown tokens, tokens) of one input's own tokens."""
        unk = self.tokenizer.unk_token_id
        return (0 if unk is None else sum(1 for token in body if token == unk)), len(body)

    def _checked(self, job: Job, read: list[_Read]) -> list[_Read]:
        """`read`, or a 422 for the first unreadable input when the spec refuses them."""
        if self.spec.unreadable == "refuse":
            for t, one in enumerate(read):
                if one.unreadable:
                    text = job.texts[t] if job.token_ids is None else None
                    raise RequestError(
                        422,
                        f"{_where(job, t)}{f' ({_shown(text)})' if text else ''} is all unknown tokens: this model's "
                        "vocabulary cannot read any of it, so its answer would mean nothing (serve.unreadable is "
                        "refuse; with flag it is answered and flagged)",
                        code=UNREADABLE,
                    )
        return read

    def _pairs(self, j: int, job: Job, max_tokens: int) -> tuple[list[_Row], list[_Read]]:
        """Pairs cut to max_tokens as fine-tuning cut them (the tokenizer's longest-first)."""
        firsts, seconds = list(job.texts), list(job.second)
        whole = self.tokenizer(firsts, seconds, return_token_type_ids=True, verbose=False)
        lengths = [len(ids) for ids in whole["input_ids"]]
        for t, length in enumerate(lengths):
            if length > max_tokens and job.truncate is False:
                raise RequestError(
                    413,
                    f"{_where(job, t)} is {length} tokens as a pair, over the {max_tokens} the model reads; "
                    "send truncate: true to cut it, or shorten the texts",
                )
        long = [t for t, length in enumerate(lengths) if length > max_tokens]
        ids, types = list(whole["input_ids"]), list(whole["token_type_ids"])
        if long:
            side = self.tokenizer.truncation_side
            self.tokenizer.truncation_side = "left" if job.left else "right"
            try:
                cut = self.tokenizer(
                    [firsts[t] for t in long],
                    [seconds[t] for t in long],
                    truncation=True,
                    max_length=max_tokens,
                    return_token_type_ids=True,
                )
            finally:
                self.tokenizer.truncation_side = side
            for k, t in enumerate(long):
                ids[t], types[t] = cut["input_ids"][k], cut["token_type_ids"][k]
        rows = [_Row(j, t, list(ids[t]), list(types[t])) for t in range(len(firsts))]
        specials = self.tokenizer.num_special_tokens_to_add(pair=True)
        return rows, [
            _Read(
                len(ids[t]),
                lengths[t] > max_tokens,
                self._unknown(whole["input_ids"][t])[0],
                lengths[t] - specials,
            )
            for t in range(len(firsts))
        ]

    # -- 2. what each row keeps of a call's outputs -------------------------------------------

    def _keep(self, job: Job, row: _Row, out: dict[str, np.ndarray], feed: dict[str, np.ndarray], slot: int) -> dict:
        hidden, mask = (
            out["last_hidden_state"][slot : slot + 1],
            feed["attention_mask"][slot : slot + 1],
        )  # (1, T, H), (1, T)
        if job.kind == "embed":
            return {"vector": pooling.pool(hidden, mask, job.pooling)[0]}
        if job.kind == "classify":
            return {"logits": out["logits"][slot]}
        positions = [p for p, token in enumerate(row.ids) if token == self.tokenizer.mask_token_id]
        return {"masked": hidden[0, positions]}  # (M, H)

    # -- 3. answers ----------------------------------------------------------------------------

    def _answer(self, job: Job, inputs: list[list[dict]], read: list[_Read]) -> dict:
        if job.kind == "tokenize":
            return {"tokens": [self._tokens(text, job.add_special_tokens) for text in job.texts]}
        answer: dict = {
            "tokens": [one.tokens for one in read],
            "truncated": [one.cut for one in read],
            "unknown": [one.unknown for one in read],
            "unreadable": [one.unreadable for one in read],
        }
        if job.kind == "embed":
            windows = self.spec.embed.windows
            window_pool = windows.pool if windows and job.token_ids is None else "first"
            vectors = np.stack(
                [pooling.pool_windows(np.stack([r["vector"] for r in rows]), window_pool) for rows in inputs]
            )
            if job.normalize:
                vectors = pooling.normalized(vectors)
            answer.update(embeddings=vectors.astype(np.float32), pooling=job.pooling, normalized=job.normalize)
        elif job.kind == "classify":
            window_pool = self.spec.classify.windows.pool if self.spec.classify.windows else "first"
            per_input = [np.stack([r["logits"] for r in rows]) for rows in inputs]
            # mean: exact for a linear head on pooled windows
            answer["logits"] = np.stack(
                [logits[0] if window_pool == "first" else logits.mean(0) for logits in per_input]
            ).astype(np.float32)
        else:
            answer["predictions"] = [self._fill(rows[0]["masked"], job) for rows in inputs]
        return answer

    def _fill(self, masked: np.ndarray, job: Job) -> list[list[dict]]:
        import torch

        if not len(masked):
            return []
        with torch.no_grad():
            logits = self._mlm(torch.from_numpy(np.ascontiguousarray(masked, dtype=np.float32))).float()  # (M, V)
        probs = logits.softmax(-1)
        if job.targets is not None:
            ids = torch.tensor(self.target_ids(job.targets))
            scores = probs[:, ids]  # (M, targets)
            order = scores.argsort(dim=-1, descending=True, stable=True)[:, : job.top_k]
            top_scores, top_ids = scores.gather(-1, order).tolist(), ids[order].tolist()
        else:
            top = probs.topk(min(job.top_k, probs.shape[-1]), dim=-1)
            top_scores, top_ids = top.values.tolist(), top.indices.tolist()
        return [
            [
                {"token": int(t), "token_str": self.tokenizer.decode([int(t)]).strip(), "score": float(s)}
                for s, t in zip(scores, tokens)
            ]
            for scores, tokens in zip(top_scores, top_ids)
        ]

    def target_ids(self, targets: Sequence[str]) -> list[int]:
        """The vocabulary id of each target word: its first token, as Hugging Face's
        fill-mask pipeline takes it."""
        return [
            ids[0] if ids else self.tokenizer.unk_token_id
            for ids in self.tokenizer(list(targets), add_special_tokens=False)["input_ids"]
        ]

    def _tokens(self, text: str, special: bool) -> list[dict]:
        """TEI's tokens of one text: id, text (the piece of the input it covers, or the
        special token), special, start and stop (character offsets)."""
        encoded = self.tokenizer(
            text,
            add_special_tokens=special,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            verbose=False,
        )
        names = self.tokenizer.convert_ids_to_tokens(encoded["input_ids"])
        out = []
        for token, name, (start, stop), is_special in zip(
            encoded["input_ids"], names, encoded["offset_mapping"], encoded["special_tokens_mask"]
        ):
            out.append(
                {
                    "id": token,
                    "text": name if is_special else text[start:stop],
                    "special": bool(is_special),
                    "start": start,
                    "stop": stop,
                }
            )
        return out


def _where(job: Job, t: int) -> str:
    return f"inputs[{t}]" if job.size > 1 else "the input"


def _shown(text: str) -> str:
    """A text for a message: short, on one line."""
    one_line = " ".join(text.split())
    return repr(one_line if len(one_line) <= 40 else one_line[:37] + "...")


def _specials(tokenizer) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after one text ([CLS] and [SEP] for
    BERT, <s> and </s> for RoBERTa), read off an encoding of one word."""
    word = tokenizer("a", add_special_tokens=False)["input_ids"]
    whole = tokenizer("a")["input_ids"]
    for start in range(len(whole) - len(word) + 1):
        if whole[start : start + len(word)] == word:
            return whole[:start], whole[start + len(word) :]
    raise ValueError("cannot find the text among the special tokens of the served tokenizer")


def _onnx_runner(path: str, threads: int):
    """feed -> {output name: array} through an ONNX Runtime session of an export."""
    from bertcore.inference.onnx import session

    sess = session(path, threads, spin=False)  # idle threads sleep: HTTP and batching share the cores
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
            values = model(
                *(torch.from_numpy(feed[name]) for name in ("input_ids", "attention_mask", "token_type_ids"))
            )
        return {
            name: value.float().numpy() for name, value in zip(names, values) if name in ("last_hidden_state", "logits")
        }

    return run
