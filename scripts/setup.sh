#!/bin/sh
# Installs everything fourfold needs to build, run and test, from Debian's
# archive only. Idempotent: when every package is already installed it does
# not touch the network. Must run as root (the README's commands do).
set -eu

PACKAGES="build-essential cmake pkg-config openmpi-bin libopenmpi-dev \
libopenblas-dev libopenblas-openmp-dev python3 python3-numpy python3-torch iproute2 util-linux iptables \
fortunes"

missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "setup: missing Debian packages:$missing; run this script as root" >&2
    exit 1
fi
echo "setup: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
