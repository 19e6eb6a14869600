#!/usr/bin/env bash
# Everything issue #15 asks of a CUDA machine, in one command, from the repository root:
#   1. the CUDA test cases (CPU vs GPU labels identical, images within one level, CudaPrefetcher),
#      which skip on machines without a GPU;
#   2. scripts/bench_augment.py --device cuda: shardkit's torch path against Kornia on the same batches
#      (the Kornia row needs `pip install --no-deps kornia kornia_rs`; without it the row is skipped with a note);
#   3. scripts/bench_train.py --augment: the data wait of a deeplabv3_resnet50 step with augmentation on the GPU
#      and in the workers (needs torchvision; skipped with a note when it does not import).
#
#   bash scripts/gpu_checks.sh [DATA]     DATA: the folder holding camvid-segnet (default $SHARDKIT_TEST_DATA,
#                                         else ../shared/data); output under $OUT (default ./gpu-checks)
set -euo pipefail
DATA=${1:-${SHARDKIT_TEST_DATA:-../shared/data}}
OUT=${OUT:-gpu-checks}
SPEC=${SPEC:-scale=0.5:2,crop=352x480,hflip,rotate=10,jitter=0.2}
export SHARDKIT_TEST_DATA=$DATA
mkdir -p "$OUT"
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 2)" \
  || { echo "gpu_checks: no CUDA device visible to torch" >&2; exit 2; }
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/device.txt"

python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/augment/test_torch.py tests/augment/test_cutout.py tests/augment/test_bands.py \
  tests/augment/test_outputs.py tests/augment/test_gather.py tests/read/test_torch_cuda.py 2>&1 | tee "$OUT/tests.txt"

python3 scripts/bench_augment.py "$DATA/camvid-segnet" --device cuda --workers 0 --batch 32 --batches 20 \
  --rounds 1 --spec "$SPEC" --json "$OUT/bench_augment.json" 2>&1 | tee "$OUT/bench_augment.txt"

if python3 -c "import torchvision" 2>/dev/null; then
  python3 scripts/bench_train.py --data "$DATA/camvid-segnet" --model deeplabv3_resnet50 --workers 2 \
    --augment "$SPEC" --json "$OUT/bench_train.json" 2>&1 | tee "$OUT/bench_train.txt"
else
  echo "note: bench_train skipped: torchvision does not import" | tee "$OUT/bench_train.txt"
fi
