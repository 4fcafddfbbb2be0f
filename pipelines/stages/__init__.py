"""The stages' declarations, one module per stage: each holds the stage's `Stage(...)`
(pipelines/stage.py) and the light functions it names (`identify`, `inherit`, `check`).
They import only config sections and light modules, because the registry imports all of
them whenever a recipe loads (`bertpipe status`, `config show`, `--help`, the Prefect
form). What a stage does lives in `pipelines/<name>.py`, named here by its dotted name
(`run="pipelines.<name>:run"`) and imported only when the stage runs.
"""
