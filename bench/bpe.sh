#!/bin/sh
# Encoding throughput of GPT-2's tokenizer on one thread (docs/results.md,
# "GPT-2's tokenizer"): fourfold's (src/data/bpe.c, through `fourfold
# tokenize --bpe`) against the npm packages gpt-3-encoder 1.1.4 (a port of
# OpenAI's encoder.py) and tiktoken 1.0.22 (OpenAI's Rust BPE as WASM), on
# the same text in the same run.
#
#   bench/bpe.sh [build-dir] [repeats]
#
# Text: every fortune file of Debian's fortunes package and 1 MB of
# tests/bpe_npm.js's varied text (many scripts, emoji, Unicode spaces), each
# file one document after the end-of-text token; about 3.6 MB. Every run of
# every encoder is a fresh process (cold caches), REPEATS (default 3) times
# in turn; each encoder's best and median are printed. "encode" is the time
# in encoding: for the npm packages their encode calls (timed inside node,
# the package loaded), for fourfold the command's time less the same command
# on a 1-byte file (so reading the text and writing the shard count against
# it); "whole" is the process from start to end, loading the vocabulary
# included. gpt-3-encoder gets each document in pieces cut after newlines
# where GPT-2's words break anyway (its encode() is quadratic in a call's
# length); tiktoken and fourfold get whole documents. The three token
# streams must be equal (their counts and hashes are printed); the script
# never fails on speed.
#
# Needs node, GPT-2's files (scripts/setup.sh gpt2-vocab) and, once, the npm
# registry: the two packages are installed into
# ${XDG_CACHE_HOME:-~/.cache}/fourfold/bench-npm, outside the repository.
set -eu
case ${1:-} in -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
BUILD=${1:-build}
REPEATS=${2:-3}
FF=$BUILD/fourfold
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/fourfold
VOCAB=$CACHE/gpt2
NPM=$CACHE/bench-npm
[ -x "$FF" ] || { echo "bpe.sh: no $FF (build it, or give the build folder)" >&2; exit 1; }
[ -r "$VOCAB/encoder.json" ] || { echo "bpe.sh: no $VOCAB/encoder.json: scripts/setup.sh gpt2-vocab" >&2; exit 1; }
if [ ! -d "$NPM/node_modules/tiktoken" ] || [ ! -d "$NPM/node_modules/gpt-3-encoder" ]; then
    mkdir -p "$NPM"
    (cd "$NPM" && npm install --silent --no-audit --no-fund --prefix . tiktoken@1.0.22 gpt-3-encoder@1.1.4)
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
node tests/bpe_npm.js corpus "$WORK/varied.txt" 1000000
set -- "$WORK/varied.txt"
# shellcheck disable=SC2046
[ -d /usr/share/games/fortunes ] && set -- "$@" $(find /usr/share/games/fortunes -type f ! -name '*.*' | sort)
BYTES=$(cat "$@" | wc -c)
printf x > "$WORK/one.txt"
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.4f", b - a }'; }

: > "$WORK/times"
r=1
while [ "$r" -le "$REPEATS" ]; do
    t=$(now)
    "$FF" tokenize --bpe "$VOCAB" --val-fraction 0 --out "$WORK/one" "$WORK/one.txt" > /dev/null
    fixed=$(since "$t")
    t=$(now)
    "$FF" tokenize --bpe "$VOCAB" --val-fraction 0 --out "$WORK/ff" "$@" > /dev/null
    whole=$(since "$t")
    echo "fourfold $(awk -v w="$whole" -v f="$fixed" 'BEGIN { print w - f }') $whole" >> "$WORK/times"
    for enc in tiktoken gpt-3-encoder; do
        t=$(now)
        node bench/bpe.js "$enc" "$NPM" "$@" > "$WORK/$enc.json"
        whole=$(since "$t")
        echo "$enc $(sed 's/.*"encode_s":\([0-9.e-]*\).*/\1/' "$WORK/$enc.json") $whole" >> "$WORK/times"
    done
    r=$((r + 1))
done
node bench/bpe.js shard "$WORK/ff_train.bin" > "$WORK/fourfold.json"

echo "# GPT-2 BPE encoding, one thread: $BYTES bytes in $# documents, $REPEATS runs each," \
    "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
printf '%-14s %12s %12s %12s %12s %10s %12s\n' encoder "encode MB/s" "(median)" "whole MB/s" \
    "(median)" tokens hash
for enc in fourfold tiktoken gpt-3-encoder; do
    tokens=$(sed 's/.*"tokens":\([0-9]*\).*/\1/' "$WORK/$enc.json")
    hash=$(sed 's/.*"hash":\([0-9]*\).*/\1/' "$WORK/$enc.json")
    grep "^$enc " "$WORK/times" | awk -v b="$BYTES" -v e="$enc" -v n="$tokens" -v h="$hash" '
        { enc[NR] = $2; whole[NR] = $3 }
        function best(a, k,   i, m) { m = a[1]; for (i = 2; i <= k; i++) if (a[i] < m) m = a[i]; return m }
        function median(a, k,   i, j, t, s) {
            for (i = 1; i <= k; i++) s[i] = a[i]
            for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (s[j] < s[i]) { t = s[i]; s[i] = s[j]; s[j] = t }
            return k % 2 ? s[(k + 1) / 2] : (s[k / 2] + s[k / 2 + 1]) / 2
        }
        END {
            printf "%-14s %12.2f %12.2f %12.2f %12.2f %10d %12s\n", e, b / 1e6 / best(enc, NR),
                b / 1e6 / median(enc, NR), b / 1e6 / best(whole, NR), b / 1e6 / median(whole, NR), n, h
            printf "{\"bench\": \"bpe\", \"encoder\": \"%s\", \"bytes\": %d, \"runs\": %d, \"encode_s_best\": %.4f, \"encode_s_median\": %.4f, \"whole_s_best\": %.4f, \"tokens\": %d, \"hash\": %s}\n",
                e, b, NR, best(enc, NR), median(enc, NR), best(whole, NR), n, h > "/dev/stderr"
        }'
done 2> "$WORK/lines"
cat "$WORK/lines"
same=$(sed 's/.*"tokens": \([0-9]*\), "hash": \([0-9]*\).*/\1 \2/' "$WORK/lines" | sort -u | wc -l)
[ "$same" = 1 ] && echo "# the three token streams are equal (count and hash)" ||
    echo "# WARNING: the token streams differ (see tokens and hash)"
