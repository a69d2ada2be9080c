/* Token data: llm.c's shard format, a grid-independent reader, and the
 * byte-level tokenizer behind `fourfold tokenize`.
 *
 * A shard (llm.c, dev/data/data_common.py) is a header of 256 int32 — magic
 * 20240520, version 1, the number of tokens n — followed by n uint16 tokens.
 * Several shards (a glob, sorted by name) form one stream.
 *
 * Batches are read from a position in that stream that does not depend on
 * the grid: a step of n_micro micro-batches of B sequences of T tokens reads
 * the window of S = n_micro*B*T + 1 tokens at the position (sequence s of the
 * step: tokens [s*T, s*T + T), targets shifted by one), then advances the
 * position by S - 1. A window that would cross the end of a shard starts at
 * the beginning of the next shard instead; after the last shard the stream
 * starts again at the first (epoch + 1). Every rank reads only its own
 * sequences of each micro-batch (ff_gpt_local_sequences), so a run resumed
 * from a saved position on another grid reads the same global batches. */
#ifndef FOURFOLD_DATA_H
#define FOURFOLD_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/bpe.h"
#include "fourfold/ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { FF_SHARD_MAGIC = 20240520, FF_SHARD_VERSION = 1, FF_SHARD_HEADER_INTS = 256 };

/* The byte-level vocabulary of `fourfold tokenize`: tokens 0..255 are the
 * bytes, FF_BYTE_EOT separates documents. */
enum { FF_BYTE_EOT = 256, FF_BYTE_VOCAB = 257 };

/* A position in the token stream: shard index (in sorted order), token
 * offset in it, and how many times the stream has wrapped around. */
typedef struct {
    int64_t shard, offset, epoch;
} ff_data_pos;

typedef struct ff_data ff_data;

/* Opens the shards matching `pattern` (glob(3), sorted by name) for windows
 * of `window` tokens (n_micro*B*T + 1). Checks every shard's header (magic,
 * version) and that its size is exactly header + n tokens, and that at
 * least one shard holds a whole window; refuses otherwise with a message
 * naming the file ("no file matches", "is truncated: header says N tokens,
 * the file holds M", ...). Collective over the context: every rank checks,
 * the outcome is agreed (ff_ctx_agree), so all return the same code. Tokens
 * are read on demand (pread), not loaded. Position starts at {0, 0, 0}. */
int ff_data_open(ff_ctx *ctx, const char *pattern, int64_t window, ff_data **out);
void ff_data_close(ff_data *d);

int ff_data_num_shards(const ff_data *d);
int64_t ff_data_total_tokens(const ff_data *d);
const char *ff_data_shard_name(const ff_data *d, int i);

/* The position after the last step read: the shard and offset where that
 * window started plus S - 1 (the next window starts here if it fits in the
 * shard, else at the next shard that holds one; the epoch counts up when
 * that search wraps to the first shard). Save it with a checkpoint. */
ff_data_pos ff_data_tell(const ff_data *d);
/* The start of window i of n (0 <= i < n; else window 0) spread evenly over
 * the places a whole window of the reader's S tokens can start: start
 * floor(i * U / n) of the U such places, counted shard by shard (a shard of
 * N >= S tokens has N - S + 1). Distinct for distinct i while n <= U.
 * Validation on a sample of the whole held-out set rather than its first
 * documents. */
ff_data_pos ff_data_spread(const ff_data *d, int64_t i, int64_t n);
/* Sets the position (from a checkpoint). Refuses a position outside the
 * shards. Local (no communication). */
int ff_data_seek(ff_data *d, ff_data_pos pos);

/* Reads one step: for each micro-batch u < n_micro of B sequences of T
 * tokens, this rank's sequences [first, first + count) into
 * tokens[(u*count + j)*T ..] and targets likewise (int32), then advances
 * the position. Every token must be < vocab, else FF_ECORRUPT naming the
 * shard and offset. A read error is FF_EIO. Local (no communication): call
 * it on every rank with the same n_micro, B, T so positions stay equal. */
int ff_data_next(ff_data *d, int n_micro, int B, int T, int first, int count, int vocab,
                 int32_t *tokens, int32_t *targets);

/* ---- byte-level tokenizer ---------------------------------------------------------- */

/* Writes a shard atomically (temporary file, fsync, rename). Returns 0 or
 * FF_EIO (FF_EINVAL for n outside 0..INT32_MAX, the header's range); *err
 * (if not NULL) gets a message. No MPI needed. */
int ff_shard_write(const char *path, const uint16_t *tokens, int64_t n, char *err, size_t errlen);
/* Reads a whole shard (checked as ff_data_open does); *tokens is malloc'd. */
int ff_shard_read(const char *path, uint16_t **tokens, int64_t *n, char *err, size_t errlen);

typedef struct {
    char path[4096]; /* "" if not written */
    int64_t docs, tokens;
} ff_shard_stats;
typedef struct {
    ff_shard_stats train, val;
    int files; /* inputs read (ff_corpus_fortunes: 0 when the shards already existed) */
} ff_tokenize_report;

/* Tokenizes text files into PREFIX_train.bin and PREFIX_val.bin (byte-level,
 * FF_BYTE_EOT before every document). sep: a line that separates documents
 * inside a file (fortune(6)'s "%"), or NULL for one document per file.
 * Document i (from 0, in input order) goes to validation when
 * floor((i+1) f) > floor(i f): every (1/f)-th document; f = 0 writes no
 * validation shard, f > 0 that leaves it empty is refused. FF_OK; FF_EINVAL
 * for an f outside [0, 1) (nothing read or written); or FF_EIO; with a
 * message in err. No MPI. rep may be NULL. */
int ff_tokenize_files(const char *const *inputs, int ninputs, const char *sep, double val_fraction,
                      const char *prefix, ff_tokenize_report *rep, char *err, size_t errlen);
/* The same with GPT-2's byte-level BPE (include/fourfold/bpe.h): each
 * document's tokens from bpe, after the vocabulary's end-of-text token.
 * FF_EINVAL (nothing read) for a vocabulary that only decodes, has no
 * "<|endoftext|>", or more than 65536 tokens (llm.c's shards hold uint16);
 * else as ff_tokenize_files. Uses bpe's cache (not thread-safe). */
int ff_tokenize_files_bpe(const char *const *inputs, int ninputs, const char *sep,
                          double val_fraction, const char *prefix, ff_bpe *bpe,
                          ff_tokenize_report *rep, char *err, size_t errlen);
/* The default corpus: DIR/fortunes_train.bin and DIR/fortunes_val.bin made
 * from the fortune(6) files of Debian's `fortunes` package (one document per
 * fortune, every tenth held out), unless both exist. DIR's parent must
 * exist. No MPI. */
int ff_corpus_fortunes(const char *dir, ff_tokenize_report *rep, char *err, size_t err_len);
/* ff_corpus_fortunes on rank 0 of the context, the outcome agreed and its
 * report sent to every rank; train and val get the two shard paths (len
 * bytes each). Collective. */
int ff_corpus_default(ff_ctx *ctx, const char *dir, char *train, char *val, size_t len,
                      ff_tokenize_report *rep);

#ifdef __cplusplus
}
#endif
#endif
