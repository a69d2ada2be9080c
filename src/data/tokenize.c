/* The byte-level tokenizer (include/fourfold/data.h): text files to llm.c
 * token shards, documents split between training and validation, and the
 * default corpus (Debian's fortune(6) files). No MPI except in
 * ff_corpus_default. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "fourfold/data.h"

typedef struct {
    uint16_t *tok;
    int64_t n, cap, docs;
} token_buf;

static int buf_push(token_buf *b, const unsigned char *bytes, size_t len, int eot)
{
    int64_t need = b->n + (int64_t)len + (eot ? 1 : 0);
    if (need > b->cap) {
        int64_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < need)
            cap *= 2;
        uint16_t *t = realloc(b->tok, (size_t)cap * sizeof(uint16_t));
        if (!t)
            return -1;
        b->tok = t;
        b->cap = cap;
    }
    if (eot)
        b->tok[b->n++] = FF_BYTE_EOT;
    for (size_t i = 0; i < len; i++)
        b->tok[b->n++] = bytes[i];
    return 0;
}

typedef struct {
    token_buf train, val;
    double val_fraction;
    int64_t docs;       /* documents seen (non-empty) */
    unsigned char *doc; /* the document being read */
    size_t doc_len, doc_cap;
    ff_bpe *bpe;      /* GPT-2's tokens instead of bytes (ff_tokenize_files_bpe) */
    int32_t *encoded; /* a document's tokens from bpe */
    size_t encoded_cap;
} corpus;

/* The document index i goes to val when the running count floor(i F) steps
 * up: exactly floor(n F) of n documents, evenly spread. */
static int is_val(double f, int64_t i) { return floor((double)(i + 1) * f) > floor((double)i * f); }

static int doc_append(corpus *c, const char *bytes, size_t len)
{
    if (c->doc_len + len > c->doc_cap) {
        size_t cap = c->doc_cap ? c->doc_cap : 4096;
        while (cap < c->doc_len + len)
            cap *= 2;
        unsigned char *d = realloc(c->doc, cap);
        if (!d)
            return -1;
        c->doc = d;
        c->doc_cap = cap;
    }
    memcpy(c->doc + c->doc_len, bytes, len);
    c->doc_len += len;
    return 0;
}

/* A document's tokens from c->bpe after its end-of-text token. */
static int push_bpe(corpus *c, token_buf *b)
{
    if (c->doc_len > c->encoded_cap) {
        int32_t *e = realloc(c->encoded, c->doc_len * sizeof *e);
        if (!e)
            return -1;
        c->encoded = e;
        c->encoded_cap = c->doc_len;
    }
    size_t n;
    if (ff_bpe_encode(c->bpe, (const char *)c->doc, c->doc_len, c->encoded, &n) != FF_OK)
        return -1; /* out of memory: the handle encodes (ff_tokenize_files_bpe checked) */
    /* room for EOT and n tokens (n <= doc_len) through buf_push, then them */
    if (buf_push(b, c->doc, n, 1) != 0)
        return -1;
    uint16_t *t = b->tok + b->n - (int64_t)n - 1;
    t[0] = (uint16_t)ff_bpe_eot(c->bpe);
    for (size_t i = 0; i < n; i++)
        t[1 + i] = (uint16_t)c->encoded[i];
    return 0;
}

/* Ends the current document: EOT and its bytes go to train or val. */
static int doc_end(corpus *c)
{
    if (c->doc_len == 0)
        return 0; /* an empty document (two separators in a row, an empty file) */
    token_buf *b = is_val(c->val_fraction, c->docs) ? &c->val : &c->train;
    c->docs++;
    b->docs++;
    int rc = c->bpe ? push_bpe(c, b) : buf_push(b, c->doc, c->doc_len, 1);
    c->doc_len = 0;
    return rc;
}

/* Reads one input file into the corpus. Returns FF_OK, or FF_EIO with a
 * message in err. */
static int read_file(corpus *c, const char *path, const char *sep, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot read the input '%s': %s", path, strerror(errno));
        return FF_EIO;
    }
    char *line = NULL;
    size_t cap = 0, sep_len = sep ? strlen(sep) : 0;
    ssize_t len;
    int code = FF_OK;
    errno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        size_t body = (size_t)len - (len > 0 && line[len - 1] == '\n' ? 1 : 0);
        if (sep && body == sep_len && memcmp(line, sep, sep_len) == 0) {
            if (doc_end(c) != 0) {
                snprintf(err, errlen, "out of memory reading '%s'", path);
                code = FF_EIO;
                break;
            }
            continue;
        }
        if (doc_append(c, line, (size_t)len) != 0) {
            snprintf(err, errlen, "out of memory reading '%s'", path);
            code = FF_EIO;
            break;
        }
    }
    if (code == FF_OK && ferror(f)) {
        snprintf(err, errlen, "cannot read the input '%s': %s", path,
                 errno ? strerror(errno) : "read error");
        code = FF_EIO;
    }
    if (code == FF_OK && doc_end(c) != 0) {
        snprintf(err, errlen, "out of memory reading '%s'", path);
        code = FF_EIO;
    }
    free(line);
    fclose(f);
    return code;
}

static int write_shard(const char *prefix, const char *split, const token_buf *b,
                       ff_shard_stats *st, char *err, size_t errlen)
{
    size_t len = strlen(prefix) + strlen(split) + 8;
    char *path = malloc(len);
    if (!path) {
        snprintf(err, errlen, "out of memory");
        return FF_EIO;
    }
    snprintf(path, len, "%s_%s.bin", prefix, split);
    int code = FF_OK;
    if (ff_shard_write(path, b->tok, b->n, err, errlen) != FF_OK) {
        code = FF_EIO;
    } else if (st) {
        snprintf(st->path, sizeof st->path, "%s", path);
        st->docs = b->docs;
        st->tokens = b->n;
    }
    free(path);
    return code;
}

static int tokenize_files(const char *const *inputs, int ninputs, const char *sep,
                          double val_fraction, const char *out, ff_bpe *bpe,
                          ff_tokenize_report *rep, char *err, size_t errlen)
{
    if (rep)
        memset(rep, 0, sizeof *rep);
    if (!(val_fraction >= 0 && val_fraction < 1)) { /* NaN included */
        snprintf(err, errlen,
                 "the validation fraction %g is outside [0, 1): 0 for no validation shard, "
                 "0.1 for every tenth document",
                 val_fraction);
        return FF_EINVAL;
    }
    int code = FF_OK;
    corpus c;
    memset(&c, 0, sizeof c);
    c.val_fraction = val_fraction;
    c.bpe = bpe;
    for (int i = 0; i < ninputs && code == FF_OK; i++)
        code = read_file(&c, inputs[i], sep, err, errlen);
    if (code == FF_OK && c.docs == 0) {
        snprintf(err, errlen, "the inputs hold no text (%d files, every document empty)", ninputs);
        code = FF_EIO;
    } else if (code == FF_OK && val_fraction > 0 && c.val.docs == 0) {
        snprintf(err, errlen,
                 "--val-fraction %g of %lld document%s leaves no validation document; give "
                 "more documents (--doc-sep) or --val-fraction 0",
                 val_fraction, (long long)c.docs, c.docs == 1 ? "" : "s");
        code = FF_EIO;
    } else if (code == FF_OK && (c.train.n > INT32_MAX || c.val.n > INT32_MAX)) {
        snprintf(err, errlen,
                 "%lld tokens: more than one shard holds (%d); split the inputs into several "
                 "runs",
                 (long long)(c.train.n > c.val.n ? c.train.n : c.val.n), INT32_MAX);
        code = FF_EIO;
    }
    if (code == FF_OK)
        code = write_shard(out, "train", &c.train, rep ? &rep->train : NULL, err, errlen);
    if (code == FF_OK && val_fraction > 0)
        code = write_shard(out, "val", &c.val, rep ? &rep->val : NULL, err, errlen);
    free(c.train.tok);
    free(c.val.tok);
    free(c.doc);
    free(c.encoded);
    return code;
}

int ff_tokenize_files(const char *const *inputs, int ninputs, const char *sep, double val_fraction,
                      const char *out, ff_tokenize_report *rep, char *err, size_t errlen)
{
    return tokenize_files(inputs, ninputs, sep, val_fraction, out, NULL, rep, err, errlen);
}

int ff_tokenize_files_bpe(const char *const *inputs, int ninputs, const char *sep,
                          double val_fraction, const char *out, ff_bpe *bpe,
                          ff_tokenize_report *rep, char *err, size_t errlen)
{
    if (rep)
        memset(rep, 0, sizeof *rep);
    if (!ff_bpe_can_encode(bpe)) {
        snprintf(err, errlen,
                 "'%s' only decodes: encoding needs GPT-2's encoder.json and vocab.bpe",
                 ff_bpe_source(bpe));
        return FF_EINVAL;
    }
    if (ff_bpe_eot(bpe) < 0) {
        snprintf(err, errlen, "the vocabulary %s has no <|endoftext|> token to separate documents",
                 ff_bpe_source(bpe));
        return FF_EINVAL;
    }
    if (ff_bpe_vocab_size(bpe) > 65536) {
        snprintf(err, errlen,
                 "the vocabulary %s has %d tokens; llm.c's shards hold uint16 tokens (65536)",
                 ff_bpe_source(bpe), (int)ff_bpe_vocab_size(bpe));
        return FF_EINVAL;
    }
    return tokenize_files(inputs, ninputs, sep, val_fraction, out, bpe, rep, err, errlen);
}

/* Debian's `fortunes` package: one file per topic, fortunes separated by
 * lines "%"; each file has a .dat index and a .u8 link beside it. */
static const char fortunes_dir[] = "/usr/share/games/fortunes";

static int is_fortune_file(const struct dirent *e)
{
    char path[1024];
    struct stat sb;
    if (e->d_name[0] == '.' || strchr(e->d_name, '.'))
        return 0;
    snprintf(path, sizeof path, "%s/%s", fortunes_dir, e->d_name);
    return lstat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

int ff_corpus_fortunes(const char *dir, ff_tokenize_report *rep, char *err, size_t err_len)
{
    if (rep)
        memset(rep, 0, sizeof *rep);
    char prefix[4200], train[4300], val[4300];
    snprintf(prefix, sizeof prefix, "%s/fortunes", dir);
    snprintf(train, sizeof train, "%s_train.bin", prefix);
    snprintf(val, sizeof val, "%s_val.bin", prefix);
    if (access(train, R_OK) == 0 && access(val, R_OK) == 0)
        return FF_OK;
    struct dirent **list = NULL;
    int n = scandir(fortunes_dir, &list, is_fortune_file, alphasort);
    if (n <= 0) {
        snprintf(err, err_len,
                 "no --data, and the default corpus (%s, Debian's fortunes package) is missing; "
                 "install it (scripts/setup.sh does) or give --data",
                 fortunes_dir);
        free(list);
        return FF_EIO;
    }
    const char **inputs = calloc((size_t)n, sizeof *inputs);
    char(*paths)[1024] = calloc((size_t)n, sizeof *paths);
    int code = inputs && paths ? FF_OK : FF_EIO;
    if (code != FF_OK)
        snprintf(err, err_len, "out of memory");
    for (int i = 0; i < n; i++) {
        if (code == FF_OK) {
            snprintf(paths[i], sizeof paths[i], "%s/%s", fortunes_dir, list[i]->d_name);
            inputs[i] = paths[i];
        }
        free(list[i]);
    }
    free(list);
    if (code == FF_OK && mkdir(dir, 0777) != 0 && errno != EEXIST) {
        snprintf(err, err_len, "cannot create '%s': %s", dir, strerror(errno));
        code = FF_EIO;
    }
    if (code == FF_OK)
        code = ff_tokenize_files(inputs, n, "%", 0.1, prefix, rep, err, err_len);
    if (code == FF_OK && rep)
        rep->files = n;
    free(inputs);
    free(paths);
    return code;
}

int ff_corpus_default(ff_ctx *ctx, const char *dir, char *train, char *val, size_t len,
                      ff_tokenize_report *rep)
{
    char err[512] = "";
    int rc = FF_OK;
    ff_tokenize_report r;
    memset(&r, 0, sizeof r);
    if (ff_ctx_rank(ctx) == 0 && ff_corpus_fortunes(dir, &r, err, sizeof err) != FF_OK)
        rc = ff_ctx_set_error(ctx, FF_EIO, "%s", err);
    snprintf(train, len, "%s/fortunes_train.bin", dir);
    snprintf(val, len, "%s/fortunes_val.bin", dir);
    if ((rc = ff_ctx_agree(ctx, rc)) == FF_OK) /* every rank gets rank 0's report */
        MPI_Bcast(&r, (int)sizeof r, MPI_BYTE, 0, ff_ctx_comm(ctx));
    if (rep)
        *rep = r;
    return rc;
}
