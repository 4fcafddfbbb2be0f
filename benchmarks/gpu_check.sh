#!/usr/bin/env bash
# GPU checks in one go, for a lent GPU machine without network access (the device tool's
# nvidia-h200: Python 3.12 with torch, transformers, tokenizers, pyarrow, tensorboard,
# nvcc and ninja; no DeepSpeed, pydantic or gensim). Two steps:
#
#   1. here, with pip and a package index:   PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh fetch
#      builds DeepSpeed's wheel (the version installed here) and downloads the cp312
#      wheels the GPU machine lacks into .whl/ (about 32 MB; git-ignored through
#      info/exclude);
#   2. there, from the repository root:     bash benchmarks/gpu_check.sh run [PART...]
#      (device tool: carry [".whl"], timeout_s 600) installs them into /tmp/site and runs
#      the parts (default: the first three, about 9 minutes at most; `run modern` alone), each under its own limit,
#      writing logs and JSON to $OUT:
#        bench     benchmarks/gpu_pretrain.py: BERT-base seq128 bf16, bertcore vs transformers  (<= 2 min)
#        tests     pytest -m gpu tests/unit/test_gpu.py: bf16 ZeRO-2 + FusedAdam on NCCL, crash and
#                  resume, export; FusedLamb at stage 0 (nvcc builds both fused ops)          (<= 4.5 min)
#        compiled  the benchmark again with --compile --deepspeed                             (<= 2.5 min)
#        modern    benchmarks/gpu_modern.py: the modern family (ModernBERT-base, 1,024 tokens, bf16),
#                  bertcore packed vs transformers padded, with its MFU line                    (<= 2 min)
#      A part cut short can be run again alone (e.g. `run compiled`); DeepSpeed's built
#      ops stay in ~/.cache/torch_extensions while the machine is warm.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=.whl

fetch() {
    set -e
    local py=${PYTHON:-python3}
    mkdir -p "$WHEELS"
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qxF "/$WHEELS/" "$exclude" 2>/dev/null || echo "/$WHEELS/" >> "$exclude"
    local ds_version
    ds_version=$($py -c 'from importlib.metadata import version; print(version("deepspeed"))')
    # pure Python without its ops (they are built just in time with nvcc on the GPU machine)
    DS_BUILD_OPS=0 $py -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" "deepspeed==$ds_version"
    local pins
    pins=$($py - <<'EOF'
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in
      ("pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions", "hjson", "gensim", "smart_open")))
EOF
)
    # shellcheck disable=SC2086
    $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEELS" $pins
    ls -l "$WHEELS"
    du -ch "$WHEELS"/* | tail -1
}

run() {
    local out=${OUT:-/tmp/gpu-check}
    mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DS_ACCELERATOR=cuda
    CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
    TORCH_CUDA_ARCH_LIST=$(python3 -c 'import torch; print("{}.{}".format(*torch.cuda.get_device_capability()))')
    export CUDA_HOME TORCH_CUDA_ARCH_LIST
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
    python3 -c 'import torch, transformers, deepspeed; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "deepspeed", deepspeed.__version__)' 2>&1 | tee -a "$out/gpu.txt"
    local parts=("$@")
    [ ${#parts[@]} -eq 0 ] && parts=(bench tests compiled)
    for part in "${parts[@]}"; do
        case "$part" in
            bench) timeout 120 python3 benchmarks/gpu_pretrain.py --json "$out/bench.json" 2>&1 | tee "$out/bench.log" ;;
            tests) timeout 270 python3 -m pytest -q -m gpu tests/unit/test_gpu.py -p no:cacheprovider 2>&1 | tee "$out/pytest.log" ;;
            compiled) timeout 150 python3 benchmarks/gpu_pretrain.py --compile --deepspeed --json "$out/bench-compiled.json" 2>&1 | tee "$out/bench-compiled.log" ;;
            modern) timeout 120 python3 benchmarks/gpu_modern.py --json "$out/modern.json" 2>&1 | tee "$out/modern.log" ;;
            *) echo "unknown part $part (bench, tests, compiled, modern)" >&2 ;;
        esac
    done
}

case "${1:-}" in
    fetch) fetch ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 fetch | run [bench] [tests] [compiled] [modern]" >&2; exit 2 ;;
esac
