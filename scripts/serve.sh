#!/usr/bin/env bash
# Set everything up (idempotent) and start JupyterLab with gpucr enabled and a short idle-suspend
# timeout, so an idle kernel goes to disk after two minutes. Extra arguments go to `jupyter lab`.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$REPO_ROOT/scripts/setup.sh"
NOTEBOOKS=${GPUCR_NOTEBOOK_DIR:-$REPO_ROOT/.gpucr-dev/notebooks}
mkdir -p "$NOTEBOOKS"
export GPUCR_STORE=${GPUCR_STORE:-$REPO_ROOT/.gpucr-dev/store}
echo "serve: store $GPUCR_STORE, notebooks $NOTEBOOKS"
exec "$REPO_ROOT/.venv/bin/jupyter" lab --no-browser --allow-root \
    --ServerApp.ip="${GPUCR_IP:-127.0.0.1}" --ServerApp.port="${GPUCR_PORT:-8888}" \
    --ServerApp.root_dir="$NOTEBOOKS" \
    --GPUCR.idle_timeout="${GPUCR_IDLE_TIMEOUT:-120}" --GPUCR.idle_check_interval=15 "$@"
