#!/usr/bin/env bash
# Installs the Debian packages radixtier needs, only those missing, when run as root.
set -euo pipefail
need=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for pkg in cmake g++ make libboost-dev libgtest-dev librapidcheck-dev libbenchmark-dev \
  nlohmann-json3-dev libcli11-dev; do
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
