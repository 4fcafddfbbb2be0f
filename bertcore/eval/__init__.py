"""Evaluation of a pretrained encoder: held-out pretraining metrics, fine-tuning on tasks
of every kind (classification, regression, tagging, extractive QA, multiple choice; word
similarity trains nothing) against a no-pretraining baseline, and sentence-embedding quality.

Modules: `config` (the evaluate section, TaskConfig) over `settings` (a task's settings and
the named choices), `kinds/` (one module per task kind and the registry of them),
`readers` (row-checked reading of task files), `tasks` (a task's splits, file checks and
folds), `finetune` (one seeded fine-tuning run per task), `metrics` (scores), `summary`
(verdicts and the headline), `report` (the markdown report), `scores` (the scores as flat
rows and strict JSON), `embeddings` (anisotropy and STS for CLS vs mean pooling),
`diagnostics` (the path from pretraining to fine-tuning), `diagnosis/` (why a fine-tune
underperforms: `bertpipe diagnose`'s findings and files). Import the module you need; this
package imports nothing heavy on its own.

May import: torch, transformers (baselines only), scikit-learn, matplotlib (plots, inside
the functions that draw), cleanlab (diagnosis/labels.py, inside its function), and the
text, vocab, examples, model and train components. Must not import: ray, prefect,
deepspeed, or inference and distill (they import it).
"""
