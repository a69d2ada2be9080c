#!/bin/sh
# fourfold tokenize from a plain shell (no mpirun): UTF-8 text round-trips
# through a shard exactly; --doc-sep splits fortune-style files into
# documents, one end-of-text token each, shared between train and val;
# a missing input, a truncated shard and bad options are refused with one
# message naming the problem.
#   usage: data_cli.sh FOURFOLD MPIEXEC
set -u
FF=$1 MPIEXEC=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0

fail() { echo "FAILED: $*"; failures=$((failures + 1)); }
ok() { echo "ok  $*"; }

# tokens in a shard: (size - 1024) / 2
ntokens() { echo $((($(wc -c < "$1") - 1024) / 2)); }
# end-of-text tokens (256 = bytes 00 01 little-endian at even offsets) in a shard
neot() {
    od -An -v -tu2 -w2 -j1024 "$1" | awk '$1 == 256 { n++ } END { print n + 0 }'
}

# bad: expected-exit expected-substring args...
bad() {
    code=$1 want=$2
    shift 2
    "$FF" tokenize "$@" > "$WORK/out" 2> "$WORK/err"
    rc=$?
    msg=$(head -1 "$WORK/err")
    if [ "$rc" != "$code" ]; then fail "tokenize $*: exit $rc, want $code ($msg)"
    elif [ "$(wc -l < "$WORK/err")" != 1 ]; then fail "tokenize $*: $(wc -l < "$WORK/err") error lines"; cat "$WORK/err"
    elif ! echo "$msg" | grep -q '^fourfold: error:'; then fail "tokenize $*: '$msg' is not an error line"
    elif ! echo "$msg" | grep -qF -- "$want"; then fail "tokenize $*: '$msg' lacks '$want'"
    else printf 'ok  exit %s  %-50s %s\n' "$code" "$*" "$msg"
    fi
}

# 1. exact round trip of UTF-8 text, one document
printf 'naïve café ✓\nZürich — 東京\n\n  trailing spaces  \nno final newline' > "$WORK/text.txt"
if "$FF" tokenize --val-fraction 0 --out "$WORK/text" "$WORK/text.txt" > "$WORK/out" 2> "$WORK/err"; then
    [ -e "$WORK/text_val.bin" ] && fail "--val-fraction 0 wrote a val shard"
    bytes=$(wc -c < "$WORK/text.txt")
    n=$(ntokens "$WORK/text_train.bin")
    [ "$n" = $((bytes + 1)) ] || fail "round trip: $n tokens for $bytes bytes, want $((bytes + 1))"
    grep -q "text_train.bin: 1 document, $n tokens, $((1024 + 2 * n)) bytes" "$WORK/out" ||
        fail "round trip: summary '$(cat "$WORK/out")'"
    "$FF" tokenize --decode "$WORK/text_train.bin" > "$WORK/text.out" || fail "--decode: exit $?"
    if cmp "$WORK/text.txt" "$WORK/text.out"; then
        ok "round trip: $bytes bytes of UTF-8 -> $n tokens (1 EOT) -> identical text"
    else
        fail "round trip: the decoded text differs"
    fi
else
    fail "tokenize text.txt: exit $? $(cat "$WORK/err")"
fi

# 2. documents separated by '%' lines (fortune(6) files)
cat > "$WORK/f1" << 'EOF'
A day for firm decisions!!!!!  Or is it?
%
A few hours grace before the madness begins again.
%
%
A gift of a flower will soon be made to you.

With a blank line inside.
%
EOF
i=1
while [ $i -le 21 ]; do printf 'fortune %d\n%%\n' $i; i=$((i + 1)); done > "$WORK/f2"
printf 'the last one, without a separator\n' >> "$WORK/f2"
docs=$((3 + 22)) # the empty document between '%' '%' is skipped
"$FF" tokenize --doc-sep % --val-fraction 0.2 --out "$WORK/fort" "$WORK/f1" "$WORK/f2" \
    > "$WORK/out" 2> "$WORK/err" || fail "tokenize --doc-sep: exit $? $(cat "$WORK/err")"
cat "$WORK/out"
if [ -e "$WORK/fort_train.bin" ] && [ -e "$WORK/fort_val.bin" ]; then
    et=$(neot "$WORK/fort_train.bin") ev=$(neot "$WORK/fort_val.bin")
    [ $((et + ev)) = $docs ] || fail "--doc-sep: $et + $ev EOT tokens, want $docs documents"
    [ "$ev" = 5 ] || fail "--doc-sep: $ev val documents, want 5 (0.2 of 25)"
    grep -q "fort_train.bin: $et documents" "$WORK/out" || fail "--doc-sep: train summary"
    grep -q "fort_val.bin: $ev documents" "$WORK/out" || fail "--doc-sep: val summary"
    # every byte is in one of the shards, the separator lines are not
    seps=$(cat "$WORK/f1" "$WORK/f2" | grep -c '^%$')
    want=$(($(cat "$WORK/f1" "$WORK/f2" | wc -c) - 2 * seps + docs))
    got=$(($(ntokens "$WORK/fort_train.bin") + $(ntokens "$WORK/fort_val.bin")))
    [ "$got" = "$want" ] || fail "--doc-sep: $got tokens, want $want"
    # one document per EOT, each decoded followed by its '%' line
    "$FF" tokenize --decode "$WORK/fort_val.bin" --doc-sep % > "$WORK/val.txt"
    [ "$(grep -c '^%$' "$WORK/val.txt")" = "$ev" ] || fail "--decode --doc-sep: separators"
    # documents 4, 9, 14, 19, 24 (from 0): f2's 'fortune 2', 'fortune 7', ...
    grep -q '^fortune 2$' "$WORK/val.txt" && grep -q '^the last one' "$WORK/val.txt" &&
        ! grep -q '^fortune 3$' "$WORK/val.txt" || fail "--decode: val is not every 5th document"
    ok "--doc-sep %: $docs documents = $et train + $ev val EOT tokens, $got tokens"
else
    fail "--doc-sep: no shards written"
fi
# with every document in train, decode --doc-sep gives a fortune file back
"$FF" tokenize --doc-sep % --val-fraction 0 --out "$WORK/f1only" "$WORK/f1" > /dev/null &&
    "$FF" tokenize --decode "$WORK/f1only_train.bin" --doc-sep % > "$WORK/f1.out" &&
    grep -v '^%$' "$WORK/f1" > "$WORK/f1.body" && grep -v '^%$' "$WORK/f1.out" > "$WORK/f1.outbody" &&
    cmp "$WORK/f1.body" "$WORK/f1.outbody" && ok "--decode --doc-sep %: the fortunes read back" ||
    fail "--decode --doc-sep %: the fortunes differ"
FORT=/usr/share/games/fortunes/fortunes
if [ -r "$FORT" ]; then
    "$FF" tokenize --doc-sep % --val-fraction 0 --out "$WORK/real" "$FORT" > /dev/null &&
        "$FF" tokenize --decode "$WORK/real_train.bin" --doc-sep % | cmp - "$FORT" &&
        ok "$FORT: $(neot "$WORK/real_train.bin") documents, decoded identical" ||
        fail "$FORT does not round-trip"
fi

# 3. refusals
bad 1 "cannot read the input '$WORK/missing.txt'" --out "$WORK/x" "$WORK/text.txt" "$WORK/missing.txt"
[ -e "$WORK/x_train.bin" ] && fail "a missing input still wrote a shard"
head -c 1100 "$WORK/fort_train.bin" > "$WORK/cut.bin"
bad 1 "the shard '$WORK/cut.bin' is truncated: header says" --decode "$WORK/cut.bin"
bad 1 "cannot open the shard '$WORK/nothere.bin'" --decode "$WORK/nothere.bin"
bad 1 "leaves no validation document" --out "$WORK/x" "$WORK/text.txt"
bad 2 "needs input files" --out "$WORK/x"
bad 2 "needs --out PREFIX" "$WORK/text.txt"
bad 2 "--val-fraction 1: expected a number from 0 to below 1" --out "$WORK/x" --val-fraction 1 "$WORK/text.txt"
bad 2 "--val-fraction -0.5: expected a number from 0 to below 1" --out "$WORK/x" --val-fraction -0.5 "$WORK/text.txt"
bad 2 "unknown option --frobnicate" --frobnicate
bad 2 "--decode SHARD takes no --out" --decode "$WORK/cut.bin" --out "$WORK/x"
"$FF" tokenize --help > "$WORK/out" 2>&1 && grep -q "usage: fourfold tokenize" "$WORK/out" &&
    ok "--help: exit 0" || fail "--help"

# under a launcher, without MPI_Init, only launcher rank 0 writes
rm -f "$WORK"/text_*.bin
if "$MPIEXEC" -np 2 --oversubscribe "$FF" tokenize --val-fraction 0 --out "$WORK/text" \
    "$WORK/text.txt" > "$WORK/mpi" 2>&1; then
    n=$(grep -c 'text_train.bin: 1 document,' "$WORK/mpi")
    [ "$n" = 1 ] || fail "under mpirun -np 2: the summary printed $n times"
    [ -e "$WORK/text_train.bin" ] && ok "under mpirun -np 2: one summary, one shard" ||
        fail "under mpirun -np 2: no shard"
else
    fail "under mpirun -np 2: exit $?: $(cat "$WORK/mpi")"
fi

echo "data_cli: $failures failures"
[ "$failures" = 0 ]
