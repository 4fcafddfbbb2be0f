"""One folder per stage, `pipelines/stages/<name>/`:

- `__init__.py`, the declaration: the stage's `Stage(...)` (pipelines/stage.py) and the
  light functions it names (`identify`, `inherit`, `check`, `preflight`). It imports only
  config sections and light modules, because the registry imports every declaration
  whenever a recipe loads (`bertpipe status`, `config show`, `--help`, the Prefect form).
- `work.py`, what the stage does: `run`, named in the declaration by its dotted name
  (`run="pipelines.stages.<name>.work:run"`) and imported only when the stage runs. It and
  the stage's other helpers (`corpus/inputs.py`, `evaluate/jobs.py`, ...) may import Ray,
  torch and pyarrow, the machinery at the top of pipelines/ and `pipelines/training/`.

No stage imports another stage's folder (tests/repo/test_architecture.py).
"""
