#!/usr/bin/env bash
# Fill .s3/ (in the repo root, ignored by git) with what the H200 lacks for bench/bench_w2_store.py
# and bench/bench_store_raw.py:
# the Python 3.12 wheels of s3fs and of what it needs beyond the machine's own packages (aiohttp,
# yarl, multidict, frozenlist, fsspec's dependencies, urllib3 and wrapt are there; python-dateutil
# and six come with .whl/), at .venv's versions, and SeaweedFS's `weed` binary, xz-compressed.
# The device tool carries it (64 MiB in all, with the CRIU bundle); scripts/gpu-run.sh installs it
# when S3_W2 is set.
#
#   WEED=/path/to/weed bash scripts/s3-carry.sh        # compresses it (about 2 minutes)
#   WEED_XZ=/path/to/weed.xz bash scripts/s3-carry.sh  # takes one compressed already
#
# botocore's wheel holds the API models of every AWS service (16 MB); the one put here keeps those
# of S3 and of the credential services (STS, SSO, sign-in) only, with its RECORD rewritten to match.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LIMIT=48000000
exclude=$(git rev-parse --git-path info/exclude)
grep -qxF '/.s3/' "$exclude" || echo '/.s3/' >> "$exclude"
rm -rf .s3 && mkdir .s3
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
# boto3 and s3transfer: the plain client bench/bench_store_raw.py compares gpucr's transfers with
for pkg in s3fs aiobotocore botocore jmespath aioitertools fsspec boto3 s3transfer; do  # fsspec: s3fs pins its exact version
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .s3 "$pkg==$(version "$pkg")"
done
python3 - .s3/botocore-*.whl <<'EOF'
"""Rewrite botocore's wheel in place without the API models of services gpucr does not call."""
import base64, hashlib, sys, zipfile
KEEP = {"s3", "sts", "sso", "sso-oidc", "signin"}
path = sys.argv[1]
with zipfile.ZipFile(path) as z:
    files = {i.filename: z.read(i) for i in z.infolist()
             if not (i.filename.startswith("botocore/data/") and i.filename.count("/") > 2
                     and i.filename.split("/")[2] not in KEEP)}
record = next(n for n in files if n.endswith(".dist-info/RECORD"))
lines = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
         for n, d in files.items() if n != record]
files[record] = ("\n".join([*lines, f"{record},,"]) + "\n").encode()
with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
    for n, d in files.items():
        z.writestr(n, d)
EOF
if [ -n "${WEED_XZ:-}" ]; then
    cp "$WEED_XZ" .s3/weed.xz
else
    WEED=${WEED:-$(command -v weed)}
    xz -T1 -c --x86 --lzma2=preset=9e,dict=192MiB "$WEED" > .s3/weed.xz  # the x86 filter: 2 % smaller for this binary
fi
size=$(du -cb .s3 | tail -1 | cut -f1)
ls -l .s3
echo ".s3/: $size bytes"
[ "$size" -lt "$LIMIT" ] || { echo "over $LIMIT bytes: too large to carry beside the CRIU bundle" >&2; exit 1; }
