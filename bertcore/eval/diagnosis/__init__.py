"""Why a fine-tune underperforms, measured (`bertpipe diagnose`): each module computes one
area's findings from a task's files and the fine-tuning runs that `run.py` makes, in the
calling process, seeded, on the CPU or the GPU it sees.

- findings.py: a finding (severity, one line of evidence, what to try, the figures), worst first
- data.py: validation rows also in the training file (exact and near), label balance and
  the majority-class score, inputs longer than max_seq_length, empty, duplicate and
  malformed rows
- labels.py: suspect labels from out-of-fold probabilities (cleanlab's confident learning),
  the largest out-of-fold residuals for a score, the lowest F1 for QA
- optimisation.py: the learning-rate sweep, the loss curves, early stopping's epoch
- start.py: the path from pretraining (exported weights, tokenizer, pair layout, pooler),
  forgetting (held-out MLM accuracy before and after fine-tuning) and pretrained against
  random init
- errors.py: confusion matrix, per-class scores, the worst-scored validation examples
- seeds.py: the seed spread against the gain
- run.py: the fine-tuning runs and the findings of one task and model (`diagnose`)
- report.py: diagnosis.md; files.py: the machine-readable files and plots

May import: the other modules of bertcore/eval (kinds, finetune, tasks, summary, metrics,
diagnostics), bertcore.model, numpy, scikit-learn, torch, and inside the functions that
need them cleanlab (the `diagnose` extra) and matplotlib. Must not import: ray, prefect,
pipelines or flows (flows/diagnosis.py runs it for the command).
"""
