#!/usr/bin/env bash
# Writes the locks from pyproject.toml with uv (docs/dependencies.md says when and how):
#   locks/dev-cpu.txt        make demo, make test and CI: every extra, torch's CPU build
#   locks/lint.txt           make lint and CI's first step: ruff alone
#   locks/cluster-cuda.txt   every node of a cluster (infra/): the runtime, tracking, onnx and
#                            korean extras, torch's CUDA build from PyPI
# Each keeps the versions already pinned unless pyproject.toml rules them out; pass
# --upgrade (or --upgrade-package NAME) to move to the newest versions allowed.
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-uv}
common=(--generate-hashes --custom-compile-command locks/update.sh --python-version 3.11 --python-platform x86_64-manylinux_2_28 --quiet "$@")
# torch's CPU build is not on PyPI: it comes from the folder pip's own configuration names
# (find-links, /opt/wheels on the project's machines) or https://download.pytorch.org/whl/cpu
"$uv" pip compile pyproject.toml --extra dev --override locks/torch-cpu.txt --find-links "${TORCH_CPU_WHEELS:-/opt/wheels}" \
    "${common[@]}" -o locks/dev-cpu.txt
"$uv" pip compile pyproject.toml --extra tracking --extra onnx --extra korean --override locks/torch-cuda.txt \
    "${common[@]}" -o locks/cluster-cuda.txt
# make lint and CI's first step: ruff alone, at the version the dev extra pins
sed -n 's/.*"\(ruff==[^"]*\)".*/\1/p' pyproject.toml | "$uv" pip compile - "${common[@]}" -o locks/lint.txt
