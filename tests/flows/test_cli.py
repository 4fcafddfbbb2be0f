"""The `bertpipe` command as a user runs it (a subprocess with its own Ray and Prefect)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BERTPIPE = [sys.executable, "-m", "flows.cli"]


def bertpipe(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # the command's flags decide Prefect's level; a CLI test run in this process before
    # (CliRunner) leaves the level it chose in os.environ, which would override -q
    env.pop("PREFECT_LOGGING_LEVEL", None)
    return subprocess.run([*BERTPIPE, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_demo_data_prints_existing_paths():
    out = bertpipe("demo-data")
    assert out.returncode == 0, out.stderr
    paths = [line.split(": ", 1)[1] for line in out.stdout.splitlines()]
    assert len(paths) == 5 and all(Path(p).exists() for p in paths)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "corpus.min_sentencs=2"], "corpus.min_sentencs: unknown key"),
        (["--set", "corpus.min_sentences=many"], "corpus.min_sentences"),
        (["--only", "trainer"], "unknown stage 'trainer'"),
        (
            ["--set", "corpus.inputs=['/no/such/file.txt']", "--only", "corpus"],
            "corpus.inputs[0]: no file matches /no/such/file.txt",
        ),
    ],
)
def test_user_errors_are_one_line(args, message, tmp_path):
    out = bertpipe("run", "--config", "configs/demo.yaml", "--set", f"run.root={tmp_path}", *args)
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.startswith("bertpipe: error:")]
    assert len(errors) == 1 and message in errors[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "temporary server" not in out.stdout + out.stderr  # refused before Prefect (and Ray) start


def test_help_answers_to_h_everywhere_and_shows_no_bool_metavars():
    for args in (["-h"], ["run", "-h"], ["config", "show", "-h"], ["inspect", "--help"]):
        out = bertpipe(*args)
        assert out.returncode == 0 and out.stdout.startswith("Usage: bertpipe"), (args, out.stderr)
        assert "<bool>" not in out.stdout and "-h, --help" in out.stdout, out.stdout
    assert "--force " in bertpipe("run", "-h").stdout and "-c, --config FILE" in bertpipe("run", "-h").stdout


def test_a_json_error_carries_a_time_like_every_other_line(tmp_path):
    out = bertpipe("--log-format", "json", "run", "--config", "configs/demo.yaml", "--only", "trainer")
    assert out.returncode == 2
    (error,) = [json.loads(line) for line in out.stderr.splitlines() if line.strip()]
    assert error["event"] == "error" and error["level"] == "ERROR" and "unknown stage 'trainer'" in error["message"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", error["time"]), error


def test_version_names_the_package_and_what_it_runs_on():
    out = bertpipe("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("bertpipe ")
    assert all(re.search(rf"\b{name} \d", out.stdout) for name in ("python", "torch", "ray", "prefect")), out.stdout


def test_config_show_prints_the_resolved_recipe_with_credentials_masked(tmp_path):
    import yaml

    out = bertpipe(
        "config",
        "show",
        "--config",
        "configs/demo.yaml",
        "--set",
        f"run.root={tmp_path}",
        "--set",
        "storage.key=AKIASECRETKEYID",
        "--set",
        "storage.secret=very-secret",
        "--set",
        "storage.endpoint_url=https://minio:hunter2@objects.example:9000",
    )
    assert out.returncode == 0, out.stderr
    assert "hunter2" not in out.stdout and "very-secret" not in out.stdout and "AKIASECRETKEYID" not in out.stdout
    shown = yaml.safe_load(out.stdout)
    assert shown["storage"]["key"] == shown["storage"]["secret"] == "****"
    assert shown["storage"]["endpoint_url"] == "https://minio:****@objects.example:9000"
    assert shown["run"]["root"] == str(tmp_path)
    # {demo_data} expanded, defaults filled in
    assert Path(shown["corpus"]["inputs"][0]["uri"]).exists()
    assert shown["examples"]["masked_lm_prob"] == 0.15


def test_json_log_format_is_one_object_per_line(tmp_path):
    """A real run of the corpus stage: logs on stderr and the summary on stdout, all JSON;
    the stage's start, progress and end lines carry their figures as fields."""
    out = bertpipe(
        "--log-format",
        "json",
        "run",
        "--config",
        "configs/demo.yaml",
        "--only",
        "corpus",
        "--set",
        f"run.root={tmp_path}",
        "--set",
        "corpus.inputs=[{uri: '{demo_data}/lee_background.cor', format: lines}]",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in out.stderr.splitlines() if line.strip()]
    (result,) = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    events = {r.get("event"): r for r in records}
    assert events["stage_start"]["stage"] == "corpus"
    assert events["progress"]["label"].startswith("corpus:") and events["progress"]["total"] >= 1
    assert events["stage_end"]["headline"]["documents"] > 0
    assert any(r.get("task_run_name") == "corpus" and "Finished in state" in r["message"] for r in records)
    assert result["event"] == "summary" and [s["state"] for s in result["stages"]] == ["computed"]
    assert result["stages"][0]["headline"] == events["stage_end"]["headline"]


def test_a_stage_that_fails_inside_the_flow_ends_on_its_error_line(tmp_path):
    """The probe's evaluate refusals printed the error, then the hint and Prefect's 'Stopping
    temporary server' line: the last line on the console was not the error."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "A fine first record of several words."}\n{not json\n')
    out = bertpipe(
        "run",
        "--config",
        "configs/demo.yaml",
        "--only",
        "corpus",
        "--set",
        f"run.root={tmp_path / 'root'}",
        "--set",
        f"corpus.inputs=[{{uri: '{bad}', format: jsonl}}]",
    )
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("bertpipe: error: corpus:") and str(bad) in lines[-1], lines[-4:]
    assert any("Stopping temporary server" in line for line in lines[:-1])
    assert "Traceback" not in out.stderr


def test_quiet_leaves_out_the_info_lines(tmp_path):
    out = bertpipe("-q", "run", "--config", "configs/demo.yaml", "--only", "vocab", "--set", f"run.root={tmp_path}")
    assert out.returncode == 2
    assert any(
        line.startswith("bertpipe: error: vocab: the corpus stage has no output") for line in out.stderr.splitlines()
    ), out.stderr
    assert not [
        line for line in out.stderr.splitlines() if "Beginning flow run" in line or "Starting temporary server" in line
    ]


NOISE = (
    "Failed to query Ray Train Controller",  # Ray Train's controller watchdog without a state API
    "Token authentication is enabled",  # Ray choosing token auth by default
    "core_worker.cc",  # the preemption watcher's constructor arguments
    "FutureWarning",  # DeepSpeed calling deprecated torch.distributed names
    "step/s]",  # a relayed progress bar
    "deepspeed_shm_comm_op built successfully",
)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """All five stages through the CLI with the demo recipe, shortened; one run that the
    tests below read: (run root, the finished process, the --set arguments it was given)."""
    tmp_path = tmp_path_factory.mktemp("demo")
    overrides = [
        f"run.root={tmp_path}",
        "vocab.vocab_size=3000",
        "examples.dupe_factor=1",
        "examples.phases=[{name: seq128, max_seq_length: 128, max_predictions_per_seq: 20}]",
        "pretrain.phases=[{name: seq128, steps: 40, batch_size: 16, max_seq_length: 128}]",
        "pretrain.checkpoint_every=20",
        "pretrain.log_every=10",
        "pretrain.eval_every=10",
        (
            "evaluate.tasks=[{name: polarity, type: classification, format: fasttext, "
            "train: '{demo_data}/pang_lee_polarity.cor', encoding: cp1252, cross_validation_folds: 3, "
            "seeds: [1], epochs: 1, batch_size: 16, max_seq_length: 32}, "
            "{name: simlex999, type: word_similarity, format: word_pairs, validation: "
            "'{demo_data}/simlex999.txt', seeds: [1, 2, 3]}]"
        ),
        "evaluate.embeddings.sentences=100",
    ]
    sets = [arg for item in overrides for arg in ("--set", item)]
    out = bertpipe("run", "--config", "configs/demo.yaml", *sets, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp_path, out, sets


@pytest.mark.slow
def test_demo_flow_end_to_end(demo_run):
    """A report at the end, a model transformers loads, then a second run that is cached
    throughout. The same figures read the same wherever they appear: see `figures_agree`."""
    tmp_path, out, sets = demo_run
    stages = ["corpus", "vocab", "examples", "pretrain", "evaluate"]
    lines = [line.split() for line in out.stdout.splitlines() if line.split()[:1] in [[s] for s in stages]]
    assert [(words[0], words[1]) for words in lines] == [(s, "computed") for s in stages]
    report = tmp_path / "eval" / "report.md"
    assert f"report: {report}" in out.stdout
    assert f'from_pretrained("{tmp_path / "pretrain" / "model-mlm"}")' in out.stdout
    console = out.stderr.splitlines() + out.stdout.splitlines()
    assert not [line for line in console if any(noise in line for noise in NOISE)], [
        line for line in console if any(n in line for n in NOISE)
    ]
    summary_lines = out.stdout.split("\nnext:\n")[0].splitlines()  # the table and the verdicts (next: holds paths)
    assert all(len(line) <= 100 for line in summary_lines), max(summary_lines, key=len)
    assert all(len(line) <= 120 for line in out.stderr.splitlines() if ": done in " in line), [
        line for line in out.stderr.splitlines() if ": done in " in line
    ]
    for stage in stages:  # every stage shows progress while it runs
        assert any(line.split(" ", 1)[-1].startswith((f"{stage}: start", f"{stage} ")) for line in console), stage
        assert any(
            re.search(rf" {stage}(: \w+)? \d+/\d+ (units|jobs) ", line) or f"{stage}: steps " in line
            for line in console
        ), stage
    text = report.read_text(encoding="utf-8")
    assert "polarity" in text and "random" in text.lower() and str(tmp_path) not in text  # paths relative to run.root
    assert (tmp_path / "eval" / "metrics.json").exists()

    import transformers

    fill = transformers.pipeline("fill-mask", model=str(tmp_path / "pretrain" / "model-mlm"))
    assert len(fill("The city is on the [MASK] of the river.")) == 5
    _, info = transformers.AutoModelForMaskedLM.from_pretrained(
        str(tmp_path / "pretrain" / "model-mlm"), output_loading_info=True
    )
    assert not info["unexpected_keys"] and not info["missing_keys"]

    status = bertpipe("status", "--config", "configs/demo.yaml", *sets, "--json")
    assert status.returncode == 0, status.stderr
    assert {r["stage"]: r["state"] for r in json.loads(status.stdout)} == dict.fromkeys(stages, "complete") | {
        "distill": "off"
    }  # the demo does not distil
    figures_agree(tmp_path, out, sets)

    again = bertpipe("run", "--config", "configs/demo.yaml", *sets, timeout=600)
    assert again.returncode == 0
    assert "computed" not in again.stdout and again.stdout.count("cached") == 5


@pytest.mark.slow
def test_a_run_writes_the_consoles_lines_and_its_summary_under_the_root(demo_run):
    """The flow run's own log under run.root (flows/run_log.py): the console's lines, in
    order, from where the flow's code starts, then the summary and how the run ended."""
    root, out, _ = demo_run
    path = sorted((root / "_logs").glob("flow-run-*.log"))[0]  # the first run's (names start with its creation time)
    everything = path.read_text(encoding="utf-8").splitlines()
    lines = [line for line in everything if line.split(" ", 2)[1:2] != ["DEBUG"]]
    console = out.stderr.splitlines()
    assert any(
        "DEBUG (TrainController" in line for line in everything
    )  # Ray's relayed lines, kept for the record (the console shows them with -v)

    # the file starts where the flow's code starts, and from there holds the console's lines
    first = next(i for i, line in enumerate(console) if "attempt 1 on" in line and str(path) in line)
    ended = next(i for i, line in enumerate(lines) if line.endswith("run ended: Completed"))
    stages = ("corpus", "vocab", "examples", "pretrain", "evaluate")
    # what `bertpipe run` printed before its `next:` commands: the table (a row per stage, its
    # figures wrapped onto indented lines) and the verdicts
    table = [line for line in out.stdout.split("\nnext:\n")[0].splitlines()[1:] if line.strip()]
    logged = lines[: ended - len(table)]
    assert logged == console[first : first + len(logged)]
    assert any("evaluate: done in" in line for line in logged) and any(
        "Task run 'corpus' - Finished in state Completed" in line for line in logged
    )
    # then the summary `bertpipe run` printed, and how the run ended
    assert [line.split(" ", 1)[1] for line in lines[ended - len(table) : ended]] == table
    rows = [row.split()[0] for row in table[1:] if not row.startswith(" ")]
    assert (
        table[0].startswith("stage")
        and rows[: len(stages)] == list(stages)
        and all(r == "evaluate:" for r in rows[len(stages) :])
    )
    assert lines[-1] == lines[ended]


def tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def figures_agree(root: Path, out: subprocess.CompletedProcess, sets: list[str]) -> None:
    """One run's figures as the console, TensorBoard, `inspect`, the report, `status` and the
    summary show them: the same interval means, the same final and validation figures, the
    same evaluation scores and verdicts, in percent, with the same time."""
    console = out.stderr
    trained = {
        int(m["step"]): m
        for m in re.finditer(
            r"pretrain: steps? (?:\d+-)?(?P<step>\d+)/40 seq128 · loss (?P<loss>[\d.]+) · MLM acc (?P<acc>[\d.]+)%",
            console,
        )
    }
    validated = {
        int(m["step"]): m
        for m in re.finditer(
            (
                r"pretrain: validation at step (?P<step>\d+) \((?P<n>[\d,]+) held-out sequences\) · loss "
                r"(?P<loss>[\d.]+) · MLM acc (?P<acc>[\d.]+)%"
            ),
            console,
        )
    }
    assert (
        sorted(trained) == sorted(validated) == [10, 20, 30, 40]
    )  # four intervals of 10 steps, a validation after each
    board = tensorboard_scalars(root / "pretrain" / "tensorboard")
    for step, line in trained.items():  # TensorBoard holds the interval means the console printed
        assert (
            line["loss"] == f"{board['train/loss'][step]:.3f}"
            and line["acc"] == f"{100 * board['train/mlm_accuracy'][step]:.1f}"
        )
    for step, line in validated.items():
        assert (
            line["loss"] == f"{board['validation/loss'][step]:.3f}"
            and line["acc"] == f"{100 * board['validation/mlm_accuracy'][step]:.1f}"
        )
    last, held = trained[40], validated[40]
    # "final" is the last interval everywhere: inspect, the report, the summary
    inspected = json.loads(bertpipe("inspect", "pretrain", "--root", str(root), "--json").stdout)
    assert (inspected["final"]["first_step"], inspected["final"]["step"]) == (31, 40)
    assert (
        f"{inspected['final']['loss']:.3f}" == last["loss"]
        and f"{100 * inspected['final']['mlm_accuracy']:.1f}" == last["acc"]
    )
    assert [c["step"] for c in inspected["checkpoints"]] == [20, 40]
    assert (
        f"{inspected['checkpoints'][0]['loss']:.3f}" == trained[20]["loss"]
    )  # the interval that ended at the checkpoint
    assert inspected["validation"]["step"] == 40 and f"{inspected['validation']['loss']:.3f}" == held["loss"]
    assert {f["file"] for f in inspected["model"]["files"]} >= {"config.json", "model.safetensors", "vocab.txt"}
    text = bertpipe("inspect", "pretrain", "--root", str(root)).stdout
    assert f"final training figures (mean of steps 31-40): loss {last['loss']}, MLM accuracy {last['acc']}%" in text
    report = (root / "eval" / "report.md").read_text(encoding="utf-8")
    assert f"Final training figures (mean of steps 31-40): loss {last['loss']}, MLM accuracy {last['acc']}%" in report
    assert (
        f"Validation at step 40 ({held['n']} held-out sequences; 4 validations in all): loss {held['loss']}, "
        f"MLM accuracy {held['acc']}%"
    ) in report
    assert (
        f"final loss {last['loss']} (mean of steps 31-40)" in out.stdout
        and f"validation MLM accuracy {held['acc']}%" in out.stdout
    )

    # evaluation: the scores inspect shows are metrics.json's, TensorBoard's and the report's; one verdict text
    # everywhere
    metrics = json.loads((root / "eval" / "metrics.json").read_text(encoding="utf-8"))
    scores = json.loads(bertpipe("inspect", "evaluate", "--root", str(root), "--json").stdout)
    polarity = next(r for r in scores["scores"] if r["name"] == "polarity" and r["metric"] == "accuracy")
    assert (
        polarity["section"] == "fine-tuning"
        and polarity["pretrained"] == metrics["tasks"]["polarity"]["pretrained"]["validation"]["accuracy"]["median"]
    )
    simlex = next(r for r in scores["scores"] if r["name"] == "simlex999" and r["metric"] == "spearman")
    assert simlex["section"] == "no training"  # word similarity trains nothing
    nsp = next(r for r in scores["scores"] if r["metric"] == "nsp_accuracy")
    assert (
        nsp["baseline_name"] == "majority label"
        and nsp["baseline"]
        == metrics["intrinsic"]["seq128"]["pretrained"]["baselines"]["nsp_balance"]["majority_accuracy"]
    )
    board = tensorboard_scalars(root / "eval" / "tensorboard")
    assert board["eval/polarity/accuracy"][40] == pytest.approx(polarity["pretrained"]) and board[
        "eval/simlex999/spearman"
    ][40] == pytest.approx(simlex["pretrained"])
    assert f"| polarity | classification | accuracy | {100 * polarity['pretrained']:.1f}%" in report
    shown = bertpipe("inspect", "evaluate", "--root", str(root)).stdout
    assert "e-0" not in shown and f"{100 * polarity['pretrained']:.1f}%" in shown
    for verdict in metrics["verdicts"]:
        assert f"- {verdict}" in report and f"    {verdict}" in shown
        assert " ".join(f"evaluate: {verdict}".split()) in " ".join(out.stdout.split())  # wrapped within 100 columns
    # the time a stage took: its end line, `status` and the summary say the same
    rows = {
        r["stage"]: r for r in json.loads(bertpipe("status", "--config", "configs/demo.yaml", *sets, "--json").stdout)
    }
    table = bertpipe("status", "--config", "configs/demo.yaml", *sets).stdout
    from bertcore.figures import duration

    for stage in ("pretrain", "evaluate"):
        took = duration(rows[stage]["seconds"])
        assert f"{stage}: done in {took}" in console and re.search(
            rf"^{stage} +computed +{re.escape(took)} ", out.stdout, re.M
        )
        assert re.search(rf"^{stage} +complete .* {re.escape(took)}  ", table, re.M), table
    assert re.search(r"^evaluate +complete +\w+ +- ", table, re.M)  # no row count for a stage that writes reports
