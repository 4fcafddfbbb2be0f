"""Knowledge distillation: a smaller student trained against a frozen teacher (the distill
stage). config.py is the `distill:` section (light: pydantic only); losses.py the loss
terms on tensors; student.py the student's shape and its start from the teacher;
objective.py the training-loop objective that puts them together.

May import: torch, and the model and train components. Must not import: ray, prefect,
deepspeed (the training loop wraps the objective), eval, or the examples and vocab
components (batches reach it as tensors).
"""
