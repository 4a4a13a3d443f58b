#!/usr/bin/env bash
# Run jupyter_client's and jupyter_server's own kernel and session tests with gpucr turned on, and
# print pytest's summary of each. The tests are not kept in this repository: the sdists of the
# versions installed in .venv are downloaded (`pip download --no-deps --no-binary :all:`, through the
# machine's pip configuration), cached in .cache/peer-sdists/, and their tests/ folders extracted into
# .cache/peer-run/. What gpucr adds stays in tests/peer/ and is laid over them: each suite's
# conftest.py (gpucr on, and the deliberate differences skipped with their reason:
# docs/dev/peer-suites.md), pytest.ini and test_gpucr_active.py. Extra arguments go to both pytest runs.
# Exit code: 0 when both suites pass; a failed download, an sdist without tests, or pytest's
# "no tests collected" (5) is a failure.
set -uo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON="$REPO_ROOT/.venv/bin/python"
PEER="$REPO_ROOT/tests/peer"
CACHE="$REPO_ROOT/.cache/peer-sdists"
RUN="$REPO_ROOT/.cache/peer-run"

fail() { echo "peer-tests: $*" >&2; exit 1; }

installed_version() {  # installed_version DIST
    "$PYTHON" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$1" \
        || fail "$1 is not installed in $REPO_ROOT/.venv (run scripts/setup.sh)"
}

sdist() {  # sdist DIST VERSION: the cached sdist's path, downloaded first if missing
    local dist=$1 ver=$2 file tmp
    file=$(find "$CACHE" -maxdepth 1 -name "${dist}-${ver}.tar.gz" 2>/dev/null | head -n1)
    if [ -z "$file" ]; then
        mkdir -p "$CACHE"
        tmp=$(mktemp -d "$CACHE/.download.XXXXXX")
        echo "peer-tests: downloading the ${dist} ${ver} sdist (once; cached in ${CACHE#"$REPO_ROOT"/})" >&2
        if ! "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "${dist}==${ver}" >&2; then
            rm -rf "$tmp"
            fail "could not download the ${dist} ${ver} sdist (pip download --no-deps --no-binary :all: ${dist}==${ver}); the peer suites need it once, then it is cached: check the network and pip's index configuration, or put the file in ${CACHE}/"
        fi
        file=$(find "$tmp" -maxdepth 1 -name "*.tar.gz" | head -n1)
        [ -n "$file" ] || { rm -rf "$tmp"; fail "pip download of ${dist} ${ver} gave no .tar.gz sdist"; }
        mv "$file" "$CACHE/${dist}-${ver}.tar.gz" && rm -rf "$tmp"
        file="$CACHE/${dist}-${ver}.tar.gz"
    fi
    echo "$file"
}

prepare() {  # prepare DIST: a fresh run folder with upstream's tests/ and gpucr's files over it
    local dist=$1 ver file dir top
    ver=$(installed_version "$dist") || exit 1
    file=$(sdist "$dist" "$ver") || exit 1
    dir="$RUN/$dist"
    rm -rf "$dir" && mkdir -p "$dir"
    top=$(tar -tzf "$file" | head -n1 | cut -d/ -f1)
    tar -xzf "$file" -C "$dir" --strip-components=1 "$top/tests" "$top/LICENSE" 2>/dev/null \
        || fail "the ${dist} ${ver} sdist ($file) has no tests/ folder: its tests cannot be run from it"
    [ -f "$dir/tests/conftest.py" ] || fail "the ${dist} ${ver} sdist has no tests/conftest.py"
    cp "$PEER/$dist/conftest.py" "$PEER/$dist/pytest.ini" "$PEER/$dist/test_gpucr_active.py" "$dir/"
    echo "$dir"
}

run_suite() {  # run_suite DIST TESTS...: each suite has its own rootdir, pytest.ini and 'tests' package
    local dist=$1 dir rc=0
    shift
    dir=$(prepare "$dist") || return 1
    echo "== peer suite: $dist $(installed_version "$dist") (upstream tests from its sdist)"
    (cd "$dir" && "$PYTHON" -m pytest -q "$@") || rc=$?
    if [ "$rc" -eq 5 ]; then
        echo "peer-tests: pytest collected no tests in $dir; that is a failure" >&2
    fi
    return "$rc"
}

rc=0
run_suite jupyter_client test_gpucr_active.py tests/test_kernelmanager.py tests/test_provisioning.py "$@" || rc=$?
server_rc=0
run_suite jupyter_server test_gpucr_active.py tests/services/kernels tests/services/sessions "$@" || server_rc=$?
[ "$rc" -ne 0 ] || rc=$server_rc
exit "$rc"
