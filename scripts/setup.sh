#!/usr/bin/env bash
# One-shot, idempotent development/CI setup for jupyter-gpucr (Debian 12 as root is the reference).
#
#   bash scripts/setup.sh [--force]
#
# 1. installs the few Debian packages that are missing (python3, python3-venv, util-linux,
#    debian-archive-keyring; nothing when all are present),
# 2. creates the virtualenv .venv in the repository root with the machine's python3 (>= 3.10;
#    override with PYTHON=/path/to/python3),
# 3. upgrades pip and runs `pip install -e '.[test,docs,s3]'` (skipped when pyproject.toml is unchanged since the
#    last successful run; --force or GPUCR_SETUP_FORCE=1 redoes it),
# 4. installs CRIU 4.2+ as .venv/bin/criu via scripts/install-criu.sh (a self-contained bundle),
# 5. installs jupyterhub and jupyterhub-idle-culler (pip) and configurable-http-proxy (npm, into .venv/node)
#    for the real JupyterHub test, and OpenHands' Jupyter kernel client (.venv/openhands-client) for the agent tests.
# Exits non-zero with a message on the first failure.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
VENV="$REPO_ROOT/.venv"
STAMP="$VENV/.gpucr-setup-stamp"
FORCE=${GPUCR_SETUP_FORCE:-}
case ${1:-} in
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) echo "setup: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

T_START=$(date +%s)
STEP="start"
say() { printf 'setup: %s\n' "$*"; }
FAILED=""
fail() { FAILED=1; printf 'setup: FAILED (%s): %s\n' "$STEP" "$*" >&2; exit 1; }
trap 'rc=$?; [ $rc -eq 0 ] || [ -n "$FAILED" ] || printf "setup: FAILED during: %s (exit %s)\n" "$STEP" "$rc" >&2' EXIT
step() { STEP=$1; say "$1 ..."; }
elapsed() { echo "$(( $(date +%s) - T_START ))s"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@"
    else fail "need root to run: $*  (run this script as root, or install those packages first)"
    fi
}

APT_UPDATED=""
apt_install() {
    command -v apt-get >/dev/null || fail "missing $*, and there is no apt-get to install them"
    say "  apt-get install $*"
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "$APT_UPDATED" ]; then
        as_root apt-get update -qq || fail "apt-get update failed"
        APT_UPDATED=1
    fi
    as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null || fail "apt-get install $* failed"
}

cd "$REPO_ROOT"
[ -f pyproject.toml ] || fail "no pyproject.toml in $REPO_ROOT"

# ------------------------------------------------------------------------------------- 1. OS packages
step "[1/5] system packages"
PY=${PYTHON:-python3}
pkgs=()
command -v "$PY" >/dev/null || { [ -z "${PYTHON:-}" ] || fail "PYTHON=$PYTHON not found"; pkgs+=(python3 python3-venv); }
command -v nsenter >/dev/null && command -v unshare >/dev/null || pkgs+=(util-linux)
if command -v dpkg >/dev/null && [ ! -r /usr/share/keyrings/debian-archive-keyring.gpg ] \
   && grep -q '^ID=debian' /etc/os-release 2>/dev/null; then
    pkgs+=(debian-archive-keyring)
fi
[ ${#pkgs[@]} -eq 0 ] || apt_install "${pkgs[@]}"

PY=$(command -v "$PY") || fail "python3 not found"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || fail "$PY is Python $("$PY" -c 'import platform; print(platform.python_version())'), need >= 3.10 (set PYTHON=...)"
# Debian splits venv/ensurepip into python3-venv
if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    case $(readlink -f "$PY") in
        /usr/bin/*) apt_install "python$pyver-venv" ;;
        *) fail "$PY has no working venv/ensurepip module (install its venv support or set PYTHON=...)" ;;
    esac
    "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 || fail "$PY still cannot create virtualenvs"
fi
say "  python: $PY ($("$PY" -c 'import platform; print(platform.python_version())')); nsenter, unshare: ok"

# ------------------------------------------------------------------------------------- 2. virtualenv
step "[2/5] virtualenv $VENV"
VPY="$VENV/bin/python"
if [ -x "$VPY" ] && "$VPY" -c 'import sys, pip; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then
    say "  exists ($("$VPY" -c 'import platform; print(platform.python_version())'))"
else
    # no --clear: .venv may already hold the CRIU bundle (lib/gpucr-criu)
    "$PY" -m venv "$VENV" || fail "python -m venv $VENV failed (if .venv is broken: rm -rf .venv and rerun)"
    "$VPY" -c 'import pip' >/dev/null 2>&1 || fail "$VENV has no pip (rm -rf .venv and rerun)"
    say "  created"
fi

# ------------------------------------------------------------------------------------- 3. pip install -e
step "[3/5] pip install -e '.[test,docs,s3]'"
want=$( { cat pyproject.toml; "$VPY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)
if [ -z "$FORCE" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] \
   && "$VPY" -m pip show -q jupyter-gpucr >/dev/null 2>&1; then
    say "  up to date (pyproject.toml unchanged since last install)"
else
    rm -f "$STAMP"
    "$VPY" -m pip install -q --upgrade pip || fail "pip upgrade failed"
    "$VPY" -m pip install -q -e '.[test,docs,s3]' || fail "pip install -e '.[test,docs,s3]' failed"
    printf '%s\n' "$want" >"$STAMP"
    say "  installed ($(elapsed) so far)"
fi

# ------------------------------------------------------------------------------------- 4. CRIU
step "[4/5] CRIU 4.2+ into $VENV/bin/criu"
GPUCR_PREFIX="$VENV" bash "$SCRIPT_DIR/install-criu.sh" "$VENV" || fail "scripts/install-criu.sh failed"
"$VENV/bin/criu" --version >/dev/null || fail "$VENV/bin/criu does not run"

# ------------------------------------------------------------------------------------- 5. JupyterHub test tools
step "[5/5] jupyterhub, jupyterhub-idle-culler (pip) and configurable-http-proxy (npm) for tests/daemon/test_jupyterhub.py"
"$VPY" -c 'import jupyterhub, jupyterhub_idle_culler' >/dev/null 2>&1 \
    || "$VPY" -m pip install -q jupyterhub jupyterhub-idle-culler || fail "pip install jupyterhub jupyterhub-idle-culler failed"
CHP="$VENV/node/node_modules/.bin/configurable-http-proxy"
if ! command -v configurable-http-proxy >/dev/null && [ ! -x "$CHP" ]; then
    command -v npm >/dev/null || apt_install nodejs npm
    # the machine's own npm configuration (registry, proxy) decides where it comes from
    npm install --no-audit --no-fund --silent --prefix "$VENV/node" configurable-http-proxy >/dev/null \
        || fail "npm install configurable-http-proxy failed"
fi
say "  jupyterhub $("$VPY" -c 'import jupyterhub; print(jupyterhub.__version__)'), configurable-http-proxy: ok"
# OpenHands' Jupyter kernel client for tests/agents/test_agents.py: the package itself does not install on
# Python 3.11 (docs/agents.md says why), its client module needs only tornado and tenacity. Kept out of the
# venv's import path: the test loads that one file.
OH="$VENV/openhands-client"
[ -f "$OH/openhands/runtime/plugins/jupyter/execute_server.py" ] \
    || "$VPY" -m pip install -q --no-deps --target "$OH" 'openhands-ai==0.9.8' 'tenacity>=8.5,<9' \
    || fail "pip install --no-deps --target $OH openhands-ai==0.9.8 tenacity failed"

STEP="done"
say "done in $(elapsed): $("$VENV/bin/criu" --version | sed -n 's/^Version: */CRIU /p') at .venv/bin/criu; activate with: . .venv/bin/activate"
