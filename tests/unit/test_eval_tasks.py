"""Task configuration and file readers: GLUE-style rows, fastText lines, CoNLL, SQuAD;
malformed rows name their file and line, or are skipped and counted."""

from __future__ import annotations

import json
import os

import pytest
from pydantic import ValidationError

from bertcore.eval import readers, tasks
from bertcore.eval.kinds import qa, token_classification
from bertcore.eval.tasks import TaskConfig


def write(path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


# --- configuration -------------------------------------------------------------------------


def base(**overrides) -> dict:
    config = {"name": "t", "type": "classification", "format": "tsv", "train": "train.tsv", "validation": "dev.tsv"}
    config.update(overrides)
    return config


def test_config_defaults_and_seeds():
    task = TaskConfig(**base())
    assert task.seeds == [1, 2, 3] and task.on_error == "raise" and task.doc_stride == 128


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"format": "squad"}, "cannot hold a classification task"),
        ({"type": "qa", "format": "tsv"}, "cannot hold a qa task"),
        ({"validation": None}, "cross_validation_folds"),
        ({"cross_validation_folds": 5}, "not both"),
        ({"header": False}, "0-based indexes"),
        ({"format": "jsonl", "text_a": 0}, "field names"),
        ({"type": "regression", "labels": ["a"]}, "regression"),
        ({"labels": ["a", "b"], "positive_label": "c"}, "positive_label"),
        ({"encoding": "no-such-codec"}, "unknown text encoding"),
        ({"epochs": 0}, "epochs"),
        ({"learning_rte": 1e-4}, "learning_rte"),
    ],
)
def test_config_rejects_impossible_settings(overrides, message):
    with pytest.raises(ValidationError, match=message):
        TaskConfig(**base(**overrides))


def test_field_docstrings_become_help_text():
    assert "Google's run_squad" in TaskConfig.model_fields["doc_stride"].description


# --- tsv / csv / jsonl ---------------------------------------------------------------------


def test_glue_tsv_with_stray_quotes(tmp_path):
    path = write(tmp_path / "train.tsv", "sentence\tlabel\nit 's a \"charming journey\t1\nflat , dull\t0\n\n")
    read = readers.read_rows(path, format="tsv", text_a="sentence", labels=["0", "1"])
    assert [(e.text_a, e.label) for e in read.examples] == [("it 's a \"charming journey", "1"), ("flat , dull", "0")]
    assert read.skipped == 0


def test_mrpc_pairs_and_cola_without_header(tmp_path):
    mrpc = write(
        tmp_path / "mrpc.tsv",
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t7\t8\tHe left .\tHe went away .\n",
    )
    read = readers.read_rows(mrpc, format="tsv", text_a="#1 String", text_b="#2 String", label_column="Quality")
    assert read.examples == [readers.TextExample("He left .", "He went away .", "1")]
    cola = write(tmp_path / "cola.tsv", "gj04\t1\t\tThe sailors rode the breeze .\ngj04\t0\t*\tThe more we study .\n")
    read = readers.read_rows(cola, format="tsv", text_a=3, label_column=1, header=False)
    assert [e.label for e in read.examples] == ["1", "0"] and read.examples[1].text_a == "The more we study ."


def test_tsv_wrong_column_count_names_file_and_line(tmp_path):
    path = write(tmp_path / "dev.tsv", "sentence\tlabel\ngood\t1\nno label here\nbad\t0\n")
    with pytest.raises(ValueError) as err:
        readers.read_rows(path, format="tsv", text_a="sentence")
    assert f"{path}, line 3" in str(err.value) and "1 columns where 2" in str(err.value)
    read = readers.read_rows(path, format="tsv", text_a="sentence", on_error="skip")
    assert read.skipped == 1 and len(read.examples) == 2 and "line 3" in read.problems[0]


def test_label_outside_the_list_and_bad_scores(tmp_path):
    path = write(tmp_path / "dev.tsv", "sentence\tlabel\ngood\t1\nmeh\t2\n")
    with pytest.raises(ValueError, match=r"line 3: label '2' is not one of"):
        readers.read_rows(path, format="tsv", text_a="sentence", labels=["0", "1"])
    scores = write(tmp_path / "sts.tsv", "s1\ts2\tscore\na\tb\t4.5\nc\td\tn/a\ne\tf\tnan\n")
    columns = {"text_a": "s1", "text_b": "s2", "label_column": "score"}
    read = readers.read_rows(scores, format="tsv", **columns, parse_label=readers.score, on_error="skip")
    assert [e.label for e in read.examples] == [4.5] and read.skipped == 2


def test_csv_quoted_fields_keep_line_numbers(tmp_path):
    text = 'text,label\n"one, with comma",a\n"two\nlines",b\nbroken,c\n'
    path = write(tmp_path / "d.csv", text)
    with pytest.raises(ValueError, match=r"line 5: label 'c'"):
        readers.read_rows(path, format="csv", text_a="text", labels=["a", "b"])
    read = readers.read_rows(path, format="csv", text_a="text", labels=["a", "b"], on_error="skip")
    assert [e.text_a for e in read.examples] == ["one, with comma", "two\nlines"]


def test_jsonl_rows(tmp_path):
    lines = [
        json.dumps({"premise": "A man sleeps .", "hypothesis": "A man rests .", "label": 0}),
        "{not json",
        json.dumps({"premise": "x"}),
        json.dumps({"premise": "A dog .", "hypothesis": "A cat .", "label": 2}),
    ]
    path = write(tmp_path / "nli.jsonl", "\n".join(lines) + "\n")
    kwargs = {"format": "jsonl", "text_a": "premise", "text_b": "hypothesis", "labels": ["0", "1", "2"]}
    with pytest.raises(ValueError, match=r"line 2: invalid JSON"):
        readers.read_rows(path, **kwargs)
    read = readers.read_rows(path, on_error="skip", **kwargs)
    assert read.skipped == 2 and "line 3: column 'hypothesis' is missing" in read.problems[1]
    assert [e.label for e in read.examples] == ["0", "2"]


# --- fastText lines ------------------------------------------------------------------------

POLARITY = os.path.join(os.path.dirname(__import__("gensim").__file__), "test", "test_data", "pang_lee_polarity.cor")


def test_shipped_polarity_sample_reads_with_its_encoding():
    read = readers.read_fasttext(POLARITY, labels=["neg", "pos"], encoding="cp1252")
    assert len(read.examples) == 200 and read.skipped == 0
    assert sum(e.label == "pos" for e in read.examples) == 100
    assert read.examples[0] == readers.TextExample("simplistic , silly and tedious .", None, "neg")


def test_undecodable_line_is_reported_with_its_number():
    with open(POLARITY, "rb") as f:
        bad_lines = [n for n, raw in enumerate(f, start=1) if not _is_utf8(raw)]
    assert bad_lines  # the sample does contain Windows-1252 bytes
    with pytest.raises(ValueError, match=rf"line {bad_lines[0]}: byte 0x\w\w is not valid utf-8"):
        readers.read_fasttext(POLARITY)
    read = readers.read_fasttext(POLARITY, on_error="skip")
    assert read.skipped == len(bad_lines) and len(read.examples) == 200 - len(bad_lines)


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_fasttext_malformed_lines(tmp_path):
    path = write(tmp_path / "ft.txt", "__label__pos great\nno label\n__label__pos __label__neg both\n__label__neg\n")
    with pytest.raises(ValueError, match="line 2: expected one __label__LABEL, found 0"):
        readers.read_fasttext(path)
    read = readers.read_fasttext(path, on_error="skip")
    assert read.skipped == 3 and read.examples == [readers.TextExample("great", None, "pos")]


# --- CoNLL ---------------------------------------------------------------------------------

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP B-LOC
"""


def test_conll_sentences_tags_from_the_last_column(tmp_path):
    read = token_classification.read_conll(write(tmp_path / "train.txt", CONLL))
    assert [s.words for s in read.examples] == [
        ("EU", "rejects", "German", "call", "."),
        ("Peter", "Blackburn"),
        ("BRUSSELS",),
    ]
    assert read.examples[0].tags == ("B-ORG", "O", "B-MISC", "O", "O")


def test_conll_malformed_lines_drop_their_sentence(tmp_path):
    text = CONLL.replace("Blackburn NNP I-NP I-PER", "Blackburn").replace(
        "BRUSSELS NNP B-NP B-LOC", "BRUSSELS NNP B-NP LOC"
    )
    path = write(tmp_path / "bad.txt", text)
    with pytest.raises(ValueError, match=r"line 10: expected a token and a tag"):
        token_classification.read_conll(path)
    read = token_classification.read_conll(path, on_error="skip")
    assert read.skipped == 2 and len(read.examples) == 1 and "line 14" in read.problems[1]
    labels = ["O", "B-ORG", "B-PER", "I-PER", "B-LOC"]
    with pytest.raises(ValueError, match=r"line 5: tag 'B-MISC' is not one of"):
        token_classification.read_conll(write(tmp_path / "ok.txt", CONLL), labels=labels)


# --- SQuAD ---------------------------------------------------------------------------------


def squad_file(path, qas, context="Paris is the capital of France.") -> str:
    data = {"version": "v2.0", "data": [{"title": "P", "paragraphs": [{"context": context, "qas": qas}]}]}
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return str(path)


def line_of(path: str, needle: str) -> int:
    with open(path, encoding="utf-8") as f:
        return next(n for n, line in enumerate(f, start=1) if needle in line)


def test_squad_v1_with_several_answers(tmp_path):
    qas = [
        {
            "id": "q1",
            "question": "Capital of France?",
            "answers": [{"text": "Paris", "answer_start": 0}, {"text": "Paris", "answer_start": 0}],
        },
        {"id": "q2", "question": "Of which country?", "answers": [{"text": "France", "answer_start": 24}]},
    ]
    read = qa.read_squad(squad_file(tmp_path / "dev.json", qas))
    assert [e.id for e in read.examples] == ["q1", "q2"]
    assert read.examples[1].answers == (qa.Answer("France", 24),)
    assert read.examples[0].context[: len("Paris")] == "Paris"


def test_squad_answers_must_sit_at_answer_start(tmp_path):
    qas = [
        {"id": "good", "question": "Capital?", "answers": [{"text": "Paris", "answer_start": 0}]},
        {"id": "shifted", "question": "Country?", "answers": [{"text": "France", "answer_start": 20}]},
        {"id": "outside", "question": "Where?", "answers": [{"text": "France.", "answer_start": 40}]},
    ]
    path = squad_file(tmp_path / "dev.json", qas)
    with pytest.raises(ValueError) as err:
        qa.read_squad(path)
    message = str(err.value)
    shifted, outside = line_of(path, '"shifted"'), line_of(path, '"outside"')
    assert f"{path}, line {shifted}: question 'shifted'" in message
    assert "not at answer_start 20" in message
    read = qa.read_squad(path, on_error="skip")
    assert [e.id for e in read.examples] == ["good"] and read.skipped == 2
    assert f"line {outside}: question 'outside'" in read.problems[1]
    assert "outside the context" in read.problems[1]


def test_squad_v2_unanswerable_questions(tmp_path):
    qas = [
        {"id": "q1", "question": "Capital?", "answers": [{"text": "Paris", "answer_start": 0}], "is_impossible": False},
        {
            "id": "q2",
            "question": "Who?",
            "answers": [],
            "is_impossible": True,
            "plausible_answers": [{"text": "Paris", "answer_start": 0}],
        },
    ]
    path = squad_file(tmp_path / "v2.json", qas)
    read = qa.read_squad(path, version_2=True)
    assert read.examples[1].answers == ()
    with pytest.raises(ValueError, match="version_2 is false"):
        qa.read_squad(path)


def test_squad_broken_json_names_the_line(tmp_path):
    path = write(tmp_path / "broken.json", '{"data": [\n{"title": "x",\n "paragraphs": [}\n]}')
    with pytest.raises(ValueError, match=r"line 3: invalid JSON"):
        qa.read_squad(path, on_error="skip")  # a file that does not parse cannot be skipped around


# --- task level ----------------------------------------------------------------------------


def test_read_split_and_inferred_labels(tmp_path):
    train = write(tmp_path / "train.tsv", "sentence\tlabel\na\tpos\nb\tneg\nc\tpos\n")
    dev = write(tmp_path / "dev.tsv", "sentence\tlabel\nd\tneutral\n")
    task = TaskConfig(name="t", type="classification", format="tsv", train=train, validation=dev)
    read = tasks.read_split(task, "train")
    labels = tasks.infer_labels(task, read.examples)
    assert labels == ["neg", "pos"]
    with pytest.raises(ValueError, match="label 'neutral'"):
        tasks.read_split(task, "validation", labels)
    with pytest.raises(ValueError, match="no test file"):
        tasks.read_split(task, "test")


def test_fold_splits_are_disjoint_stratified_and_fixed_per_task():
    examples = [readers.TextExample(str(i), None, "pos" if i % 4 == 0 else "neg") for i in range(40)]
    task = TaskConfig(name="small", type="classification", format="tsv", train="x", cross_validation_folds=5)
    folds = tasks.fold_splits(task, examples)
    assert len(folds) == 5
    held = [i for _, h in folds for i in h]
    assert sorted(held) == list(range(40))
    for train_idx, held_idx in folds:
        assert not set(train_idx) & set(held_idx)
        assert sum(examples[i].label == "pos" for i in held_idx) == 2  # 10 positives over 5 folds
    assert folds == tasks.fold_splits(task, examples)
    other = tasks.fold_splits(task.model_copy(update={"name": "other"}), examples)
    assert other != folds
    with pytest.raises(ValueError, match="cannot make 5 folds"):
        tasks.fold_splits(task, examples[:3])


# -- files that hold nothing usable, caught when the task is planned ----------------------------


@pytest.mark.parametrize(
    "task, files, bad, expected",
    [
        (
            dict(type="classification", format="tsv"),
            {"train": "sentence\tlabel\na b\t1\nc d\t0\n", "validation": "sentence\tlabel\n"},
            "validation",
            "expected a header line, then tab-separated rows with columns 'sentence' and 'label'",
        ),
        (
            dict(type="token_classification", format="conll"),
            {"train": "EU B-ORG\nrejects O\n\n", "validation": ""},
            "validation",
            "expected sentences of one `token ... tag` line per word",
        ),
        (
            dict(type="qa", format="squad"),
            {"train": '{"data": []}'},
            "train",
            'expected SQuAD JSON: {"data": [{"paragraphs"',
        ),
    ],
    ids=["empty-validation-tsv", "empty-conll", "squad-without-data"],
)
def test_a_task_file_without_examples_is_refused_when_the_task_is_planned_naming_it(
    tmp_path, task, files, bad, expected
):
    """The probe's empty validation TSV (IndexError), empty CoNLL file (a TypeError from
    seqeval) and SQuAD `{"data": []}` (no file named) failed inside a fine-tuning job; the
    evaluate stage's planning now reads each task's files first."""
    paths = {split: write(tmp_path / f"{split}.{task['format']}", text) for split, text in files.items()}
    folds = {} if "validation" in paths else {"cross_validation_folds": 2}
    message = _refusal_when_planned({"name": "t", **task, **paths, **folds})
    assert (
        message.startswith(f"{paths[bad]}: no examples for task 't' ({bad} file)")
        and expected in message
        and "\n" not in message
    )


def test_a_classification_train_file_with_one_label_is_refused_when_the_task_is_planned(tmp_path):
    """The probe's train file whose 20 lines all read `__label__pos`: evaluate fine-tuned on it
    and reported success with no word."""
    train = write(tmp_path / "oneclass.ft", "".join(f"__label__pos good film {i}\n" for i in range(20)))
    refused = _refusal_when_planned(
        {"name": "t", "type": "classification", "format": "fasttext", "train": train, "cross_validation_folds": 2}
    )
    assert refused == (
        f"{train}: every one of its 20 examples has the label 'pos'; "
        "task 't' (classification) needs at least two labels in its train file"
    )


def _refusal_when_planned(task: dict) -> str:
    """The TaskDataError that planning the evaluate stage with this one task raises, before
    any job is planned."""
    from types import SimpleNamespace

    from bertcore.config import StorageConfig
    from bertcore.eval.config import EvaluateConfig
    from pipelines.stages.evaluate.plan import Plan, plan_jobs
    from pipelines.storage import Storage

    cfg = EvaluateConfig.model_validate(
        {
            "tasks": [task],
            "intrinsic": {"enabled": False},
            "embeddings": {"enabled": False},
            "speed": {"enabled": False},
            "baseline": False,
        }
    )
    subject = SimpleNamespace(name="pretrained", random_init=False)
    plan = Plan(cfg, {}, [subject], subject, None)
    with pytest.raises(readers.TaskDataError) as refused:
        plan_jobs(plan, SimpleNamespace(storage=Storage(StorageConfig())), 512)
    assert plan.jobs == []
    return str(refused.value)


def test_a_train_file_too_short_for_its_folds_is_refused_when_the_task_is_planned(tmp_path):
    """The probe's 4-line train file with 5 folds failed inside a fine-tuning job, 20 s in,
    with a line that named no file."""
    train = write(tmp_path / "short.tsv", "sentence\tlabel\na good film\t1\na bad film\t0\nfine\t1\ndull\t0\n")
    refused = _refusal_when_planned(
        {"name": "t", "type": "classification", "format": "tsv", "train": train, "cross_validation_folds": 5}
    )
    assert refused == (
        f"{train}: 4 training examples cannot make the 5 cross-validation folds of task 't'; "
        "add examples or lower its cross_validation_folds"
    )
