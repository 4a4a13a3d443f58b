#!/usr/bin/env bash
# Run jupyter_client's and jupyter_server's own kernel and session tests (pinned copies in
# tests/peer/) with gpucr turned on, and print pytest's summary of each. Deliberate differences
# are skipped with their reason (docs/peer-suites.md). Extra arguments go to both pytest runs.
# Exit code: 0 when both suites pass; pytest's "no tests collected" (5) counts as a failure.
set -uo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON="$REPO_ROOT/.venv/bin/python"
PEER="$REPO_ROOT/tests/peer"

run_suite() {  # run_suite DIR TESTS...: each suite has its own rootdir, pytest.ini and 'tests' package
    local dir=$1 rc=0
    shift
    echo "== peer suite: $(basename "$dir")"
    (cd "$dir" && "$PYTHON" -m pytest -q "$@") || rc=$?
    if [ "$rc" -eq 5 ]; then
        echo "peer-tests: pytest collected no tests in $dir; that is a failure" >&2
    fi
    return "$rc"
}

rc=0
run_suite "$PEER/jupyter_client" test_gpucr_active.py tests/test_kernelmanager.py tests/test_provisioning.py "$@" || rc=$?
server_rc=0
run_suite "$PEER/jupyter_server" test_gpucr_active.py tests/services/kernels tests/services/sessions "$@" || server_rc=$?
[ "$rc" -ne 0 ] || rc=$server_rc
exit "$rc"
