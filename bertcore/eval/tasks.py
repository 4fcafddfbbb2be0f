"""A task's files as a whole: its splits read through its kind (bertcore/eval/kinds/), the
check of every file before any job starts, its label list, and its cross-validation folds.

A task is one labelled data set (SST-2, MRPC, CoNLL-2003, SQuAD, a company's own TSV)
described by a `TaskConfig` (bertcore/eval/config.py). Row-level reading and its errors
are bertcore/eval/readers.py's; what a file of each kind holds is the kind's.
"""

from __future__ import annotations

from bertcore.eval.config import TaskConfig
from bertcore.eval.readers import ReadResult, TaskDataError
from bertcore.eval.settings import TASK_FILES, Split
from bertcore.rng import keyed_seed


def read_split(task: TaskConfig, split: Split, labels: list[str] | None = None) -> ReadResult:
    """The examples of one split of `task`. `labels` overrides `task.labels` (run_task
    passes the list inferred from train when the config leaves it unset)."""
    if getattr(task, split) is None:
        raise ValueError(f"task {task.name!r} has no {split} file")
    return task.kind.read(task, split, labels)


def check_task_files(task: TaskConfig) -> dict[str, int]:
    """Read every file `task` names (when the task is planned, before any job starts): the
    number of examples per split, or a TaskDataError naming a file that holds none (an
    empty validation TSV, an empty CoNLL file, SQuAD's `{"data": []}`) and what it should
    hold, or a training file its kind cannot train on (one label only)."""
    counts = {}
    for split in TASK_FILES:
        path = getattr(task, split)
        if path is None:
            continue
        result = read_split(task, split)
        if not result.examples:
            skipped = ""
            if result.problems:
                skipped = f"; its {result.skipped} malformed rows were skipped, the first: {result.problems[0]}"
            expected = task.kind.expected(task)
            raise TaskDataError(
                f"{path}: no examples for task {task.name!r} ({split} file){skipped}; expected {expected}"
            )
        if split == "train":
            task.kind.check_train(task, result.examples)
        folds = task.cross_validation_folds
        if split == "train" and folds is not None and len(result.examples) < folds:
            raise TaskDataError(
                f"{path}: {len(result.examples)} training examples cannot make the {folds} cross-validation folds "
                f"of task {task.name!r}; add examples or lower its cross_validation_folds"
            )
        counts[split] = len(result.examples)
    return counts


def infer_labels(task: TaskConfig, train_examples: list) -> list[str]:
    """The task's label list: `task.labels` if set, else the sorted labels seen in train
    ([] for a kind whose outputs have no names)."""
    return task.kind.labels(task, train_examples)


def fold_splits(task: TaskConfig, examples: list) -> list[tuple[list[int], list[int]]]:
    """(train indexes, held-out indexes) per cross-validation fold. The folds depend only on
    the task name, never on the fine-tuning seed, so seeds differ by training alone.
    A stratified kind's folds keep the label proportions (when every label has k examples)."""
    from sklearn.model_selection import KFold, StratifiedKFold  # here: the run config imports this module

    k = task.cross_validation_folds
    if k is None:
        raise ValueError(f"task {task.name!r} has no cross_validation_folds")
    if len(examples) < k:
        raise TaskDataError(f"task {task.name!r}: {len(examples)} training examples cannot make {k} folds")
    state = keyed_seed(0, task.name, "folds") % 2**32
    indexes = list(range(len(examples)))
    if task.kind.stratified:
        y = [e.label for e in examples]
        if min(y.count(label) for label in set(y)) >= k:
            splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=state)
            return [(list(a), list(b)) for a, b in splitter.split(indexes, y)]
    splitter = KFold(n_splits=k, shuffle=True, random_state=state)
    return [(list(a), list(b)) for a, b in splitter.split(indexes)]
