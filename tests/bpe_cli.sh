#!/bin/sh
# GPT-2's tokenizer in the program (docs/data.md, docs/train.md), on the
# vocabulary tests/test_bpe.c writes (byte b is token 255 - b, 19 merges,
# <|endoftext|> 275; 276 tokens), so it needs no download:
# - tokenize --bpe writes the hand-derived tokens, splits documents and
#   round-trips text with invalid UTF-8 through the files and through the
#   gpt2_tokenizer.bin it writes beside the shards;
# - sample and eval on a model of that vocabulary: a prompt encoded and
#   continued as text (the vocabulary given, and found beside the checkpoint),
#   the loss of a text;
# - bad input: a malformed encoder.json or vocab.bpe, a token outside the
#   vocabulary, a vocabulary that does not match the model's V, a prompt
#   without an encoder: one message, exit 1 (2 for usage) on every rank.
# With QUICK 1 (the sanitizer build, whose CI time is spent), of the runs
# under mpirun only training, a prompt and eval --prompt: the library's
# paths are test_bpe's and tokenize's.
#   usage: bpe_cli.sh FOURFOLD MPIEXEC NP TEST_BPE [QUICK]
set -u
FF=$1 MPIEXEC=$2 NP=$3 TEST_BPE=$4 QUICK=${5:-0}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0
. "$(dirname "$0")/cases.sh"
fail() { echo "FAILED: $*"; failures=$((failures + 1)); }
ok() { echo "ok  $*"; }
# no vocabulary from scripts/setup.sh gpt2-vocab's cache in these checks
export XDG_CACHE_HOME="$WORK/cache"

V="$WORK/vocab"
mkdir -p "$V" "$WORK/data" "$WORK/llmc" "$WORK/bad1" "$WORK/bad2" "$WORK/small" "$WORK/empty"
"$TEST_BPE" --write-vocab "$V" || fail "test_bpe --write-vocab: exit $?"
# a shard's tokens on one line
tokens() { od -An -v -tu2 -w2 -j1024 "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'; }
# a shard of the given tokens (python3: struct), for tokens no text makes
shard() {
    python3 -c 'import struct, sys
t = [int(x) for x in sys.argv[2:]]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, len(t), *[0] * 253) + struct.pack("<%dH" % len(t), *t))' "$@"
}
# tokenize: expected-exit expected-substring args... (no MPI)
tok_bad() {
    code=$1 want=$2
    shift 2
    "$FF" tokenize "$@" > "$WORK/out" 2> "$WORK/err"
    rc=$?
    msg=$(head -1 "$WORK/err")
    if [ "$rc" != "$code" ]; then fail "tokenize $*: exit $rc, want $code ($msg)"
    elif [ "$(wc -l < "$WORK/err")" != 1 ]; then fail "tokenize $*: $(wc -l < "$WORK/err") error lines"
    elif ! echo "$msg" | grep -qF -- "$want"; then fail "tokenize $*: '$msg' lacks '$want'"
    else echo "ok  exit $code  tokenize ${want}: $msg"
    fi
}

# 1. the hand-derived tokens of tests/test_bpe.c: EOT, "hello", " w", o r l d
printf 'hello world' > "$WORK/a.txt"
"$FF" tokenize --bpe "$V" --val-fraction 0 --out "$WORK/data/a" "$WORK/a.txt" > "$WORK/out" 2>&1 ||
    fail "tokenize --bpe: exit $? $(cat "$WORK/out")"
got=$(tokens "$WORK/data/a_train.bin")
[ "$got" = "275 259 261 144 141 147 155" ] && ok "'hello world' -> $got (EOT, hello, ' w', o, r, l, d)" ||
    fail "'hello world' -> '$got', want '275 259 261 144 141 147 155'"
grep -q "gpt2_tokenizer.bin: the vocabulary, 276 tokens" "$WORK/out" ||
    fail "no gpt2_tokenizer.bin line: $(cat "$WORK/out")"

# 2. documents by --doc-sep, invalid UTF-8 bytes: exact round trips
printf 'first \377 doc!\n%%\nZ\303\274rich  2024\n\n%%\n\300\257 don'"'"'t  \n%%\n' > "$WORK/b.txt"
i=0
while [ $i -lt 40 ]; do printf 'hello world, aaaa abc xyxy %d\n%%\n' $i; i=$((i + 1)); done >> "$WORK/b.txt"
"$FF" tokenize --bpe "$V" --doc-sep % --val-fraction 0.1 --out "$WORK/data/b" "$WORK/b.txt" \
    > "$WORK/out" 2>&1 || fail "tokenize --bpe --doc-sep: exit $? $(cat "$WORK/out")"
cat "$WORK/out"
eot=$(tokens "$WORK/data/b_train.bin" | tr ' ' '\n' | grep -c '^275$')
eotv=$(tokens "$WORK/data/b_val.bin" | tr ' ' '\n' | grep -c '^275$')
[ "$eot" = 39 ] && [ "$eotv" = 4 ] && ok "--doc-sep: 43 documents, 39 + 4 end-of-text tokens" ||
    fail "--doc-sep: $eot + $eotv end-of-text tokens, want 39 + 4"
"$FF" tokenize --bpe "$V" --doc-sep % --val-fraction 0 --out "$WORK/data/c" "$WORK/b.txt" > /dev/null 2>&1 ||
    fail "tokenize c: exit $?"
for vocab in "$V" "$WORK/data/gpt2_tokenizer.bin"; do
    "$FF" tokenize --decode "$WORK/data/c_train.bin" --bpe "$vocab" --doc-sep % > "$WORK/back.txt" ||
        fail "--decode --bpe $vocab: exit $?"
    cmp -s "$WORK/b.txt" "$WORK/back.txt" &&
        ok "--decode --bpe $(basename "$vocab"): $(wc -c < "$WORK/b.txt") bytes with invalid UTF-8, exactly" ||
        fail "--decode --bpe $vocab differs: $(cmp "$WORK/b.txt" "$WORK/back.txt")"
done

# 3. tokenize's bad input: one message, exit 1
cp "$V/encoder.json" "$V/vocab.bpe" "$WORK/bad1/"
head -c 2000 "$V/encoder.json" > "$WORK/bad1/encoder.json"
cp "$V/encoder.json" "$V/vocab.bpe" "$WORK/bad2/"
printf 'h e l\n' >> "$WORK/bad2/vocab.bpe"
cp "$WORK/data/gpt2_tokenizer.bin" "$WORK/llmc/"
shard "$WORK/oov.bin" 275 259 300 261 275 259 261 275 259 261 275 259 261 275 259 261 275 259 261 275
tok_bad 1 "cannot open the vocabulary '/nonexistent/gpt2'" --bpe /nonexistent/gpt2 --out "$WORK/x" "$WORK/a.txt"
tok_bad 1 "no vocabulary in" --bpe "$WORK/empty" --out "$WORK/x" "$WORK/a.txt"
tok_bad 1 "bad1/encoder.json: line 1" --bpe "$WORK/bad1" --out "$WORK/x" "$WORK/a.txt"
tok_bad 1 "bad2/vocab.bpe: line 21: \"h e l\" is not a merge of two tokens" --bpe "$WORK/bad2" --out "$WORK/x" "$WORK/a.txt"
tok_bad 1 "only decodes" --bpe "$WORK/llmc" --out "$WORK/x" "$WORK/a.txt"
tok_bad 1 "token 300 at offset 2 is outside the vocabulary" --decode "$WORK/oov.bin" --bpe "$V"
tok_bad 1 "token 275 at offset 0 is not a byte-level token" --decode "$WORK/oov.bin"
[ -e "$WORK/x_train.bin" ] && fail "a refused tokenize wrote a shard"

# 4. a model of the 276 tokens (1 step; the text is what matters) on NP ranks
mpi() { "$MPIEXEC" -np "$NP" --oversubscribe --mca mpi_yield_when_idle 1 "$FF" "$@"; }
mpi train --grid data --vocab 276 --layers 1 --hidden 16 --heads 2 --max-seq 16 --seq 16 \
    --batch "$NP" --steps 1 --data "$WORK/data/c_train.bin" --out "$WORK/run" > "$WORK/out" 2>&1 ||
    fail "train: exit $? $(tail -5 "$WORK/out")"
M="$WORK/run/model_00000001.bin"
mpi sample --grid data --checkpoint "$M" --bpe "$V" --prompt "hello world" --tokens 8 \
    > "$WORK/out" 2>&1 || fail "sample --prompt: exit $? $(cat "$WORK/out")"
head -c 11 "$WORK/out" | grep -q '^hello world$' &&
    ok "sample --bpe --prompt 'hello world': $(head -c 60 "$WORK/out" | tr '\n' '|')" ||
    fail "sample --prompt: $(head -3 "$WORK/out")"
grep -q '^[0-9]* [0-9]' "$WORK/out" && fail "sample printed token ids with a vocabulary"
mpi eval --grid data --checkpoint "$M" --bpe "$V" --prompt "hello world" > "$WORK/out" 2>&1 ||
    fail "eval --prompt: exit $?"
grep -q '^loss [0-9.]* on the 6 tokens of the text' "$WORK/out" &&
    ok "eval --prompt 'hello world': $(grep '^loss' "$WORK/out")" || fail "eval --prompt: $(cat "$WORK/out")"
python3 -c 'import struct, sys
open(sys.argv[1], "wb").write(struct.pack("<256I", 20240328, 2, 3, 2, *[0] * 252) + bytes([1, 97, 1, 98, 1, 99]))' \
    "$WORK/small/gpt2_tokenizer.bin"
if [ "$QUICK" = 1 ]; then
    [ "$failures" = 0 ] && echo "bpe_cli: all checks passed (quick)" || echo "bpe_cli: $failures failed"
    exit $((failures != 0))
fi
# the checkpoint's folder has no vocabulary; the data's has gpt2_tokenizer.bin
cp "$M" "$WORK/data/m.bin"
mpi sample --grid data --checkpoint "$WORK/data/m.bin" --tokens 8 > "$WORK/out" 2>&1 ||
    fail "sample (vocabulary beside it): exit $?"
grep -q 'note: token ids' "$WORK/out" && fail "sample found no vocabulary beside the checkpoint" ||
    ok "sample: the vocabulary found beside the checkpoint (gpt2_tokenizer.bin): text"
mpi sample --grid data --checkpoint "$M" --tokens 8 > "$WORK/out" 2>&1 || fail "sample: exit $?"
grep -q 'note: token ids: no vocabulary of 276 tokens found' "$WORK/out" &&
    ok "sample without a vocabulary: a note, then token ids" || fail "sample: $(head -3 "$WORK/out")"

# 5. bad input on NP ranks: one message, every rank's exit code
case_ "has 3 tokens, but the model '$M' has 276" 1 sample --grid data --checkpoint "$M" --bpe "$WORK/small"
case_ "--bpe: vocabulary file $WORK/bad1/encoder.json: line 1" 1 sample --grid data --checkpoint "$M" --bpe "$WORK/bad1"
case_ "bad2/vocab.bpe: line 21" 1 sample --grid data --checkpoint "$M" --bpe "$WORK/bad2" --prompt "hi"
case_ "--prompt needs the vocabulary of this model of 276 tokens" 1 eval --grid data --checkpoint "$M" --prompt "hi"
case_ "decodes only; encoding needs GPT-2's encoder.json" 1 sample --grid data --checkpoint "$M" --bpe "$WORK/llmc" --prompt "hi"
case_ "the text is 0 tokens" 1 eval --grid data --checkpoint "$M" --bpe "$V" --prompt ""
case_ "has token 300 at offset 2, outside the vocabulary of 276" 1 eval --grid data --checkpoint "$M" --data "$WORK/oov.bin" --seq 2 --batch "$NP"
case_ "takes --data GLOB or --prompt TEXT, not both" 2 eval --grid data --checkpoint "$M" --data "$WORK/oov.bin" --prompt "hi"

[ "$failures" = 0 ] && echo "bpe_cli: all checks passed" || echo "bpe_cli: $failures failed"
[ "$failures" = 0 ]
