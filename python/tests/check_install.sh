#!/usr/bin/env bash
# Installs the `python` component of a build into a scratch prefix and imports radixtier from
# there alone (not from the build tree). Usage: check_install.sh BUILD_DIR PYTHON PYDIR
set -euo pipefail
build=$1 python=$2 pydir=$3
prefix=$(mktemp -d "${TMPDIR:-/tmp}/radixtier-pyinstall.XXXXXX")
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" --component python >/dev/null
cd "$prefix"
PYTHONPATH="$prefix/$pydir" "$python" -c "
import radixtier, sys
assert radixtier.__file__.startswith('$prefix'), radixtier.__file__
c = radixtier.CacheConfig(gpu_pages=4, gpu_snapshot_slots=1, page_bytes=8, snapshot_bytes=8)
cache = radixtier.PrefixCache(c, radixtier.HostTransferEngine(radixtier.HostArenas(c)))
assert cache.admit([1, 2, 3]).cached_tokens == 0
print('installed radixtier', radixtier.__version__, 'imports from', radixtier.__file__)
"
