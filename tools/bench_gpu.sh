#!/usr/bin/env bash
# tools/bench_gpu.py on a lent GPU machine (README, Devices), in two steps:
#
#   bash tools/bench_gpu.sh --fetch        # here, in the repo root: the wheels bbformat needs that the
#                                          # GPU image lacks, for its Python 3.12, into .whl/ (git-ignored
#                                          # through .git/info/exclude), plus ZipNN 0.5.4's sdist
#   bash tools/bench_gpu.sh [OPTIONS]      # there (carry .whl and the cp312 extension): install them into
#                                          # /tmp/site, build ZipNN from its sdist if no wheel came, run the
#                                          # GPU tests (PREFLIGHT=0 skips them; a failure stops the run), pack
#                                          # three synthetic sites on the GPU into $OUT, then run
#                                          # tools/bench_gpu.py OPTIONS from the source tree; results go to $OUT
#                                          # (bench_gpu_results.json, BENCHMARKS.md with section 12, logs.tgz).
#                                          # END_BY_S=N: the bench's budget ends N s after this script began;
#                                          # FIXTURES=1 also packs tools/gpu_fixtures.py's files ($OUT/gpu_fixtures.tgz).
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
  # With PY312=<a Python 3.12 with its headers and setuptools>, also build here what the GPU image
  # cannot be relied on to build: ZipNN's wheel and bbformat's codec-3 extension (carry
  # bbformat/codec/_exponent_native.cpython-312-x86_64-linux-gnu.so with .whl).
  if [ -n "${PY312:-}" ]; then
    "$PY312" -m pip wheel -q --no-deps -w .whl .whl/zipnn-0.5.4.tar.gz
    "$PY312" setup.py -q build_ext --inplace
  fi
  ls -l .whl
  exit 0
fi
OUT="${OUT:-/tmp/bench_gpu_out}"
WORK="${WORK:-/tmp/bbformat-gpu}"
mkdir -p "$OUT" "$WORK"
t0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import zipnn" 2>/dev/null && ls .whl/zipnn-*.tar.gz >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site .whl/zipnn-*.tar.gz \
    > "$WORK/zipnn_build.log" 2>&1 ||
    echo "ZipNN did not build from its sdist (its row will say not installed): $(tail -n 3 "$WORK/zipnn_build.log" | tr '\n' ' ')"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -m bbformat --version
trap 'tar czf "$OUT/logs.tgz" -C "$WORK" logs preflight.log 2>/dev/null || true' EXIT
# Preflight: the GPU tests (every digest vector decoded on the device, a GPU pack verified by the
# reference, load_model on the device). A failure stops here, before the long steps.
if [ "${PREFLIGHT:-1}" = 1 ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/test_linalg.py > "$WORK/preflight.log" 2>&1 \
    || { tail -n 30 "$WORK/preflight.log"; echo "preflight failed"; exit 3; }
  tail -n 1 "$WORK/preflight.log"
  if ! tail -n 1 "$WORK/preflight.log" | grep -q passed || tail -n 1 "$WORK/preflight.log" | grep -q skipped; then
    echo "preflight: the GPU tests did not all run (no GPU seen?)"; exit 3
  fi
  # Synthetic D=1024 sites packed on the device, brought back ($OUT) for the C reader and numpy.
  for dt in float16 bfloat16 float32; do
    python3 tools/crosscheck.py --make-synthetic 1024 "$dt" "$OUT/gpu_packed_$dt.bb" --format-version 1.2 --device cuda \
      > /dev/null || echo "synthetic $dt: pack failed"
  done
fi
# FIXTURES=1: tiny containers packed on the device (tools/gpu_fixtures.py), for tests/fixtures/gpu.
if [ "${FIXTURES:-0}" = 1 ]; then
  python3 tools/gpu_fixtures.py "$WORK/gpu_fixtures" --device cuda && tar czf "$OUT/gpu_fixtures.tgz" -C "$WORK" gpu_fixtures \
    || echo "gpu_fixtures failed"
fi
echo "preflight done at $((SECONDS - t0)) s"
cp BENCHMARKS.md "$OUT/BENCHMARKS.md"
if [ -n "${END_BY_S:-}" ]; then left=$((END_BY_S - (SECONDS - t0))); set -- "$@" --budget-s "$((left > 0 ? left : 0))"; fi
PYTHONUNBUFFERED=1 python3 tools/bench_gpu.py --work "$WORK" --json "$OUT/bench_gpu_results.json" --report "$OUT/BENCHMARKS.md" "$@"
