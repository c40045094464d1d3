#!/usr/bin/env bash
# tools/bench_gpu.py on a lent GPU machine (README, Devices), in two steps:
#
#   bash tools/bench_gpu.sh --fetch        # here, in the repo root: the wheels bbformat needs that the
#                                          # GPU image lacks, for its Python 3.12, into .whl/ (git-ignored
#                                          # through .git/info/exclude), plus ZipNN 0.5.4's sdist
#   bash tools/bench_gpu.sh [OPTIONS]      # there (carry .whl): install them into /tmp/site, build ZipNN
#                                          # from its sdist if the compiler allows, and run
#                                          # tools/bench_gpu.py OPTIONS from the source tree; results go
#                                          # to $OUT (bench_gpu_results.json, BENCHMARKS.md with section 12)
#
# The GPU image has torch with CUDA, numpy, safetensors, transformers and threadpoolctl; bbformat
# runs from the source tree (PYTHONPATH), not pip-installed, so its pinned CPU torch is not pulled.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fetch" ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  mkdir -p .whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl zstandard crc32c construct
  python3 -m pip download -q --no-deps --no-binary=:all: -d .whl zipnn==0.5.4
  ls -l .whl
  exit 0
fi
OUT="${OUT:-/tmp/bench_gpu_out}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site .whl/zipnn-*.tar.gz \
     > "$OUT/zipnn_build.log" 2>&1; then
  echo "ZipNN did not build from its sdist (its row will say not installed): $(tail -n 3 "$OUT/zipnn_build.log" | tr '\n' ' ')"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
cp BENCHMARKS.md "$OUT/BENCHMARKS.md"
PYTHONUNBUFFERED=1 python3 tools/bench_gpu.py --json "$OUT/bench_gpu_results.json" --report "$OUT/BENCHMARKS.md" "$@"
