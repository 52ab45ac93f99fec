#!/usr/bin/env bash
# GPU check of the triton backend (issue #9), under 5 minutes on one H100/H200-class GPU:
#   1. the conformance tests of tests/test_triton.py, compiled and run on CUDA (the same tests CI
#      runs in Triton's CPU interpreter), in parallel so that kernel compilation overlaps;
#   2. the quick GPU benchmark: triton vs SDPA (flash) and FlexAttention, bf16, n = 1k and 8k,
#      d = 64 and 128, mask kinds none/causal/window/documents/alibi, fwd and fwd+bwd, with the
#      issue's targets judged at d = 128, n = 8192. Writes bench-results/gpu.json and prints the table.
# Usage: scripts/gpu_check.sh   (PY=path/to/python to use another interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
START=$(date +%s)

"$PY" - <<'PYEOF'
import torch, triton
assert torch.cuda.is_available(), "no CUDA device: this script checks the GPU path"
print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}", flush=True)
PYEOF

echo "== 1/2 conformance on CUDA (tests/test_triton.py, not slow)"
timeout 150 "$PY" -m pytest -q -x -n 8 -m "not slow" -p no:cacheprovider tests/test_triton.py

echo "== 2/2 benchmark (quick preset)"
mkdir -p bench-results
timeout 240 "$PY" -m attnlab bench --device cuda --quick --json bench-results/gpu.json
echo "== done in $(( $(date +%s) - START )) s; results in bench-results/gpu.json"
