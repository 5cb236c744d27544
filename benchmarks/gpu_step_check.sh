#!/usr/bin/env bash
# DP-Sinkhorn's private step on a GPU, in one go (a few minutes):
#
#     bash benchmarks/gpu_step_check.sh OUT_DIR [AUTHORS_CODE]
#
# 1. the GPU-only tests: a private step under torch.cuda.set_sync_debug_mode("error"), captured
#    solves releasing what eager ones release bit for bit, device-resident Poisson batches;
# 2. the step side by side (this package eager and with --cuda-graphs, the authors'
#    configuration), MNIST settings (benchmarks/bench_dp_sinkhorn_step.py), with the operations
#    and host waits per step.
# Writes OUT_DIR/gpu_tests.txt, OUT_DIR/step_eager.json and OUT_DIR/step_graphs.json.
# AUTHORS_CODE (optional): a checkout of https://github.com/nv-tlabs/DP-Sinkhorn_code; step 2 then
# also times the authors' own step (the ``authors`` side, --authors-code AUTHORS_CODE).
set -euo pipefail
out=${1:?usage: bash benchmarks/gpu_step_check.sh OUT_DIR [AUTHORS_CODE]}
authors=()
if [[ -n "${2:-}" ]]; then authors=(authors --authors-code "$2"); fi
mkdir -p "$out"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
python -m pytest -q -rs -p no:cacheprovider -k "gpu or cuda" \
    tests/methods/test_dp_sinkhorn.py tests/data/test_tensor_batches.py 2>&1 \
    | tee "$out/gpu_tests.txt"
python benchmarks/bench_dp_sinkhorn_step.py --device cuda --steps 100 --warmup 10 \
    --sides new released "${authors[@]}" --out "$out/step_eager.json" > /dev/null
python benchmarks/bench_dp_sinkhorn_step.py --device cuda --steps 100 --warmup 10 \
    --sides new released "${authors[@]}" --cuda-graphs --out "$out/step_graphs.json" > /dev/null
python - "$out" <<'PY'
import json, sys
for name in ("step_eager", "step_graphs"):
    data = json.load(open(f"{sys.argv[1]}/{name}.json"))
    for side in data["results"]:
        print(name, data["device"], side["side"], side["step_ms_median"], "ms",
              side["ops_per_step"], "ops", side["host_waits_per_step"], "waits")
PY
