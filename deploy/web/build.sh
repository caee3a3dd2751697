#!/usr/bin/env bash
# Build the web UI's third-party files into the package, from the lockfile.
#
#   deploy/web/build.sh        (make web; deploy/host-setup.sh runs it)
#
# npm ci installs exactly what deploy/web/package-lock.json pins (uPlot, the
# timeline's chart library) into deploy/web/node_modules; its browser build,
# stylesheet and licence are copied into daemon/ember/collector/web/vendor/,
# which the collector serves as /vendor/... and the wheel ships (pyproject's
# package-data). Nothing is fetched at run time. vendor/VERSION records what
# was copied: when it already names the locked version, npm is not run.
set -euo pipefail

cd "$(dirname "$0")/../.."
web=deploy/web
vendor=daemon/ember/collector/web/vendor
files=(uPlot.iife.min.js uPlot.min.css LICENSE)

version=$(node -p "require('./$web/package-lock.json').packages['node_modules/uplot'].version")
stamp="uplot $version"

complete() {
    [ "$(cat "$vendor/VERSION" 2>/dev/null)" = "$stamp" ] || return 1
    local f
    for f in "${files[@]}"; do [ -s "$vendor/$f" ] || return 1; done
}
if complete; then
    echo "web: $vendor has $stamp" >&2
    exit 0
fi

echo "web: npm ci ($stamp)" >&2
npm ci --no-audit --no-fund --ignore-scripts --prefix "$web" >/dev/null
dist=$web/node_modules/uplot
got=$(node -p "require('./$dist/package.json').version")
[ "$got" = "$version" ] || { echo "web: installed uplot $got, lockfile says $version" >&2; exit 1; }

mkdir -p "$vendor"
rm -f "$vendor/VERSION"   # written last: a copy cut short is redone next time
cp "$dist/dist/uPlot.iife.min.js" "$dist/dist/uPlot.min.css" "$dist/LICENSE" "$vendor/"
echo "$stamp" > "$vendor/VERSION"
echo "web: $vendor now has $stamp" >&2
