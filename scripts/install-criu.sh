#!/usr/bin/env bash
# Install a self-contained CRIU 4.2+ bundle (see docs / FINDINGS: Debian 12's own criu 3.17 is too old
# for recent kernels, and the Debian 13/unstable packages need a newer glibc than Debian 12 has).
#
# The bundle is the Debian unstable (sid) `criu` binary plus every shared library it needs, including
# its own glibc and loader, unpacked with `dpkg -x`.  A small wrapper runs it through the bundled loader:
#     PREFIX/bin/criu            -> exec BUNDLE/lib/ld-linux-x86-64.so.2 --library-path BUNDLE/lib BUNDLE/criu.bin "$@"
#     PREFIX/lib/gpucr-criu/     the bundle (criu.bin, lib/, doc/, MANIFEST)
# The wrapper finds the bundle relative to itself, so PREFIX/bin/criu + PREFIX/lib/gpucr-criu can be
# copied to another machine (it runs unchanged on Ubuntu 24.04).
#
# Usage:
#   scripts/install-criu.sh [--force] [PREFIX]     install into PREFIX (default: $GPUCR_PREFIX or <repo>/.venv)
#   scripts/install-criu.sh --bundle-only DIR      write DIR/bin/criu and DIR/lib/gpucr-criu/ (for carrying);
#                                                  copies the PREFIX bundle when it works, else builds
#   scripts/install-criu.sh --tarball FILE.tar.gz  the same as a tarball (extract with: tar xzf FILE -C PREFIX)
#   scripts/install-criu.sh --check [PREFIX]       exit 0 when PREFIX/bin/criu is 4.2+ and works, else 1
#
# Idempotent: when PREFIX/bin/criu is already CRIU >= 4.2 and `criu check` says "Looks good." (the check
# is only run as root; GPUCR_CRIU_SKIP_CHECK=1 skips it, e.g. in a chroot), nothing is done unless --force.
#
# Building needs a Debian host with apt (apt-get, dpkg) and network access to its Debian mirror.  The mirror
# is taken from this machine's apt configuration (/etc/apt/sources.list.d/*.sources, /etc/apt/sources.list);
# GPUCR_DEBIAN_MIRROR overrides it.  GPUCR_DEBIAN_SUITE (default: sid) picks the suite.
# The host's apt state is never touched: a private state/cache/sources dir is used.
set -euo pipefail

MIN_MAJOR=4
MIN_MINOR=2
BUNDLE_NAME=gpucr-criu
ARCH_TRIPLET=x86_64-linux-gnu
LOADER=ld-linux-x86-64.so.2

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)

log() { printf 'install-criu: %s\n' "$*" >&2; }
die() { printf 'install-criu: ERROR: %s\n' "$*" >&2; exit 1; }

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }

# ---------------------------------------------------------------------------------------------- checks

# criu_version BIN -> prints "MAJOR MINOR PATCH" or fails
criu_version() {
    local out v
    out=$("$1" --version 2>/dev/null) || return 1
    v=$(printf '%s\n' "$out" | sed -n 's/^Version: *\([0-9][0-9.]*\).*/\1/p' | head -n1)
    [ -n "$v" ] || return 1
    printf '%s\n' "$v"
}

version_ok() { # "4.2.1" -> 0 when >= MIN
    local major minor
    IFS=. read -r major minor _ <<<"$1.0.0"
    [ "${major:-0}" -gt "$MIN_MAJOR" ] && return 0
    [ "${major:-0}" -eq "$MIN_MAJOR" ] && [ "${minor:-0}" -ge "$MIN_MINOR" ]
}

# criu_works BIN [quiet] -> 0 when BIN is CRIU >= 4.2 and (as root) `criu check` says Looks good.
criu_works() {
    local bin=$1 v out
    [ -x "$bin" ] || return 1
    v=$(criu_version "$bin") || { [ -n "${2:-}" ] || log "$bin does not run"; return 1; }
    version_ok "$v" || { [ -n "${2:-}" ] || log "$bin is CRIU $v, need >= $MIN_MAJOR.$MIN_MINOR"; return 1; }
    if [ "$(id -u)" -eq 0 ] && [ -z "${GPUCR_CRIU_SKIP_CHECK:-}" ]; then
        out=$("$bin" check 2>&1) || { [ -n "${2:-}" ] || log "$bin check failed: $out"; return 1; }
        case $out in
            *"Looks good"*) ;;
            *) [ -n "${2:-}" ] || log "$bin check did not say 'Looks good': $out"; return 1 ;;
        esac
    fi
    return 0
}

# ---------------------------------------------------------------------------------------------- mirror

# The Debian archive URI from this machine's apt configuration (first enabled 'deb' source whose suite
# is a plain release name, i.e. not -security/-updates/-backports).
derive_mirror() {
    if [ -n "${GPUCR_DEBIAN_MIRROR:-}" ]; then printf '%s\n' "$GPUCR_DEBIAN_MIRROR"; return 0; fi
    local f uri=""
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        uri=$(awk '
            function flush() {
                if (!found && types ~ /(^|[ \t])deb([ \t]|$)/ && tolower(enabled) != "no" && uris != "") {
                    n = split(suites, s, /[ \t]+/)
                    for (i = 1; i <= n; i++)
                        if (s[i] != "" && s[i] !~ /[-\/]/) { split(uris, u, /[ \t]+/); print u[1]; found = 1; break }
                }
                types = ""; uris = ""; suites = ""; enabled = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            tolower($1) == "types:"   { sub(/^[^:]*:[ \t]*/, ""); types = $0; next }
            tolower($1) == "uris:"    { sub(/^[^:]*:[ \t]*/, ""); uris = $0; next }
            tolower($1) == "suites:"  { sub(/^[^:]*:[ \t]*/, ""); suites = $0; next }
            tolower($1) == "enabled:" { sub(/^[^:]*:[ \t]*/, ""); enabled = $0; next }
            END { flush() }
        ' "$f")
        [ -n "$uri" ] && break
    done
    if [ -z "$uri" ]; then
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [ -r "$f" ] || continue
            # deb [options] URI SUITE COMPONENTS...
            uri=$(sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" && $3 !~ /[-\/]/ && $2 != "" { print $2; exit }')
            [ -n "$uri" ] && break
        done
    fi
    [ -n "$uri" ] || return 1
    printf '%s\n' "${uri%/}"
}

# ---------------------------------------------------------------------------------------------- build

# build_bundle DEST_BUNDLE_DIR: download + unpack + assemble into DEST (which must not exist yet)
build_bundle() {
    local dest=$1 work mirror suite keyring apt_opts pkgs cand p d
    command -v apt-get >/dev/null && command -v dpkg >/dev/null \
        || die "building the CRIU bundle needs apt-get and dpkg (a Debian host). On other systems, build it on Debian and carry it: $0 --bundle-only DIR (or --tarball FILE)"
    [ "$(uname -m)" = x86_64 ] || die "only x86_64 is supported (this machine: $(uname -m))"
    mirror=$(derive_mirror) || die "could not find a Debian mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list (set GPUCR_DEBIAN_MIRROR=URI)"
    if [ -z "${GPUCR_DEBIAN_MIRROR:-}" ] && [ -r /etc/os-release ] && ! grep -q '^ID=debian' /etc/os-release; then
        die "this is not Debian ($(. /etc/os-release; echo "${PRETTY_NAME:-?}")); its apt mirror has no Debian '${GPUCR_DEBIAN_SUITE:-sid}'. Build the bundle on Debian and carry it ($0 --bundle-only DIR), or set GPUCR_DEBIAN_MIRROR to a Debian mirror"
    fi
    suite=${GPUCR_DEBIAN_SUITE:-sid}
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [ -r "$keyring" ] || die "$keyring is missing (apt-get install debian-archive-keyring)"

    work=$(mktemp -d "${TMPDIR:-/tmp}/gpucr-criu-build.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" EXIT
    mkdir -p "$work/state/lists/partial" "$work/cache/archives/partial" "$work/etc/sources.list.d" \
             "$work/etc/preferences.d" "$work/debs" "$work/root"
    : >"$work/state/status"
    printf 'deb [signed-by=%s] %s %s main\n' "$keyring" "$mirror" "$suite" >"$work/etc/sources.list"
    apt_opts=(
        -o "Dir::State=$work/state" -o "Dir::State::status=$work/state/status"
        -o "Dir::Cache=$work/cache" -o "Dir::Etc::SourceList=$work/etc/sources.list"
        -o "Dir::Etc::SourceParts=$work/etc/sources.list.d"
        -o "Dir::Etc::Preferences=$work/etc/preferences" -o "Dir::Etc::PreferencesParts=$work/etc/preferences.d"
        -o "APT::Architecture=amd64" -o "APT::Architectures::=amd64"
        -o "Acquire::Languages=none" -o "Debug::NoLocking=1"
    )
    # root: download as root instead of the _apt sandbox user (it cannot write into our private dirs)
    [ "$(id -u)" -eq 0 ] && apt_opts+=(-o "APT::Sandbox::User=root")

    log "apt index of Debian '$suite' from the host's mirror (private apt state in $work)"
    if ! apt-get "${apt_opts[@]}" -qq update >"$work/update.log" 2>&1 \
       || grep -q '^E:' "$work/update.log"; then
        if grep -qiE 'expired|not valid yet' "$work/update.log"; then
            # clock skew or a snapshot mirror; the signature is still checked
            log "the Release file's date is out of range (clock or snapshot mirror); retrying without the date check"
            apt_opts+=(-o "Acquire::Check-Valid-Until=false" -o "Acquire::Check-Date=false")
            apt-get "${apt_opts[@]}" -qq update >"$work/update.log" 2>&1 && ! grep -q '^E:' "$work/update.log" \
                || { cat "$work/update.log" >&2; die "apt-get update for suite '$suite' failed"; }
        else
            cat "$work/update.log" >&2; die "apt-get update for suite '$suite' failed"
        fi
    fi

    cand=$(apt-cache "${apt_opts[@]}" policy criu | sed -n 's/^ *Candidate: *//p')
    [ -n "$cand" ] && [ "$cand" != "(none)" ] || die "no 'criu' package in Debian '$suite'"
    version_ok "${cand#*:}" || die "Debian '$suite' has criu $cand, need >= $MIN_MAJOR.$MIN_MINOR"

    # criu, libcompel1 and the closure of their Depends/Pre-Depends (the shared libraries, glibc included)
    pkgs=$(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
               --no-breaks --no-replaces --no-enhances criu libcompel1 \
           | grep -v '^[ <]' | sort -u)
    # shellcheck disable=SC2086
    log "criu $cand; downloading $(printf '%s\n' "$pkgs" | wc -l) packages: $(printf '%s ' $pkgs)"
    # shellcheck disable=SC2086
    (cd "$work/debs" && apt-get "${apt_opts[@]}" -qq download $pkgs >"$work/download.log" 2>&1) \
        || { cat "$work/download.log" >&2; die "apt-get download failed"; }

    for d in "$work"/debs/*.deb; do
        dpkg-deb -x "$d" "$work/root"
        printf '%s %s\n' "$(dpkg-deb -f "$d" Package)" "$(dpkg-deb -f "$d" Version)" >>"$work/packages"
    done

    # assemble
    mkdir -p "$dest/lib" "$dest/doc"
    [ -f "$work/root/usr/sbin/criu" ] || die "criu package did not contain usr/sbin/criu"
    cp "$work/root/usr/sbin/criu" "$dest/criu.bin"
    for d in "$work/root/usr/lib/$ARCH_TRIPLET" "$work/root/lib/$ARCH_TRIPLET"; do
        [ -d "$d" ] || continue
        # shared libraries (files and soname links) of the top level; no gconv/, compel/ etc.
        find "$d" -maxdepth 1 \( -type f -o -type l \) -name '*.so*' -exec cp -a -t "$dest/lib/" {} +
    done
    [ -e "$dest/lib/$LOADER" ] || die "the bundle has no $LOADER (libc6 missing?)"
    for d in "$work"/root/usr/share/doc/*/copyright; do
        p=$(basename "$(dirname "$d")")
        mkdir -p "$dest/doc/$p" && cp "$d" "$dest/doc/$p/"
    done
    {
        echo "# gpucr CRIU bundle: Debian '$suite' packages unpacked with dpkg -x; built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -sr)"
        echo "# run: lib/$LOADER --library-path lib criu.bin ARGS (see ../../bin/criu)"
        sort "$work/packages"
    } >"$dest/MANIFEST"
    rm -rf "$work"
    trap - EXIT
}

# verify_bundle BUNDLE_DIR: every needed library resolves inside the bundle, and the binary runs
verify_bundle() {
    local b=$1 out bad
    out=$("$b/lib/$LOADER" --library-path "$b/lib" --list "$b/criu.bin" 2>&1) \
        || die "bundled loader cannot load criu.bin: $out"
    if printf '%s\n' "$out" | grep -q 'not found'; then
        die "missing libraries in the bundle: $(printf '%s\n' "$out" | grep 'not found' | tr -s ' \t' ' ')"
    fi
    # every "X => PATH" must point into the bundle (no fallback to the host's libraries)
    bad=$(printf '%s\n' "$out" | awk -v lib="$b/lib/" '/=>/ { if (index($3, lib) != 1) print $1 " => " $3 }')
    [ -z "$bad" ] || die "libraries resolved outside the bundle: $bad"
}

# ---------------------------------------------------------------------------------------------- install

write_wrapper() { # PREFIX
    local w="$1/bin/criu"
    mkdir -p "$1/bin"
    cat >"$w.tmp.$$" <<'EOF'
#!/bin/sh
# CRIU from the gpucr bundle (installed by jupyter-gpucr's scripts/install-criu.sh).
# Runs the bundled criu through its own glibc loader; the bundle is found relative to this file
# (../lib/gpucr-criu), so bin/criu + lib/gpucr-criu can be copied anywhere together.
self=$(readlink -f -- "$0" 2>/dev/null || printf '%s' "$0")
bundle=${self%/*}/../lib/gpucr-criu
exec "$bundle/lib/ld-linux-x86-64.so.2" --library-path "$bundle/lib" "$bundle/criu.bin" "$@"
EOF
    chmod 0755 "$w.tmp.$$"
    mv -f "$w.tmp.$$" "$w"
}

# install_prefix PREFIX [SOURCE_PREFIX]: build (or copy from SOURCE_PREFIX) and swap in atomically
install_prefix() {
    local prefix=$1 src=${2:-} target new old
    mkdir -p "$prefix/lib" "$prefix/bin"
    prefix=$(cd "$prefix" && pwd)
    target="$prefix/lib/$BUNDLE_NAME"
    new="$target.new.$$"
    old="$target.old.$$"
    rm -rf "$new"
    if [ -n "$src" ]; then
        log "copying the bundle from $src"
        cp -a "$src/lib/$BUNDLE_NAME" "$new"
    else
        build_bundle "$new"
    fi
    verify_bundle "$new"
    if [ -e "$target" ]; then mv "$target" "$old"; fi
    mv "$new" "$target"
    rm -rf "$old"
    write_wrapper "$prefix"
    criu_works "$prefix/bin/criu" || die "the installed $prefix/bin/criu does not work (see above)"
    log "installed CRIU $(criu_version "$prefix/bin/criu") at $prefix/bin/criu ($(du -sh "$target" | cut -f1) bundle in $target)"
}

check_helpers() {
    local t
    for t in nsenter unshare; do
        command -v "$t" >/dev/null || log "warning: '$t' (util-linux) is not installed"
    done
}

# ---------------------------------------------------------------------------------------------- main

mode=install force="" arg=""
while [ $# -gt 0 ]; do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --force) force=1 ;;
        --bundle-only) mode=bundle; arg=${2:?--bundle-only needs a DIR}; shift ;;
        --tarball) mode=tarball; arg=${2:?--tarball needs a FILE}; shift ;;
        --check) mode=check ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [ -z "${PREFIX_ARG:-}" ] || die "only one PREFIX"; PREFIX_ARG=$1 ;;
    esac
    shift
done
PREFIX=${PREFIX_ARG:-${GPUCR_PREFIX:-$REPO_ROOT/.venv}}

# serialise concurrent runs on the same machine
if command -v flock >/dev/null && { exec 9>"${TMPDIR:-/tmp}/gpucr-install-criu.$(id -u).lock"; } 2>/dev/null; then
    flock 9
fi

case $mode in
    check)
        criu_works "$PREFIX/bin/criu" && { log "OK: CRIU $(criu_version "$PREFIX/bin/criu") at $PREFIX/bin/criu"; exit 0; }
        exit 1 ;;
    install)
        if [ -z "$force" ] && criu_works "$PREFIX/bin/criu" quiet; then
            log "CRIU $(criu_version "$PREFIX/bin/criu") already works at $PREFIX/bin/criu; nothing to do"
        else
            install_prefix "$PREFIX"
        fi
        check_helpers ;;
    bundle|tarball)
        src=""
        if [ -z "$force" ] && criu_works "$PREFIX/bin/criu" quiet && [ -d "$PREFIX/lib/$BUNDLE_NAME" ]; then
            src=$(cd "$PREFIX" && pwd)
        fi
        if [ "$mode" = bundle ]; then
            install_prefix "$arg" "$src"
        else
            tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpucr-criu-tar.XXXXXX")
            install_prefix "$tmp" "$src"
            mkdir -p "$(dirname "$arg")"
            tar -C "$tmp" -czf "$arg.tmp.$$" bin/criu "lib/$BUNDLE_NAME"
            mv -f "$arg.tmp.$$" "$arg"
            rm -rf "$tmp"
            log "wrote $arg ($(du -h "$arg" | cut -f1)); use: tar xzf $arg -C PREFIX  ->  PREFIX/bin/criu"
        fi ;;
esac
