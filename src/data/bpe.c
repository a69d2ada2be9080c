/* GPT-2's byte-level BPE (include/fourfold/bpe.h): the vocabulary files,
 * the pre-tokenizing pattern on PCRE2, merges by rank with a cache of
 * words, decoding, llm.c's gpt2_tokenizer.bin. No MPI.
 *
 * The reference is openai/gpt-2's src/encoder.py; tests/bpe_npm.sh
 * compares the tokens with those of its JavaScript port, the npm package
 * gpt-3-encoder, exactly. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "fourfold/bpe.h"

#include <errno.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fourfold/ctx.h" /* FF_E* */
#include "util/file.h"
#include "util/json.h"

enum {
    LLMC_MAGIC = 20240328,
    LLMC_HEADER_INTS = 256,
    /* GPT-2's byte characters are U+0021..U+0143 */
    BYTE_CHARS = 0x144,
    /* words of at most this many bytes are cached (GPT-2's are almost all
     * shorter; a long word is rare and costs O(n log n) anyway) */
    CACHE_WORD_MAX = 64,
    CACHE_SLOTS = 1 << 18, /* emptied when half of them are used */
    MAX_FILE = 1 << 28,    /* 256 MB: GPT-2's files are 1 MB and 0.5 MB */
};

/* The GPT-2 pattern, \s spelled as Unicode's White_Space property (as
 * Python's `regex` and tiktoken read it; PCRE2's own \s is ASCII's, or with
 * PCRE2_UCP has U+180E too),
 * anchored: every character is a letter, a digit, a space or none of them,
 * so a match starts wherever the previous one ended. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\p{White_Space}\\p{L}\\p{N}]+"
    "|\\p{White_Space}+(?!\\P{White_Space})|\\p{White_Space}+";

/* A merge: the pair (left, right), keyed left << 32 | right, its rank and
 * the token it makes. */
typedef struct {
    uint64_t key; /* UINT64_MAX: empty */
    int32_t rank, merged;
} merge_slot;

/* A cached word: its bytes at keys[key_off], its tokens at toks[tok_off]. */
typedef struct {
    uint64_t hash;
    uint32_t key_off, tok_off;
    uint16_t key_len, ntok; /* key_len 0: empty */
} cache_slot;

struct ff_bpe {
    int32_t vocab, eot;
    int can_encode;
    uint32_t *off; /* token i's bytes: bytes[off[i] .. off[i+1]) */
    unsigned char *bytes;
    int32_t byte_token[256];
    merge_slot *merges;
    uint64_t merge_mask;
    pcre2_code *re;
    pcre2_match_data *md;
    /* the cache of words */
    cache_slot *cache;
    uint32_t cache_used;
    unsigned char *keys;
    int32_t *toks;
    size_t keys_used, keys_cap, toks_used, toks_cap;
    /* the word being merged: parts linked by their first byte's index */
    int32_t *part, *next, *prev;
    uint64_t *heap;
    size_t word_cap;
    char *clean; /* the text with invalid UTF-8 bytes replaced for the pattern */
    size_t clean_cap;
    char source[4200];
    char err[512];
};

/* ---- GPT-2's byte characters ------------------------------------------------------- */

/* encoder.py's bytes_to_unicode: the printable bytes ! .. ~, ¡ .. ¬, ® .. ÿ
 * stand for themselves, the other 68 in order for U+0100 onwards. */
static void byte_chars(uint32_t to_char[256], int16_t to_byte[BYTE_CHARS])
{
    for (int c = 0; c < BYTE_CHARS; c++)
        to_byte[c] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        to_char[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        to_byte[to_char[b]] = (int16_t)b;
    }
}

/* The length of the valid UTF-8 sequence at s (RFC 3629: no overlong forms,
 * surrogates or code points above U+10FFFF), 0 if invalid; *cp its code
 * point. */
static size_t utf8_char(const unsigned char *s, size_t len, uint32_t *cp)
{
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t n;
    uint32_t v, min;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2, v = c & 0x1f, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, v = c & 0x0f, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, v = c & 0x07, min = 0x10000;
    else
        return 0;
    if (len < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v < 0xe000))
        return 0;
    *cp = v;
    return n;
}

/* GPT-2's characters (UTF-8) to bytes: out gets at most len bytes; -1 if a
 * character is not one of the 256 (*bad gets it, or 0x110000 for invalid
 * UTF-8). */
static long chars_to_bytes(const int16_t to_byte[BYTE_CHARS], const char *s, size_t len,
                           unsigned char *out, uint32_t *bad)
{
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = utf8_char((const unsigned char *)s + i, len - i, &cp);
        if (k == 0 || cp >= BYTE_CHARS || to_byte[cp] < 0) {
            *bad = k == 0 ? 0x110000 : cp;
            return -1;
        }
        out[n++] = (unsigned char)to_byte[cp];
        i += k;
    }
    return (long)n;
}

/* "the character U+0041", or "invalid UTF-8" for chars_to_bytes's 0x110000. */
static const char *char_name(uint32_t cp, char *out, size_t cap)
{
    if (cp >= 0x110000)
        snprintf(out, cap, "invalid UTF-8");
    else
        snprintf(out, cap, "the character U+%04X", (unsigned)cp);
    return out;
}

/* ---- hashing ------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

static uint64_t hash_bytes(const unsigned char *s, size_t len)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL * (len + 1);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    uint64_t w = 0;
    memcpy(&w, s + i, len - i);
    return mix64(h ^ w);
}

static int fail(ff_bpe *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(ff_bpe *b, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, sizeof b->err, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- merges -------------------------------------------------------------------------- */

/* The merge of (left, right), or NULL. */
static const merge_slot *merge_find(const ff_bpe *b, int32_t left, int32_t right)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint64_t i = mix64(key) & b->merge_mask;; i = (i + 1) & b->merge_mask) {
        const merge_slot *s = &b->merges[i];
        if (s->key == key)
            return s;
        if (s->key == UINT64_MAX)
            return NULL;
    }
}

/* Min-heap of (rank << 32 | position): the lowest rank first, and among
 * equal ranks the leftmost. */
static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1] < h[c])
            c++;
        if (h[c] >= last)
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

/* Pushes the pair that starts at part p, if it has a rank. */
static void push_pair(ff_bpe *b, size_t *nheap, int32_t p, int32_t m)
{
    int32_t q = b->next[p];
    if (p < 0 || b->part[p] < 0 || q >= m)
        return;
    const merge_slot *s = merge_find(b, b->part[p], b->part[q]);
    if (s)
        heap_push(b->heap, nheap, (uint64_t)(uint32_t)s->rank << 32 | (uint32_t)p);
}

/* BPE on one word of m bytes into out (at most m tokens); returns the count.
 * encoder.py's loop, in O(m log m): take the pair of lowest rank, merge
 * every occurrence of it left to right, repeat. The heap holds each
 * pair's rank and position; pairs that a round of merges creates join the
 * heap only when the round is over (a created pair of lower rank must wait,
 * as in encoder.py), and entries that a merge made stale are skipped. */
static size_t merge_word(ff_bpe *b, const unsigned char *w, int32_t m, int32_t *out)
{
    int32_t *part = b->part, *next = b->next, *prev = b->prev;
    size_t nheap = 0;
    for (int32_t i = 0; i < m; i++) {
        part[i] = b->byte_token[w[i]];
        next[i] = i + 1;
        prev[i] = i - 1;
    }
    for (int32_t i = 0; i + 1 < m; i++)
        push_pair(b, &nheap, i, m);
    /* the parts a round changed, whose pairs join the heap after it: at
     * most two per merge, kept past the heap's entries (b->heap holds 4m) */
    uint64_t *changed = b->heap + 2 * (size_t)m;
    while (nheap > 0) {
        uint32_t rank = (uint32_t)(b->heap[0] >> 32);
        size_t nchanged = 0;
        while (nheap > 0 && (uint32_t)(b->heap[0] >> 32) == rank) {
            int32_t p = (int32_t)(uint32_t)heap_pop(b->heap, &nheap), q = next[p];
            if (part[p] < 0 || q >= m)
                continue; /* merged into its left neighbour, or the last part now */
            const merge_slot *s = merge_find(b, part[p], part[q]);
            if (!s || (uint32_t)s->rank != rank)
                continue; /* this pair has changed since */
            part[p] = s->merged;
            part[q] = -1;
            next[p] = next[q];
            if (next[q] < m)
                prev[next[q]] = p;
            if (prev[p] >= 0)
                changed[nchanged++] = (uint64_t)prev[p];
            changed[nchanged++] = (uint64_t)p;
        }
        for (size_t i = 0; i < nchanged; i++)
            push_pair(b, &nheap, (int32_t)changed[i], m);
    }
    size_t n = 0;
    for (int32_t i = 0; i < m; i = next[i])
        out[n++] = part[i];
    return n;
}

/* ---- the cache of words ---------------------------------------------------------------- */

static void cache_clear(ff_bpe *b)
{
    for (size_t i = 0; i < CACHE_SLOTS; i++)
        b->cache[i].key_len = 0;
    b->cache_used = 0;
    b->keys_used = b->toks_used = 0;
}

static const cache_slot *cache_find(const ff_bpe *b, const unsigned char *w, size_t m, uint64_t h)
{
    for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const cache_slot *s = &b->cache[i];
        if (s->key_len == 0)
            return NULL;
        if (s->hash == h && s->key_len == m && memcmp(b->keys + s->key_off, w, m) == 0)
            return s;
    }
}

/* Adds a word (a failed allocation only leaves it out). */
static void cache_add(ff_bpe *b, const unsigned char *w, size_t m, uint64_t h, const int32_t *t,
                      size_t n)
{
    if (b->cache_used >= CACHE_SLOTS / 2)
        cache_clear(b);
    if (b->keys_used + m > b->keys_cap) {
        size_t cap = b->keys_cap ? 2 * b->keys_cap : 1 << 20;
        unsigned char *k = realloc(b->keys, cap);
        if (!k)
            return;
        b->keys = k, b->keys_cap = cap;
    }
    if (b->toks_used + n > b->toks_cap) {
        size_t cap = b->toks_cap ? 2 * b->toks_cap : 1 << 18;
        int32_t *t2 = realloc(b->toks, cap * sizeof *t2);
        if (!t2)
            return;
        b->toks = t2, b->toks_cap = cap;
    }
    size_t i = h & (CACHE_SLOTS - 1);
    while (b->cache[i].key_len != 0)
        i = (i + 1) & (CACHE_SLOTS - 1);
    cache_slot *s = &b->cache[i];
    s->hash = h;
    s->key_off = (uint32_t)b->keys_used;
    s->tok_off = (uint32_t)b->toks_used;
    s->key_len = (uint16_t)m;
    s->ntok = (uint16_t)n;
    memcpy(b->keys + b->keys_used, w, m);
    memcpy(b->toks + b->toks_used, t, n * sizeof *t);
    b->keys_used += m;
    b->toks_used += n;
    b->cache_used++;
}

/* ---- encoding and decoding ------------------------------------------------------------- */

/* One word's tokens into out; returns their count. */
static size_t encode_word(ff_bpe *b, const unsigned char *w, size_t m, int32_t *out)
{
    if (m == 1) {
        out[0] = b->byte_token[w[0]];
        return 1;
    }
    uint64_t h = 0;
    if (m <= CACHE_WORD_MAX && b->cache) {
        h = hash_bytes(w, m);
        const cache_slot *s = cache_find(b, w, m, h);
        if (s) {
            memcpy(out, b->toks + s->tok_off, s->ntok * sizeof *out);
            return s->ntok;
        }
    }
    size_t n = merge_word(b, w, (int32_t)m, out);
    if (m <= CACHE_WORD_MAX && b->cache)
        cache_add(b, w, m, h, out, n);
    return n;
}

/* Room for a word of m bytes (and the heap of its pairs). */
static int reserve_word(ff_bpe *b, size_t m)
{
    if (m <= b->word_cap)
        return FF_OK;
    size_t cap = b->word_cap ? b->word_cap : 256;
    while (cap < m)
        cap *= 2;
    int32_t *part = realloc(b->part, cap * sizeof *part);
    if (part)
        b->part = part;
    int32_t *next = realloc(b->next, cap * sizeof *next);
    if (next)
        b->next = next;
    int32_t *prev = realloc(b->prev, cap * sizeof *prev);
    if (prev)
        b->prev = prev;
    uint64_t *heap = realloc(b->heap, 4 * cap * sizeof *heap);
    if (heap)
        b->heap = heap;
    if (!part || !next || !prev || !heap)
        return fail(b, FF_ENOMEM, "out of memory for a word of %zu bytes", m);
    b->word_cap = cap;
    return FF_OK;
}

int ff_bpe_encode(ff_bpe *b, const char *text, size_t len, int32_t *tokens, size_t *n)
{
    *n = 0;
    if (!b->can_encode)
        return fail(b, FF_EINVAL,
                    "'%s' only decodes: encoding needs GPT-2's encoder.json and vocab.bpe",
                    b->source);
    if (len > INT32_MAX)
        return fail(b, FF_EINVAL, "a text of %zu bytes: encode it in parts below 2 GiB", len);
    if (!b->cache) /* best effort: without it every word is merged anew */
        b->cache = calloc(CACHE_SLOTS, sizeof *b->cache);
    /* bytes outside valid UTF-8 stand for themselves in the tokens; for the
     * pattern, each becomes 0x01, a character that is no letter, digit or
     * space (as surrogateescape's U+DCxx are to Python's regex) */
    const unsigned char *u = (const unsigned char *)text;
    const char *subject = text;
    size_t i = 0;
    uint32_t cp;
    while (i < len) {
        size_t k = u[i] < 0x80 ? 1 : utf8_char(u + i, len - i, &cp);
        if (k == 0)
            break;
        i += k;
    }
    if (i < len) {
        if (len > b->clean_cap) {
            char *c = realloc(b->clean, len);
            if (!c)
                return fail(b, FF_ENOMEM, "out of memory for a text of %zu bytes", len);
            b->clean = c, b->clean_cap = len;
        }
        memcpy(b->clean, text, i);
        while (i < len) {
            size_t k = u[i] < 0x80 ? 1 : utf8_char(u + i, len - i, &cp);
            if (k == 0)
                b->clean[i++] = 0x01;
            else
                for (; k > 0; k--, i++)
                    b->clean[i] = text[i];
        }
        subject = b->clean;
    }
    size_t pos = 0, count = 0;
    while (pos < len) {
        int rc = pcre2_match(b->re, (PCRE2_SPTR)subject, len, pos, PCRE2_NO_UTF_CHECK, b->md, NULL);
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return fail(b, rc == PCRE2_ERROR_NOMEMORY ? FF_ENOMEM : FF_EINVAL,
                        "the pattern failed at byte %zu of the text: %s", pos, (char *)msg);
        }
        size_t end = pcre2_get_ovector_pointer(b->md)[1];
        int frc = reserve_word(b, end - pos);
        if (frc != FF_OK)
            return frc;
        count += encode_word(b, u + pos, end - pos, tokens + count);
        pos = end;
    }
    *n = count;
    return FF_OK;
}

const unsigned char *ff_bpe_token(const ff_bpe *b, int32_t id, size_t *len)
{
    if (id < 0 || id >= b->vocab) {
        *len = 0;
        return NULL;
    }
    *len = b->off[id + 1] - b->off[id];
    return b->bytes + b->off[id];
}

int ff_bpe_decode(ff_bpe *b, const int32_t *tokens, size_t n, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= b->vocab)
            return fail(b, FF_EINVAL,
                        "token %ld at offset %zu is outside the vocabulary of '%s' (%d tokens)",
                        (long)tokens[i], i, b->source, (int)b->vocab);
        total += b->off[tokens[i] + 1] - b->off[tokens[i]];
    }
    char *t = malloc(total + 1);
    if (!t)
        return fail(b, FF_ENOMEM, "out of memory for %zu bytes of text", total);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t m = b->off[tokens[i] + 1] - b->off[tokens[i]];
        memcpy(t + k, b->bytes + b->off[tokens[i]], m);
        k += m;
    }
    t[k] = '\0';
    *text = t;
    *len = k;
    return FF_OK;
}

/* ---- loading ---------------------------------------------------------------------------- */

static ff_bpe *bpe_new(const char *source)
{
    ff_bpe *b = calloc(1, sizeof *b);
    if (b) {
        b->eot = -1;
        snprintf(b->source, sizeof b->source, "%s", source);
        for (int i = 0; i < 256; i++)
            b->byte_token[i] = -1;
    }
    return b;
}

void ff_bpe_destroy(ff_bpe *b)
{
    if (!b)
        return;
    free(b->off);
    free(b->bytes);
    free(b->merges);
    if (b->md)
        pcre2_match_data_free(b->md);
    if (b->re)
        pcre2_code_free(b->re);
    free(b->cache);
    free(b->keys);
    free(b->toks);
    free(b->part);
    free(b->next);
    free(b->prev);
    free(b->heap);
    free(b->clean);
    free(b);
}

int32_t ff_bpe_vocab_size(const ff_bpe *b) { return b->vocab; }
int32_t ff_bpe_eot(const ff_bpe *b) { return b->eot; }
int ff_bpe_can_encode(const ff_bpe *b) { return b->can_encode; }
const char *ff_bpe_source(const ff_bpe *b) { return b->source; }
const char *ff_bpe_error(const ff_bpe *b) { return b->err; }

/* A token's bytes, quoted for a message: printable ASCII as it is, other
 * bytes as \xNN, at most about 40 bytes. */
static const char *quote(const unsigned char *s, size_t len, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < len && k + 8 < cap; i++) {
        if (i == 40) {
            k += (size_t)snprintf(out + k, cap - k, "...");
            break;
        }
        if (s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\\')
            out[k++] = (char)s[i];
        else
            k += (size_t)snprintf(out + k, cap - k, "\\x%02x", s[i]);
    }
    out[k] = '\0';
    return out;
}

/* The tokens' bytes by content, while loading: an open-addressed table of
 * ids over b->off and b->bytes. */
typedef struct {
    int32_t *slot; /* -1: empty */
    size_t mask;
} token_index;

static int32_t index_find(const ff_bpe *b, const token_index *x, const unsigned char *s, size_t len)
{
    for (size_t i = hash_bytes(s, len) & x->mask;; i = (i + 1) & x->mask) {
        int32_t id = x->slot[i];
        if (id < 0)
            return -1;
        if (b->off[id + 1] - b->off[id] == len && memcmp(b->bytes + b->off[id], s, len) == 0)
            return id;
    }
}

/* Parses encoder.json: b->vocab, b->off, b->bytes, b->byte_token, b->eot,
 * and the index by content. */
static int read_encoder(ff_bpe *b, const char *path, const int16_t to_byte[BYTE_CHARS],
                        token_index *x, char *err, size_t errlen)
{
    char *text;
    size_t text_len;
    int rc = ff_json_read_file(path, "vocabulary file", MAX_FILE, &text, &text_len, err, errlen);
    if (rc != FF_OK)
        return rc;
    ff_json r;
    ff_json_init(&r, text, text_len, "vocabulary file", path, err, errlen);
    /* entries in file order: ids[k], bytes at pool[start[k] .. start[k+1]) */
    size_t cap = 1 << 16, n = 0, pool_len = 0, pool_cap = 1 << 20;
    int32_t *ids = malloc(cap * sizeof *ids);
    uint32_t *start = malloc((cap + 1) * sizeof *start);
    unsigned char *pool = malloc(pool_cap);
    char key[1024];
    if (!ids || !start || !pool)
        rc = ff_format_error(err, errlen, FF_ENOMEM, "out of memory reading %s", path);
    int more = rc == FF_OK ? ff_json_open(&r, '{') : 0;
    if (more == 0 && rc == FF_OK && r.rc == FF_OK)
        rc = ff_format_error(err, errlen, FF_ECORRUPT, "vocabulary file %s: an empty object", path);
    while (rc == FF_OK && more > 0) {
        size_t klen;
        double v;
        if (ff_json_string_utf8(&r, key, sizeof key, &klen) || ff_json_expect(&r, ':') ||
            ff_json_number(&r, &v))
            break;
        if (n == cap || pool_len + klen > pool_cap) {
            size_t c2 = n == cap ? 2 * cap : cap,
                   p2 = pool_len + klen > pool_cap ? 2 * pool_cap : pool_cap;
            int32_t *i2 = realloc(ids, c2 * sizeof *ids);
            if (i2)
                ids = i2;
            uint32_t *s2 = realloc(start, (c2 + 1) * sizeof *start);
            if (s2)
                start = s2;
            unsigned char *q2 = realloc(pool, p2);
            if (q2)
                pool = q2;
            if (!i2 || !s2 || !q2) {
                rc = ff_format_error(err, errlen, FF_ENOMEM, "out of memory reading %s", path);
                break;
            }
            cap = c2, pool_cap = p2;
        }
        uint32_t bad = 0;
        long blen = chars_to_bytes(to_byte, key, klen, pool + pool_len, &bad);
        if (klen == 0) {
            ff_json_fail(&r, FF_ECORRUPT, "an empty token");
            break;
        } else if (blen < 0) {
            char what[32];
            ff_json_fail(&r, FF_ECORRUPT,
                         "the token \"%.40s\" has %s, which is not one of GPT-2's 256 byte "
                         "characters",
                         key, char_name(bad, what, sizeof what));
            break;
        } else if (!(v >= 0 && v < INT32_MAX) || v != (double)(int32_t)v) {
            ff_json_fail(&r, FF_ECORRUPT,
                         "the token \"%.40s\" has the id %g, not an id 0 .. 2^31-2", key, v);
            break;
        }
        ids[n] = (int32_t)v;
        start[n] = (uint32_t)pool_len;
        pool_len += (size_t)blen;
        n++;
        more = ff_json_next_member(&r, '}');
    }
    if (rc == FF_OK && r.rc == FF_OK && more == 0 && (ff_json_skip_ws(&r), r.p != r.end))
        ff_json_fail(&r, FF_ECORRUPT, "text after the object");
    if (rc == FF_OK)
        rc = r.rc;
    /* the ids must be 0 .. n-1, each once */
    if (rc == FF_OK) {
        start[n] = (uint32_t)pool_len;
        b->vocab = (int32_t)n;
        b->off = malloc((n + 1) * sizeof *b->off);
        b->bytes = malloc(pool_len ? pool_len : 1);
        int32_t *order = malloc(n * sizeof *order); /* file index of each id */
        if (!b->off || !b->bytes || !order)
            rc = ff_format_error(err, errlen, FF_ENOMEM, "out of memory reading %s", path);
        for (size_t i = 0; rc == FF_OK && i < n; i++)
            order[i] = -1;
        for (size_t k = 0; rc == FF_OK && k < n; k++) {
            char q[200];
            if ((size_t)ids[k] >= n)
                rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                     "vocabulary file %s: the token '%s' has the id %d, but the "
                                     "%zu tokens must have the ids 0 to %zu",
                                     path,
                                     quote(pool + start[k], start[k + 1] - start[k], q, sizeof q),
                                     (int)ids[k], n, n - 1);
            else if (order[ids[k]] >= 0)
                rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                     "vocabulary file %s: the id %d is given twice (to the "
                                     "%dth and the %zuth token)",
                                     path, (int)ids[k], (int)order[ids[k]] + 1, k + 1);
            else
                order[ids[k]] = (int32_t)k;
        }
        size_t at = 0;
        for (size_t id = 0; rc == FF_OK && id < n; id++) {
            size_t k = (size_t)order[id], m = start[k + 1] - start[k];
            b->off[id] = (uint32_t)at;
            memcpy(b->bytes + at, pool + start[k], m);
            at += m;
        }
        if (rc == FF_OK)
            b->off[n] = (uint32_t)at;
        free(order);
    }
    free(ids);
    free(start);
    free(pool);
    free(text);
    /* the index by content: each token's bytes once */
    if (rc == FF_OK) {
        size_t slots = 1;
        while (slots < 2 * (size_t)b->vocab)
            slots *= 2;
        x->mask = slots - 1;
        x->slot = malloc(slots * sizeof *x->slot);
        if (!x->slot)
            rc = ff_format_error(err, errlen, FF_ENOMEM, "out of memory reading %s", path);
        for (size_t i = 0; rc == FF_OK && i < slots; i++)
            x->slot[i] = -1;
    }
    for (int32_t id = 0; rc == FF_OK && id < b->vocab; id++) {
        const unsigned char *s = b->bytes + b->off[id];
        size_t m = b->off[id + 1] - b->off[id];
        int32_t other = index_find(b, x, s, m);
        char q[200];
        if (other >= 0) {
            rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                 "vocabulary file %s: the token '%s' is given twice (ids %d and "
                                 "%d)",
                                 path, quote(s, m, q, sizeof q), (int)other, (int)id);
            break;
        }
        size_t i = hash_bytes(s, m) & x->mask;
        while (x->slot[i] >= 0)
            i = (i + 1) & x->mask;
        x->slot[i] = id;
        if (m == 1)
            b->byte_token[s[0]] = id;
    }
    for (int c = 0; rc == FF_OK && c < 256; c++)
        if (b->byte_token[c] < 0) {
            uint32_t to_char[256];
            int16_t unused[BYTE_CHARS];
            byte_chars(to_char, unused);
            rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                 "vocabulary file %s: the byte 0x%02x (GPT-2's character "
                                 "U+%04X) has no token; a byte-level vocabulary has all 256",
                                 path, c, (unsigned)to_char[c]);
        }
    if (rc == FF_OK)
        b->eot = index_find(b, x, (const unsigned char *)"<|endoftext|>", 13);
    return rc;
}

/* Parses vocab.bpe into b->merges: line 1 "#version: ...", then one merge
 * "A B" per line in rank order (blank lines skipped, as encoder.py's ranks
 * only order them). */
static int read_merges(ff_bpe *b, const char *path, const int16_t to_byte[BYTE_CHARS],
                       const token_index *x, char *err, size_t errlen)
{
    char *text;
    size_t len;
    int rc = ff_json_read_file(path, "vocabulary file", MAX_FILE, &text, &len, err, errlen);
    if (rc != FF_OK)
        return rc;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++)
        lines += text[i] == '\n';
    size_t slots = 1;
    while (slots < 2 * lines)
        slots *= 2;
    b->merges = malloc(slots * sizeof *b->merges);
    b->merge_mask = slots - 1;
    if (!b->merges)
        rc = ff_format_error(err, errlen, FF_ENOMEM, "out of memory reading %s", path);
    for (size_t i = 0; rc == FF_OK && i < slots; i++)
        b->merges[i].key = UINT64_MAX;
    unsigned char *buf = malloc(len + 1);
    if (rc == FF_OK && !buf)
        rc = ff_format_error(err, errlen, FF_ENOMEM, "out of memory reading %s", path);
    if (rc == FF_OK && strncmp(text, "#version", 8) != 0)
        rc = ff_format_error(err, errlen, FF_ECORRUPT,
                             "vocabulary file %s: line 1 is not \"#version: ...\" (GPT-2's merges "
                             "file starts with it)",
                             path);
    int32_t rank = 0;
    size_t line_no = 1;
    const char *p = memchr(text, '\n', len);
    p = p ? p + 1 : text + len;
    while (rc == FF_OK && p < text + len) {
        line_no++;
        const char *e = memchr(p, '\n', (size_t)(text + len - p));
        if (!e)
            e = text + len;
        /* the fields, split at spaces, tabs and \r (encoder.py's split()) */
        const char *f[3];
        size_t flen[3], nf = 0;
        for (const char *q = p; q < e;) {
            while (q < e && (*q == ' ' || *q == '\t' || *q == '\r'))
                q++;
            if (q == e)
                break;
            const char *s = q;
            while (q < e && *q != ' ' && *q != '\t' && *q != '\r')
                q++;
            if (nf < 3)
                f[nf] = s, flen[nf] = (size_t)(q - s);
            nf++;
        }
        if (nf == 0) {
            p = e + 1;
            continue;
        }
        if (nf != 2) {
            rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                 "vocabulary file %s: line %zu: \"%.*s\" is not a merge of two "
                                 "tokens",
                                 path, line_no, (int)(e - p < 60 ? e - p : 60), p);
            break;
        }
        int32_t id[3];
        long blen[2];
        uint32_t bad = 0;
        for (int k = 0; k < 2 && rc == FF_OK; k++) {
            unsigned char *dst = buf + (k ? blen[0] : 0);
            blen[k] = chars_to_bytes(to_byte, f[k], flen[k], dst, &bad);
            char what[32];
            if (blen[k] < 0)
                rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                     "vocabulary file %s: line %zu: \"%.*s\" has %s, which is not "
                                     "one of GPT-2's 256 byte characters",
                                     path, line_no, (int)(flen[k] < 60 ? flen[k] : 60), f[k],
                                     char_name(bad, what, sizeof what));
            else if ((id[k] = index_find(b, x, dst, (size_t)blen[k])) < 0)
                rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                     "vocabulary file %s: line %zu: the merge of \"%.*s\" uses "
                                     "\"%.*s\", which is not a token of encoder.json",
                                     path, line_no, (int)(e - p < 60 ? e - p : 60), p,
                                     (int)(flen[k] < 60 ? flen[k] : 60), f[k]);
        }
        if (rc != FF_OK)
            break;
        if ((id[2] = index_find(b, x, buf, (size_t)(blen[0] + blen[1]))) < 0) {
            rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                 "vocabulary file %s: line %zu: the merge \"%.*s\" makes a token "
                                 "that encoder.json lacks",
                                 path, line_no, (int)(e - p < 60 ? e - p : 60), p);
            break;
        }
        uint64_t key = (uint64_t)(uint32_t)id[0] << 32 | (uint32_t)id[1];
        size_t i = mix64(key) & b->merge_mask;
        while (b->merges[i].key != UINT64_MAX && b->merges[i].key != key)
            i = (i + 1) & b->merge_mask;
        if (b->merges[i].key == key) {
            rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                 "vocabulary file %s: line %zu: the merge \"%.*s\" is listed twice "
                                 "(rank %d before)",
                                 path, line_no, (int)(e - p < 60 ? e - p : 60), p,
                                 (int)b->merges[i].rank);
            break;
        }
        b->merges[i] = (merge_slot){key, rank++, id[2]};
        p = e + 1;
    }
    free(buf);
    free(text);
    return rc;
}

int ff_bpe_load_gpt2(const char *encoder_json, const char *vocab_bpe, ff_bpe **out, char *err,
                     size_t errlen)
{
    *out = NULL;
    char source[4200];
    snprintf(source, sizeof source, "%s and %s", encoder_json, vocab_bpe);
    ff_bpe *b = bpe_new(source);
    if (!b)
        return ff_format_error(err, errlen, FF_ENOMEM, "out of memory");
    uint32_t to_char[256];
    int16_t to_byte[BYTE_CHARS];
    byte_chars(to_char, to_byte);
    token_index x = {NULL, 0};
    int rc = read_encoder(b, encoder_json, to_byte, &x, err, errlen);
    if (rc == FF_OK)
        rc = read_merges(b, vocab_bpe, to_byte, &x, err, errlen);
    free(x.slot);
    if (rc == FF_OK) {
        int code;
        PCRE2_SIZE at;
        b->re = pcre2_compile((PCRE2_SPTR)gpt2_pattern, PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_ANCHORED, &code, &at, NULL);
        if (b->re) {
            pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE); /* else the interpreter: slower */
            b->md = pcre2_match_data_create_from_pattern(b->re, NULL);
        }
        if (!b->re || !b->md) {
            PCRE2_UCHAR msg[256] = "out of memory";
            if (!b->re)
                pcre2_get_error_message(code, msg, sizeof msg);
            rc = ff_format_error(err, errlen, FF_EUNSUPPORTED,
                                 "GPT-2's pattern does not compile with this PCRE2: %s",
                                 (char *)msg);
        }
    }
    if (rc != FF_OK) {
        ff_bpe_destroy(b);
        return rc;
    }
    b->can_encode = 1;
    *out = b;
    return FF_OK;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* llm.c's gpt2_tokenizer.bin (train_gpt2.py's write_tokenizer; read by
 * tokenizer.h): version 1 has the end-of-text id 50256 implied, version 2
 * stores it. */
static int load_llmc(const char *path, ff_bpe **out, char *err, size_t errlen)
{
    char *text;
    size_t len;
    int rc = ff_json_read_file(path, "vocabulary file", MAX_FILE, &text, &len, err, errlen);
    if (rc != FF_OK)
        return rc;
    const unsigned char *u = (const unsigned char *)text;
    uint32_t version = len >= 8 ? le32(u + 4) : 0, n = len >= 12 ? le32(u + 8) : 0;
    if (len < 4 * LLMC_HEADER_INTS || le32(u) != LLMC_MAGIC)
        rc = ff_format_error(
            err, errlen, FF_ECORRUPT, "vocabulary file %s is not llm.c's gpt2_tokenizer.bin (%s)",
            path, len < 4 * LLMC_HEADER_INTS ? "shorter than its header" : "magic is not 20240328");
    else if (version != 1 && version != 2)
        rc = ff_format_error(err, errlen, FF_EUNSUPPORTED,
                             "vocabulary file %s has version %u; fourfold reads llm.c's versions "
                             "1 and 2",
                             path, (unsigned)version);
    else if (n == 0 || n > INT32_MAX / 2)
        rc = ff_format_error(err, errlen, FF_ECORRUPT, "vocabulary file %s: %u tokens", path,
                             (unsigned)n);
    ff_bpe *b = rc == FF_OK ? bpe_new(path) : NULL;
    if (rc == FF_OK && !b)
        rc = ff_format_error(err, errlen, FF_ENOMEM, "out of memory");
    if (rc == FF_OK) {
        b->vocab = (int32_t)n;
        b->off = malloc(((size_t)n + 1) * sizeof *b->off);
        b->bytes = malloc(len);
        if (!b->off || !b->bytes)
            rc = ff_format_error(err, errlen, FF_ENOMEM, "out of memory reading %s", path);
    }
    size_t at = 4 * LLMC_HEADER_INTS, k = 0;
    for (uint32_t id = 0; rc == FF_OK && id < n; id++) {
        size_t m = at < len ? u[at] : 0;
        if (at >= len || at + 1 + m > len)
            rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                 "vocabulary file %s is truncated: token %u of %u is cut off", path,
                                 (unsigned)id, (unsigned)n);
        else if (m == 0)
            rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                 "vocabulary file %s: token %u has length 0", path, (unsigned)id);
        else {
            b->off[id] = (uint32_t)k;
            memcpy(b->bytes + k, u + at + 1, m);
            k += m;
            at += 1 + m;
            if (m == 1 && b->byte_token[b->bytes[b->off[id]]] < 0)
                b->byte_token[b->bytes[b->off[id]]] = (int32_t)id;
        }
    }
    if (rc == FF_OK && at != len)
        rc = ff_format_error(err, errlen, FF_ECORRUPT,
                             "vocabulary file %s is longer than its %u tokens (%zu bytes more)",
                             path, (unsigned)n, len - at);
    if (rc == FF_OK) {
        b->off[n] = (uint32_t)k;
        uint32_t eot = version == 1 ? 50256 : le32(u + 12);
        b->eot = eot < n ? (int32_t)eot : -1;
    }
    free(text);
    if (rc != FF_OK) {
        ff_bpe_destroy(b);
        return rc;
    }
    *out = b;
    return FF_OK;
}

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int ff_bpe_load(const char *path, ff_bpe **out, char *err, size_t errlen)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return ff_format_error(err, errlen, FF_EIO, "cannot open the vocabulary '%s': %s", path,
                               strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return load_llmc(path, out, err, errlen);
    char enc[4200], merges[4200], llmc[4200];
    snprintf(enc, sizeof enc, "%s/encoder.json", path);
    snprintf(merges, sizeof merges, "%s/vocab.bpe", path);
    snprintf(llmc, sizeof llmc, "%s/gpt2_tokenizer.bin", path);
    if (is_file(enc) || is_file(merges))
        return ff_bpe_load_gpt2(enc, merges, out, err, errlen);
    if (is_file(llmc))
        return load_llmc(llmc, out, err, errlen);
    return ff_format_error(err, errlen, FF_EIO,
                           "no vocabulary in '%s': it needs GPT-2's encoder.json and vocab.bpe "
                           "(scripts/setup.sh gpt2-vocab fetches them), or llm.c's "
                           "gpt2_tokenizer.bin (decoding only)",
                           path);
}

int ff_bpe_write_llmc(ff_bpe *b, const char *path)
{
    if (b->eot < 0)
        return fail(b, FF_EINVAL,
                    "cannot write '%s': the vocabulary has no <|endoftext|> token, which llm.c's "
                    "file names",
                    path);
    for (int32_t id = 0; id < b->vocab; id++) {
        size_t m = b->off[id + 1] - b->off[id];
        if (m == 0 || m > 255)
            return fail(b, FF_EINVAL,
                        "cannot write '%s': token %d has %zu bytes; llm.c's file holds 1 to 255",
                        path, (int)id, m);
    }
    uint32_t h[LLMC_HEADER_INTS];
    memset(h, 0, sizeof h);
    h[0] = LLMC_MAGIC;
    h[1] = 2;
    h[2] = (uint32_t)b->vocab;
    h[3] = (uint32_t)b->eot;
    char tmp[FF_TMP_PATH_MAX];
    errno = 0;
    FILE *f = ff_atomic_open(path, tmp);
    int ok = f && fwrite(h, sizeof h, 1, f) == 1;
    for (int32_t id = 0; ok && id < b->vocab; id++) {
        unsigned char m = (unsigned char)(b->off[id + 1] - b->off[id]);
        ok = fputc(m, f) != EOF && fwrite(b->bytes + b->off[id], 1, m, f) == m;
    }
    if (f && !ok)
        ff_atomic_abort(f, tmp);
    if (f && ok && ff_atomic_commit(f, tmp, path) != 0)
        ok = 0;
    return ok ? FF_OK
              : fail(b, FF_EIO, "cannot write '%s': %s", path,
                     errno ? strerror(errno) : "write failed");
}
