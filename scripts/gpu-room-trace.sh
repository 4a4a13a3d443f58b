#!/usr/bin/env bash
# The make-room trace (bench/bench_room.py) on the H200 in two device calls, one right after the
# other (docs/dev/gpu-tests.md): the run takes longer than one call may.
#   start    install as scripts/gpu-run.sh does, copy the code it runs to $ROOM_SRC (the next call's
#            copy of the working tree cannot touch it then), pick the store, run the bench detached
#            (setsid: it outlives this call while the machine is held) with its log and JSON in
#            $ROOM_RUN; return once it ended or START_WAIT seconds (550) after this call began,
#            printing its progress so far
#   collect  wait until it ended or COLLECT_WAIT seconds (550) passed, copy its files into $OUT and print
#            the summary (from the JSON as far as it got, when it is still running or was cut off);
#            once it ended, delete its store
# ROOM_ARGS: the bench's arguments (default: the planned H200 run). ROOM_STORE: the store (default
# /dev/shm/gpucr-room; where the bench's plan says /dev/shm cannot hold it, a tmpfs of its own).
# PYTHON: a Python that has the Jupyter stack already (the CPU machine's .venv/bin/python): nothing
# is installed then.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/gpu-site.sh
RUN=${ROOM_RUN:-/root/gpucr-room-out}
SRC=${ROOM_SRC:-/root/gpucr-room-src}
OUT=${OUT:-$PWD/gpu-out}
ARGS=${ROOM_ARGS:---kernels 11 --model-b 8 --kv-tokens 8192 --minutes 10 --seed 0}
OWN_TMPFS=${ROOM_TMPFS:-/root/gpucr-room-tmpfs}
SITE=/tmp/gpucr-site
PY=${PYTHON:-python3}
export GPUCR_CRIU="$SRC/.venv/bin/criu" PYTHONUNBUFFERED=1
[ -n "${PYTHON:-}" ] || export PYTHONPATH="$SITE:$SRC:$SRC/kernel_hooks"

install() {
    [ -z "${PYTHON:-}" ] || return 0
    install_site "$SITE"
}

# What the run imports and executes, and the CRIU bundle (bin/criu finds its lib/ beside it).
snapshot() {
    rm -rf "$SRC"; mkdir -p "$SRC/.venv/bin" "$SRC/.venv/lib"
    tar -c --exclude=__pycache__ jupyter_gpucr kernel_hooks bench tests | tar -x -C "$SRC" || return 1
    cp .venv/bin/criu "$SRC/.venv/bin/" && cp -r .venv/lib/gpucr-criu "$SRC/.venv/lib/"
}

quiet() { grep -v 'RLIMIT_NOFILE\|network-lock will be ignored'; }

# The bench's plan for a store: 0 it fits, 3 it does not (the plan's log says why).
plan() { $PY "$SRC/bench/bench_room.py" $ARGS --store "$1" --plan-only >> "$RUN/plan.log" 2>&1; }

pick_store() {
    if [ -n "${ROOM_STORE:-}" ]; then echo "$ROOM_STORE"; return; fi
    rm -rf /dev/shm/gpucr-room "$OWN_TMPFS/store"  # an earlier run's, never collected
    plan /dev/shm/gpucr-room
    case $? in
        0) echo /dev/shm/gpucr-room; return ;;
        3) ;;
        *) return 1 ;;
    esac
    rm -rf /dev/shm/gpucr-room
    # /dev/shm is too small: a tmpfs of its own (memory still; the bench's plan checks what the host holds)
    mkdir -p "$OWN_TMPFS"
    if mountpoint -q "$OWN_TMPFS" || mount -t tmpfs -o size=90% gpucr-room "$OWN_TMPFS" >> "$RUN/plan.log" 2>&1; then
        echo "$OWN_TMPFS" > "$RUN/mounted"
        echo "$OWN_TMPFS/store"
    else
        echo "/dev/shm/gpucr-room"  # the bench refuses, with its arithmetic
    fi
}

ended() { [ -f "$RUN/rc" ]; }

# Until the run ended or this call has run $1 seconds.
wait_for_end() {
    while ! ended && [ $SECONDS -lt "$1" ]; do sleep 5; done
    ended
}

start() {
    if [ -f "$RUN/pid" ] && ! ended && kill -0 "$(cat "$RUN/pid")" 2>/dev/null; then
        echo "a run is still going in $RUN (pid $(cat "$RUN/pid")): 'collect' it first" >&2; exit 1
    fi
    rm -rf "$RUN"; mkdir -p "$RUN"
    install && snapshot || exit 1
    { date -u; echo "cores: $(nproc)"; free -g; df -h /dev/shm /root 2>/dev/null
      nvidia-smi --query-gpu=index,name,uuid,memory.used,memory.total,driver_version --format=csv 2>/dev/null; } > "$RUN/machine.txt"
    cat "$RUN/machine.txt"
    store=$(pick_store) || { quiet < "$RUN/plan.log"; exit 1; }
    echo "$store" > "$RUN/store"
    echo "store: $store"
    # shellcheck disable=SC2086  # ARGS is a list of arguments
    (cd "$SRC" || exit 1
     setsid nohup bash -c '"$@" > "$0/room.log" 2>&1 < /dev/null; echo $? > "$0/rc"' "$RUN" \
         $PY bench/bench_room.py $ARGS --store "$store" --json-out "$RUN/room.json" < /dev/null > /dev/null 2>&1 &
     echo $! > "$RUN/pid")
    wait_for_end "${START_WAIT:-550}"
    quiet < "$RUN/room.log" | tail -n 80
    if ended; then
        echo "bench_room ended (exit $(cat "$RUN/rc")) before this call did: run 'collect' for its files"
    else
        echo "bench_room still running (pid $(cat "$RUN/pid")): run 'collect' now, before the machine is given back"
    fi
}

collect() {
    [ -f "$RUN/pid" ] || { echo "no run in $RUN: 'start' first" >&2; exit 1; }
    wait_for_end "${COLLECT_WAIT:-550}"
    mkdir -p "$OUT"
    for f in machine.txt plan.log room.json room.log; do
        [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/"
    done
    [ -f "$RUN/room.server.log" ] && gzip -c "$RUN/room.server.log" > "$OUT/room.server.log.gz"
    # the plan, the setup, anything gone wrong and the final table; of the turns the last few
    quiet < "$RUN/room.log" | grep -v '^turn ' | tail -n 60
    quiet < "$RUN/room.log" | grep '^turn ' | tail -n 5
    if [ -f "$RUN/room.json" ] && ! grep -q '"phase": "done"' "$RUN/room.json"; then  # no table at the log's end
        echo "--- as far as it got (bench/bench_room.py --report room.json)"
        $PY "$SRC/bench/bench_room.py" --report "$RUN/room.json"
    fi
    if ended; then
        echo "bench_room exit $(cat "$RUN/rc")"
        rm -rf "$(cat "$RUN/store")"
        if [ -f "$RUN/mounted" ]; then umount "$(cat "$RUN/mounted")"; fi
    else
        echo "bench_room still running (pid $(cat "$RUN/pid")): 'collect' again for the rest"
    fi
}

case "${1:-}" in
    start) start ;;
    collect) collect ;;
    *) echo "usage: $0 start|collect" >&2; exit 2 ;;
esac
