/* GPT-2's byte-level BPE tokenizer: text to GPT-2 tokens and back, from the
 * standard files (OpenAI's encoder.json and vocab.bpe), and decoding from
 * llm.c's gpt2_tokenizer.bin (docs/data.md, "GPT-2's tokenizer").
 *
 * Encoding is GPT-2's (openai/gpt-2, src/encoder.py): the text is split into
 * words by GPT-2's pattern
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (PCRE2, \s as Unicode's White_Space, as Python's `regex` module and
 * tiktoken read it), each word's UTF-8 bytes start as one token per byte,
 * and the adjacent pair of lowest merge rank is merged, every occurrence in
 * the word left to right, until no pair has a rank. Every byte is a token,
 * so any byte string encodes and decodes back exactly; a byte that is not
 * part of valid UTF-8 counts, for the pattern, as a character that is no
 * letter, digit or space (what GPT-2's encoder does with Python's
 * surrogateescape), and is encoded as the byte it is. "<|endoftext|>" in
 * the text is ordinary text; the end-of-text token is ff_bpe_eot.
 *
 * A handle is not thread-safe (encoding fills its cache of words): one per
 * thread. No MPI. */
#ifndef FOURFOLD_BPE_H
#define FOURFOLD_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/ctx.h" /* FF_OK, FF_E* */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ff_bpe ff_bpe;

/* Loads a vocabulary from `path`: a folder with encoder.json and vocab.bpe
 * (encodes and decodes), else a folder with llm.c's gpt2_tokenizer.bin, or
 * that file itself (decodes only). FF_OK; FF_EIO when the files are
 * missing or unreadable (the message says which files a folder needs and
 * how to get GPT-2's); FF_ECORRUPT for a malformed file, naming it, the
 * line and the problem: encoder.json not an object of distinct strings to
 * the ids 0..n-1, a string with a character outside GPT-2's 256 byte
 * characters, a byte without a token of its own; vocab.bpe without its
 * "#version" line, a line that is not two tokens, a merge of or into a
 * token that encoder.json lacks, a merge listed twice; FF_ENOMEM. On
 * failure *out is NULL and err (errlen bytes) holds one sentence. */
int ff_bpe_load(const char *path, ff_bpe **out, char *err, size_t errlen);
/* The same from the two files named explicitly. */
int ff_bpe_load_gpt2(const char *encoder_json, const char *vocab_bpe, ff_bpe **out, char *err,
                     size_t errlen);
void ff_bpe_destroy(ff_bpe *b);

/* Tokens in the vocabulary (GPT-2: 50257). */
int32_t ff_bpe_vocab_size(const ff_bpe *b);
/* The id of "<|endoftext|>" (GPT-2: 50256), or -1 when it has none. */
int32_t ff_bpe_eot(const ff_bpe *b);
/* 1 if the handle encodes (loaded from encoder.json and vocab.bpe), 0 if it
 * only decodes (gpt2_tokenizer.bin). */
int ff_bpe_can_encode(const ff_bpe *b);
/* The file(s) it was loaded from, for messages. */
const char *ff_bpe_source(const ff_bpe *b);
/* The message of the last failure on this handle. */
const char *ff_bpe_error(const ff_bpe *b);

/* Encodes len bytes of text into tokens, which has room for len tokens
 * (never more: every token is at least one byte); *n gets the count. FF_OK,
 * FF_EINVAL for a handle that only decodes, FF_ENOMEM. Words up to a size
 * are cached on the handle (bounded: the cache is emptied when full). */
int ff_bpe_encode(ff_bpe *b, const char *text, size_t len, int32_t *tokens, size_t *n);

/* The bytes of token id (*len of them), or NULL when id is outside the
 * vocabulary. The end-of-text token's are "<|endoftext|>" (GPT-2's). */
const unsigned char *ff_bpe_token(const ff_bpe *b, int32_t id, size_t *len);
/* The text of n tokens: *text malloc'd (NUL-terminated; *len bytes without
 * it). FF_EINVAL naming the first token outside the vocabulary and its
 * offset, FF_ENOMEM. */
int ff_bpe_decode(ff_bpe *b, const int32_t *tokens, size_t n, char **text, size_t *len);

/* Writes llm.c's gpt2_tokenizer.bin (version 2: a header of 256 uint32 —
 * magic 20240328, version, vocabulary size, end-of-text id — then each
 * token as a length byte and its bytes), atomically. FF_EINVAL when the
 * vocabulary has no end-of-text token or a token longer than 255 bytes,
 * FF_EIO; the message is on the handle. */
int ff_bpe_write_llmc(ff_bpe *b, const char *path);

#ifdef __cplusplus
}
#endif
#endif
