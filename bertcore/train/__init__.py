"""The one training loop and what it is built from, for every training stage (pretrain,
distill).

Owns: `trainer.py` (one worker's loop: set-up, resume on any world size, step, validate,
save), `phase_data.py` (what a worker reads: its place, each phase's examples and batches),
`objectives.py` (what a step optimises: MLM+NSP, MLM only; distillation brings its
own from bertcore/distill/), `optim.py` (schedule, LAMB, parameter groups, the DeepSpeed
JSON), `checkpoint.py` (checkpoint files and their bookkeeping), `loader.py` (batches from
examples shards, a window at a time), `records.py` (a window's records read from the
shards' maps), `shard_cache.py` (the machine's bounded cache the
shards come through), `loss_watch.py` (divergence), `metrics_log.py` (metrics.jsonl,
validation.jsonl), `mfu.py`, `op_builds.py` (DeepSpeed's compiled ops and its import),
`tracking.py` (TensorBoard, MLflow, W&B), `export.py` (a checkpoint as a Hugging Face
folder) and `config.py` (TrainingConfig, the settings the loop shares, and the `pretrain:`
section; pydantic only).

May import: torch, deepspeed (trainer, op_builds, export only, always through
op_builds.import_deepspeed), and the model, examples and vocab components. Must not import:
ray or prefect (the stages launch the loop; the loop knows nothing of Ray), or eval.
`config.py` and this __init__ import no torch, so reading a recipe stays light.
"""
