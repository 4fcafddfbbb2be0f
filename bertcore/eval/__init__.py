"""Evaluation of a pretrained encoder: held-out pretraining metrics, fine-tuning on
classification, regression, tagging and extractive QA tasks against a no-pretraining
baseline, and sentence-embedding quality.

Modules: `metrics` (scores), `tasks` (TaskConfig and file readers), `qa` (SQuAD windows
and span decoding), `finetune` (one seeded CPU fine-tuning run per task), `embeddings`
(anisotropy and STS for CLS vs mean pooling). Import the module you need; this package
imports nothing heavy on its own.

May import: torch, transformers (baselines only), scikit-learn, matplotlib (plots, inside
the functions that draw), and the text, vocab, examples, model and train components. Must
not import: ray, prefect, deepspeed, or inference and distill (they import it).
"""
