"""Knowledge distillation: a smaller student trained against a frozen teacher (the distill
stage). config.py is the `distill:` section (light: pydantic only); losses.py the loss
terms on tensors; student.py the student's shape and its start from the teacher;
objective.py the training-loop objective that puts them together."""
