#!/usr/bin/env bash
# Run the jupyter-gpucr UI tests (Galata / Playwright) against a real Jupyter server.
#
#   bash ui-tests/run.sh                 # all tests
#   bash ui-tests/run.sh -g 'refused'    # extra arguments go to `playwright test`
#
# From a fresh clone, after `bash scripts/setup.sh` (which makes .venv with jupyterlab and
# jupyter-gpucr installed). This script:
#   1. puts .venv/bin first on PATH (GPUCR_VENV=... to use another environment),
#   2. installs Debian's chromium when /usr/bin/chromium is missing (GPUCR_CHROMIUM=... to use
#      another one); Playwright never downloads a browser (PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1),
#   3. installs the node packages of ui-tests/ (and of labextension/ when it must be built),
#   4. builds the JupyterLab extension when labextension/ is newer than jupyter_gpucr/labextension,
#   5. starts `jupyter lab --config ui-tests/jupyter_server_test_config.py` (token off, a temporary
#      root dir and checkpoint store, gpucr enabled) on 127.0.0.1:$GPUCR_UI_PORT (default 8899),
#   6. runs the extension's unit tests (`jlpm test` in labextension/: node's test runner), then
#      `playwright test`, stops the server, and leaves screenshots in
#      ui-tests/test-results/screenshots, the HTML report in ui-tests/test-results/report and the
#      server log in ui-tests/test-results/jupyter-server.log.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
T0=$(date +%s)
say() { printf 'ui-tests: %s\n' "$*"; }
fail() { printf 'ui-tests: FAILED: %s\n' "$*" >&2; exit 1; }
since() { echo "$(( $(date +%s) - T0 ))s"; }

# 1. environment
VENV=${GPUCR_VENV:-$REPO/.venv}
if [ -x "$VENV/bin/jupyter" ]; then
    export PATH="$VENV/bin:$PATH"
fi
command -v jupyter >/dev/null || fail "no jupyter on PATH: run 'bash scripts/setup.sh' first (or set GPUCR_VENV)"
command -v jlpm >/dev/null || fail "no jlpm on PATH (it comes with jupyterlab): run 'bash scripts/setup.sh' first"
command -v node >/dev/null || fail "node is not installed (apt-get install nodejs, node >= 18)"
python -c 'import jupyter_gpucr' 2>/dev/null || fail "jupyter_gpucr is not importable from $(command -v python): run 'bash scripts/setup.sh'"
python -c 'import ipywidgets' 2>/dev/null || fail "ipywidgets (widgets.spec.ts; in the test extra) is not installed: run 'bash scripts/setup.sh'"

# 2. browser
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
export GPUCR_CHROMIUM=${GPUCR_CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$GPUCR_CHROMIUM" ]; then
    [ "$GPUCR_CHROMIUM" = /usr/bin/chromium ] || fail "GPUCR_CHROMIUM=$GPUCR_CHROMIUM does not exist"
    say "installing Debian's chromium"
    [ "$(id -u)" -eq 0 ] || fail "need root to apt-get install chromium (or set GPUCR_CHROMIUM)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null \
        || fail "apt-get install chromium failed"
fi

# 3. node packages
needs_install() {  # $1: package dir
    [ ! -d "$1/node_modules" ] || [ "$1/package.json" -nt "$1/node_modules/.yarn-state.yml" ] \
        || [ "$1/yarn.lock" -nt "$1/node_modules/.yarn-state.yml" ]
}
if needs_install "$HERE"; then
    say "jlpm install (ui-tests)"
    (cd "$HERE" && jlpm install >"$HERE/jlpm-install.log" 2>&1 && touch node_modules/.yarn-state.yml) \
        || { tail -30 "$HERE/jlpm-install.log"; fail "jlpm install in ui-tests"; }
fi

# 4. extension build
EXT="$REPO/labextension"
BUILT="$REPO/jupyter_gpucr/labextension/static/style.js"
if [ ! -f "$BUILT" ] || [ -n "$(find "$EXT/src" "$EXT/style" "$EXT/schema" "$EXT/package.json" -newer "$BUILT" -print -quit)" ]; then
    if needs_install "$EXT"; then
        say "jlpm install (labextension)"
        (cd "$EXT" && jlpm install >"$EXT/jlpm-install.log" 2>&1 && touch node_modules/.yarn-state.yml) \
            || { tail -30 "$EXT/jlpm-install.log"; fail "jlpm install in labextension"; }
    fi
    say "building the JupyterLab extension"
    (cd "$EXT" && jlpm build >"$EXT/build.log" 2>&1) || { tail -30 "$EXT/build.log"; fail "jlpm build in labextension"; }
fi

# 4b. unit tests of the extension's logic (formatting, state labels, events, notifications)
if needs_install "$EXT"; then
    (cd "$EXT" && jlpm install >"$EXT/jlpm-install.log" 2>&1 && touch node_modules/.yarn-state.yml) \
        || { tail -30 "$EXT/jlpm-install.log"; fail "jlpm install in labextension"; }
fi
unit_rc=0
say "unit tests (labextension: jlpm test)"
(cd "$EXT" && jlpm test >"$EXT/unit-tests.log" 2>&1) || unit_rc=1
grep -E '^# (tests|pass|fail) |^ *not ok|error TS' "$EXT/unit-tests.log" || true
[ "$unit_rc" -eq 0 ] || { tail -40 "$EXT/unit-tests.log"; say "unit tests FAILED (log: $EXT/unit-tests.log)"; }
say "ready to start the server ($(since))"

# 5. server
export GPUCR_UI_PORT=${GPUCR_UI_PORT:-8899}
RESULTS="$HERE/test-results"
mkdir -p "$RESULTS"
url="http://127.0.0.1:$GPUCR_UI_PORT"
if python - "$url" <<'PY' 2>/dev/null; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/api", timeout=2)
PY
    fail "something already listens on port $GPUCR_UI_PORT: stop it or set GPUCR_UI_PORT"
fi
STORE=$(mktemp -d /tmp/gpucr-ui-store-XXXXXX)
export GPUCR_UI_STORE="$STORE"
(cd "$HERE" && exec jupyter lab --config jupyter_server_test_config.py) >"$RESULTS/jupyter-server.log" 2>&1 &
SERVER_PID=$!
cleanup() {
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 40); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.25; done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$STORE"
}
trap cleanup EXIT
python - "$url" "$SERVER_PID" <<'PY' || { tail -40 "$RESULTS/jupyter-server.log"; fail "the Jupyter server did not start"; }
import os, sys, time, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.time() + 120
while time.time() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("server exited")
    try:
        urllib.request.urlopen(url + "/lab", timeout=2)
        sys.exit(0)
    except Exception:
        time.sleep(0.5)
sys.exit("timeout")
PY
say "server up at $url (pid $SERVER_PID, log $RESULTS/jupyter-server.log) ($(since))"

# 6. tests
rc=0
(cd "$HERE" && npx playwright test "$@") || rc=$?
say "UI tests finished with exit code $rc in $(since); screenshots: $RESULTS/screenshots"
if [ "$rc" -ne 0 ]; then
    # the server's side of a failure, for a CI log that keeps only this output
    say "the server's log (gpucr lines, errors and 5xx), last 80:"
    grep -E 'gpucr|^\[E |Traceback| 5[0-9][0-9] ' "$RESULTS/jupyter-server.log" | tail -80 || true
fi
[ "$rc" -ne 0 ] || rc=$unit_rc
exit $rc
