#!/usr/bin/env bash
# Run the GPU tests and benchmarks on a GPU machine that has PyTorch, cuda-bindings and
# nvidia-ml-py but not the Jupyter stack (the H200 test machine). Expects, beside the repo:
#   .whl/                      wheels for what the machine lacks (see docs/dev/gpu-tests.md); without
#                              it, what an earlier run on the same machine installed is used
#   .venv/bin/criu + .venv/lib/gpucr-criu/   the CRIU bundle from scripts/install-criu.sh
#   .s3/                       with S3_W2 or S3_RAW: s3fs's wheels and SeaweedFS (scripts/s3-carry.sh)
# GPU_TESTS=" " and BENCH_GB=" " skip the tests and bench_core.
# Writes logs and JSON into ${OUT:-./gpu-out}.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
SITE=/tmp/gpucr-site
. scripts/gpu-site.sh
install_site "$SITE" || exit 1
export PYTHONPATH="$SITE:$PWD:$PWD/kernel_hooks" GPUCR_CRIU="$PWD/.venv/bin/criu" PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=index,name,uuid,memory.used,memory.total,driver_version --format=csv; } | tee "$OUT/machine.txt"
python3 -m jupyter_gpucr.cli.main doctor | tee "$OUT/doctor.txt"
if [ -n "${S3_W2:-}${S3_RAW:-}" ]; then  # s3fs and /tmp/weed, for these and tests/gpu/test_gpu_store.py
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .s3/*.whl || exit 1
    python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.s3/weed.xz'), open('/tmp/weed', 'wb'))" && chmod +x /tmp/weed || exit 1
fi
GPU_TESTS=${GPU_TESTS:-tests/gpu/test_gpu.py tests/gpu/test_gpu_offload.py tests/gpu/test_gpu_server.py tests/core/test_core.py tests/server/test_snapshot_engine.py}
if [ -n "${GPU_TESTS// }" ]; then
    python3 -m pytest $GPU_TESTS -p no:cacheprovider -q -rs 2>&1 | tee "$OUT/gpu-tests.log"
fi
for gb in ${BENCH_GB:-2 8}; do
    python3 bench/bench_core.py --cpu-gb 2 --gpu-gb "$gb" --store /dev/shm/gpucr-bench-$gb --json-out "$OUT/bench-$gb.json" \
        2>&1 | grep -v 'RLIMIT_NOFILE\|network-lock will be ignored' | tee "$OUT/bench-$gb.log"
    rm -rf /dev/shm/gpucr-bench-$gb
done
# The W2 cell alone in a plain process and in kernels, side by side (CELL_ROUNDS=5 to run it).
if [ -n "${CELL_ROUNDS:-}" ]; then
    python3 bench/bench_cell.py --kind gpu --rounds "$CELL_ROUNDS" --json-out "$OUT/cell.json" 2>&1 | grep -v 'without encryption' | tee "$OUT/cell.log"
fi
# Issue 11's W2 notebook through the real server (W2_ROUNDS=2 to run it; W2_ARGS=--no-raw and such).
if [ -n "${W2_ROUNDS:-}" ]; then
    python3 bench/bench_w2.py --kind gpu --store /dev/shm/gpucr-w2 --rounds "$W2_ROUNDS" --json-out "$OUT/w2.json" ${W2_ARGS:-} \
        2>&1 | grep -v 'RLIMIT_NOFILE\|network-lock will be ignored' | tee "$OUT/w2.log"
    rm -rf /dev/shm/gpucr-w2
fi
# A second W2 run with other options (W2_AGAIN="--gap 3", say), beside the first.
if [ -n "${W2_AGAIN:-}" ]; then
    python3 bench/bench_w2.py --kind gpu --store /dev/shm/gpucr-w2-again --rounds 2 --no-raw $W2_AGAIN --json-out "$OUT/w2-again.json" \
        2>&1 | grep -v 'RLIMIT_NOFILE\|network-lock will be ignored' | tee "$OUT/w2-again.log"
    rm -rf /dev/shm/gpucr-w2-again
fi
# The same to a disk store, each resume from a cold page cache (W2_DISK=1 to run it).
if [ -n "${W2_DISK:-}" ]; then
    python3 bench/bench_w2.py --kind gpu --store /root/gpucr-w2-disk --rounds 1 --no-raw --cold --json-out "$OUT/w2-disk.json" ${W2_DISK_ARGS:-} \
        2>&1 | grep -v 'RLIMIT_NOFILE\|network-lock will be ignored' | tee "$OUT/w2-disk.log"
    rm -rf /root/gpucr-w2-disk
fi
# The store's raw rate against gpucr's transfers of the same bytes, SeaweedFS's data in /dev/shm
# (S3_RAW=1 to run it; S3_RAW_ARGS="--gb 8 --s3-data /root/gpucr-raw-s3" and such).
if [ -n "${S3_RAW:-}" ]; then
    python3 bench/bench_store_raw.py --gb 8 --rounds 1 --raw boto3:8:32 boto3:16:32 boto3:32:32 --weed /tmp/weed --json-out "$OUT/store-raw.json" ${S3_RAW_ARGS:-} \
        2>&1 | tee "$OUT/store-raw.log"
    rm -rf /dev/shm/gpucr-raw-files /dev/shm/gpucr-raw-s3
fi
# W2 suspended into a local S3 server (SeaweedFS, its data on this disk) against the local disk
# (S3_W2=1 to run it; S3_W2_ARGS="--rounds 2" and such).
if [ -n "${S3_W2:-}" ]; then
    { /tmp/weed version 2>/dev/null | grep '^version'; python3 -c "import aiohttp, botocore, aiobotocore, fsspec, s3fs, yarl, multidict, wrapt, urllib3
print(*(f'{m.__name__} {m.__version__}' for m in (aiohttp, botocore, aiobotocore, fsspec, s3fs, yarl, multidict, wrapt, urllib3)), sep=', ')"; } \
        2>&1 | tee "$OUT/w2-store.log"
    python3 bench/bench_w2_store.py --kind gpu --weed /tmp/weed --local-store /root/gpucr-w2-store/local \
        --s3-data /root/gpucr-w2-store/s3-data --caches /root/gpucr-w2-store --json-out "$OUT/w2-store.json" ${S3_W2_ARGS:-} \
        2>&1 | grep -v 'RLIMIT_NOFILE\|network-lock will be ignored' | tee -a "$OUT/w2-store.log"
    rm -rf /root/gpucr-w2-store
fi
