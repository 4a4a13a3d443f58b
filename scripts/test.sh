#!/usr/bin/env bash
# Set everything up (idempotent) and run the whole test suite: Python tests (real jupyter
# servers, kernels and CRIU), jupyter_client's and jupyter_server's own kernel and session tests
# with gpucr on (scripts/peer-tests.sh), the JupyterLab UI tests in Debian's chromium, and the
# documentation site's build with warnings as errors (into .cache/docs-html).
# pytest's exit code 5 ("no tests collected") counts as a failure here: the suite must run.
set -uo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"
bash scripts/setup.sh || exit 1
rc=0
# Every process a test leaves suspended keeps a CRIU network lock (an nftables table) after its
# store is deleted; Linux allows 1024 of them per host. Drop the ones this run adds, at exit.
locks=$(mktemp)
.venv/bin/python -c 'from jupyter_gpucr.core.criu.commands import network_lock_tables as t; print("\n".join(t()))' > "$locks" 2>/dev/null
trap '.venv/bin/python -c "import sys; from jupyter_gpucr.core.criu.commands import drop_network_locks_except as d; d(set(open(sys.argv[1]).read().split()))" "$locks" 2>/dev/null; rm -f "$locks"' EXIT
# Each lock is a table every packet on the host goes through: hundreds of them (left by test runs
# outside this script) slow loopback traffic and leave this run few to take. Say how many there are.
echo "test: CRIU network locks held before the run: $(grep -c . "$locks") of 1024"
# Lint and types first: cheap, and a failure here fails the run like a failed test.
echo "test: ruff and mypy"
.venv/bin/ruff check jupyter_gpucr tests bench kernel_hooks || rc=1
.venv/bin/mypy || rc=1
# tests/peer holds jupyter_client's and jupyter_server's own tests; they run below, on their own.
.venv/bin/python -m pytest tests --ignore=tests/peer -p no:cacheprovider -q "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test: pytest collected no tests; that is a failure" >&2
fi
echo "test: the documentation site (sphinx -W; internal links and references checked, no network)"
.venv/bin/python -m sphinx -W --keep-going -q -b html docs .cache/docs-html || rc=1
peer_rc=0
bash scripts/peer-tests.sh || peer_rc=$?
[ "$rc" -ne 0 ] || rc=$peer_rc
if [ -x ui-tests/run.sh ] && [ -z "${GPUCR_SKIP_UI:-}" ]; then
    ui_rc=0
    bash ui-tests/run.sh || ui_rc=$?
    [ "$rc" -ne 0 ] || rc=$ui_rc
fi
exit "$rc"
