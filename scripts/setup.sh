#!/usr/bin/env bash
# Installs the Debian packages radixtier needs, only those missing, when run as root: the
# C++ toolchain and test libraries, liburing and xxHash (the disk store, found with
# pkg-config), ZeroMQ, msgpack and prometheus-cpp (KV events, metrics), and for the Python
# module and its tests pybind11, Python's headers, python3-zmq, python3-msgpack and
# Debian's torch, numpy and pytest for /usr/bin/python3.
#   scripts/setup.sh [PRESET] [all|demo]   the fuzz presets also need clang and libFuzzer
#                                           (and llvm-cov); "demo": only what `make demo`
#                                           builds (the CLI and its libraries)
set -euo pipefail
preset=${1:-default}
what=${2:-all}
# The CLI and the libraries it links (make demo).
pkgs=(cmake g++ make libboost-dev nlohmann-json3-dev libcli11-dev liburing-dev libxxhash-dev
  pkg-config)
case "$what" in
  demo) ;;
  all) pkgs+=(libgtest-dev librapidcheck-dev libbenchmark-dev
    pybind11-dev python3-dev python3-torch python3-pytest python3-numpy
    libzmq3-dev cppzmq-dev libmsgpack-cxx-dev prometheus-cpp-dev python3-zmq python3-msgpack
    libhiredis-dev libsodium-dev redis-server redis-tools) ;;
  *) echo "scripts/setup.sh: '$what' is not all or demo" >&2; exit 2 ;;
esac
case "$preset" in
  fuzz) pkgs+=(clang libclang-rt-14-dev) ;;
  fuzz-coverage) pkgs+=(clang libclang-rt-14-dev llvm-14) ;;
esac
need=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for pkg in "${pkgs[@]}"; do
  have "$pkg" || need+=("$pkg")
done
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "radixtier: missing packages: ${need[*]}; run as root or: sudo apt-get install ${need[*]}" >&2
  exit 1
fi
echo "radixtier: installing ${need[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" </dev/null
