/* fourfold tokenize: UTF-8 text files to byte-level token shards, and back.
 *
 * Tokens 0..255 are the bytes of the text, FF_BYTE_EOT (256) precedes every
 * document (GPT-2's and llm.c's convention), so a model trained on these
 * shards has a vocabulary of FF_BYTE_VOCAB = 257 (docs/data.md).
 *
 * Runs without MPI: main() does not initialise MPI for this command. Started
 * under mpirun anyway, only the process whose launcher rank is 0 works (the
 * others would write the same files). */
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

#include "cli.h"

static const char help[] =
    "usage: fourfold tokenize --out PREFIX [options] FILE...\n"
    "       fourfold tokenize --decode SHARD [--doc-sep LINE]\n\n"
    "Byte-level tokenizer (no MPI needed; docs/data.md): tokens 0..255 are the bytes of\n"
    "the UTF-8 text, token 256 (end of text) precedes every document; vocabulary 257.\n"
    "Writes llm.c-format shards PREFIX_train.bin and PREFIX_val.bin.\n\n"
    "  --out PREFIX        output prefix (required): PREFIX_train.bin, PREFIX_val.bin\n"
    "  --val-fraction F    fraction of the documents for validation, 0 <= F < 1 (default\n"
    "                      0.1). Document i (from 0, in input order) goes to val when\n"
    "                      floor((i+1) F) > floor(i F): every (1/F)-th document, spread\n"
    "                      over the corpus. 0: no val file is written. F > 0 that leaves\n"
    "                      val empty (too few documents) is refused.\n"
    "  --doc-sep LINE      a line that separates documents inside a file, e.g. '%' for\n"
    "                      fortune(6) files; the separator lines are not part of any\n"
    "                      document, empty documents are skipped (default: each file is\n"
    "                      one document)\n"
    "  --decode SHARD      write the text of a shard to stdout: bytes as they are, end of\n"
    "                      text as nothing, or, with --doc-sep LINE, as LINE after every\n"
    "                      document (a fortune-style file round-trips exactly)\n"
    "  --help              this text\n\n"
    "example (the fortunes package; every fortune one document):\n"
    "  fourfold tokenize --doc-sep % --out data/fortunes /usr/share/games/fortunes/fortunes\n"
    "  fourfold tokenize --decode data/fortunes_val.bin --doc-sep % | head\n";

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

/* Ends the current document: EOT and its bytes go to train or val. */
static int doc_end(corpus *c)
{
    if (c->doc_len == 0)
        return 0; /* an empty document (two separators in a row, an empty file) */
    token_buf *b = is_val(c->val_fraction, c->docs) ? &c->val : &c->train;
    c->docs++;
    b->docs++;
    int rc = buf_push(b, c->doc, c->doc_len, 1);
    c->doc_len = 0;
    return rc;
}

/* Reads one input file into the corpus. Returns CLI_OK, or CLI_FAIL with a
 * message in err. */
static int read_file(corpus *c, const char *path, const char *sep, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot read the input '%s': %s", path, strerror(errno));
        return CLI_FAIL;
    }
    char *line = NULL;
    size_t cap = 0, sep_len = sep ? strlen(sep) : 0;
    ssize_t len;
    int code = CLI_OK;
    errno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        size_t body = (size_t)len - (len > 0 && line[len - 1] == '\n' ? 1 : 0);
        if (sep && body == sep_len && memcmp(line, sep, sep_len) == 0) {
            if (doc_end(c) != 0) {
                snprintf(err, errlen, "out of memory reading '%s'", path);
                code = CLI_FAIL;
                break;
            }
            continue;
        }
        if (doc_append(c, line, (size_t)len) != 0) {
            snprintf(err, errlen, "out of memory reading '%s'", path);
            code = CLI_FAIL;
            break;
        }
    }
    if (code == CLI_OK && ferror(f)) {
        snprintf(err, errlen, "cannot read the input '%s': %s", path,
                 errno ? strerror(errno) : "read error");
        code = CLI_FAIL;
    }
    if (code == CLI_OK && doc_end(c) != 0) {
        snprintf(err, errlen, "out of memory reading '%s'", path);
        code = CLI_FAIL;
    }
    free(line);
    fclose(f);
    return code;
}

static int write_shard(const char *prefix, const char *split, const token_buf *b, char *err,
                       size_t errlen)
{
    size_t len = strlen(prefix) + strlen(split) + 8;
    char *path = malloc(len);
    if (!path) {
        snprintf(err, errlen, "out of memory");
        return CLI_FAIL;
    }
    snprintf(path, len, "%s_%s.bin", prefix, split);
    int code = CLI_OK;
    if (ff_shard_write(path, b->tok, b->n, err, errlen) != FF_OK) {
        code = CLI_FAIL;
    } else {
        cli_print("%s: %lld document%s, %lld tokens, %lld bytes\n", path, (long long)b->docs,
                  b->docs == 1 ? "" : "s", (long long)b->n,
                  (long long)(FF_SHARD_HEADER_INTS * 4 + 2 * b->n));
    }
    free(path);
    return code;
}

/* Writes the shard's text to stdout: bytes as they are, EOT as nothing, or
 * (with a separator) as the separator line after every document. */
static int decode(const char *path, const char *sep)
{
    uint16_t *tok;
    int64_t n;
    char err[512];
    if (ff_shard_read(path, &tok, &n, err, sizeof err) != FF_OK) {
        cli_error("%s", err);
        return CLI_FAIL;
    }
    int code = CLI_OK, in_doc = 0, last = '\n';
    for (int64_t i = 0; i < n && code == CLI_OK; i++) {
        if (tok[i] > FF_BYTE_EOT) {
            cli_error("'%s': token %d at offset %lld is not a byte-level token (vocabulary %d)",
                      path, (int)tok[i], (long long)i, FF_BYTE_VOCAB);
            code = CLI_FAIL;
        } else if (tok[i] == FF_BYTE_EOT) {
            if (sep && in_doc)
                printf("%s%s\n", last == '\n' ? "" : "\n", sep);
            in_doc = 1;
            last = '\n';
        } else {
            putchar(tok[i]);
            last = tok[i];
            in_doc = 1;
        }
    }
    if (code == CLI_OK && sep && in_doc)
        printf("%s%s\n", last == '\n' ? "" : "\n", sep);
    free(tok);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        cli_error("cannot write the text of '%s' to stdout", path);
        code = CLI_FAIL;
    }
    return code;
}

/* Tokenizes the inputs into OUT_train.bin and OUT_val.bin. Returns CLI_OK,
 * or CLI_FAIL with a message in err. */
static int tokenize_files(const char *const *inputs, int ninputs, const char *sep,
                          double val_fraction, const char *out, char *err, size_t errlen)
{
    int code = CLI_OK;
    corpus c;
    memset(&c, 0, sizeof c);
    c.val_fraction = val_fraction;
    for (int i = 0; i < ninputs && code == CLI_OK; i++)
        code = read_file(&c, inputs[i], sep, err, errlen);
    if (code == CLI_OK && c.docs == 0) {
        snprintf(err, errlen, "the inputs hold no text (%d files, every document empty)", ninputs);
        code = CLI_FAIL;
    } else if (code == CLI_OK && val_fraction > 0 && c.val.docs == 0) {
        snprintf(err, errlen,
                 "--val-fraction %g of %lld document%s leaves no validation document; give "
                 "more documents (--doc-sep) or --val-fraction 0",
                 val_fraction, (long long)c.docs, c.docs == 1 ? "" : "s");
        code = CLI_FAIL;
    } else if (code == CLI_OK && (c.train.n > INT32_MAX || c.val.n > INT32_MAX)) {
        snprintf(err, errlen,
                 "%lld tokens: more than one shard holds (%d); split the inputs into several "
                 "runs",
                 (long long)(c.train.n > c.val.n ? c.train.n : c.val.n), INT32_MAX);
        code = CLI_FAIL;
    }
    if (code == CLI_OK)
        code = write_shard(out, "train", &c.train, err, errlen);
    if (code == CLI_OK && val_fraction > 0)
        code = write_shard(out, "val", &c.val, err, errlen);
    free(c.train.tok);
    free(c.val.tok);
    free(c.doc);
    return code;
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

int cli_default_corpus(const char *dir, char *err, size_t err_len)
{
    char prefix[4200], train[4300], val[4300];
    snprintf(prefix, sizeof prefix, "%s/fortunes", dir);
    snprintf(train, sizeof train, "%s_train.bin", prefix);
    snprintf(val, sizeof val, "%s_val.bin", prefix);
    if (access(train, R_OK) == 0 && access(val, R_OK) == 0)
        return 0;
    struct dirent **list = NULL;
    int n = scandir(fortunes_dir, &list, is_fortune_file, alphasort);
    if (n <= 0) {
        snprintf(err, err_len,
                 "no --data, and the default corpus (%s, Debian's fortunes package) is missing; "
                 "install it (scripts/setup.sh does) or give --data",
                 fortunes_dir);
        free(list);
        return -1;
    }
    const char **inputs = calloc((size_t)n, sizeof *inputs);
    char(*paths)[1024] = calloc((size_t)n, sizeof *paths);
    int code = inputs && paths ? CLI_OK : CLI_FAIL;
    if (code != CLI_OK)
        snprintf(err, err_len, "out of memory");
    for (int i = 0; i < n; i++) {
        if (code == CLI_OK) {
            snprintf(paths[i], sizeof paths[i], "%s/%s", fortunes_dir, list[i]->d_name);
            inputs[i] = paths[i];
        }
        free(list[i]);
    }
    free(list);
    if (code == CLI_OK && mkdir(dir, 0777) != 0 && errno != EEXIST) {
        snprintf(err, err_len, "cannot create '%s': %s", dir, strerror(errno));
        code = CLI_FAIL;
    }
    if (code == CLI_OK) {
        cli_print("default corpus: the %d files of %s, one document per fortune\n", n,
                  fortunes_dir);
        code = tokenize_files(inputs, n, "%", 0.1, prefix, err, err_len);
    }
    free(inputs);
    free(paths);
    return code == CLI_OK ? 0 : -1;
}

int cmd_tokenize(int argc, char **argv)
{
    if (cli_quiet_process())
        return CLI_OK;
    const char *out = NULL, *sep = NULL, *decode_path = NULL, *v;
    double val_fraction = 0.1;
    int ninputs = 0;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    if (!inputs) {
        cli_error("out of memory");
        return CLI_FAIL;
    }
    cli_args a;
    cli_args_init(&a, argc, argv);
    int code = CLI_OK;
    while (code == CLI_OK && cli_next(&a)) {
        if (!a.name) {
            inputs[ninputs++] = a.value;
        } else if (cli_is(&a, "help")) {
            cli_print("%s", help);
            free(inputs);
            return CLI_OK;
        } else if (cli_is(&a, "out")) {
            if (!(out = cli_value(&a)))
                code = CLI_USAGE;
        } else if (cli_is(&a, "doc-sep")) {
            if (!(sep = cli_value(&a)))
                code = CLI_USAGE;
        } else if (cli_is(&a, "decode")) {
            if (!(decode_path = cli_value(&a)))
                code = CLI_USAGE;
        } else if (cli_is(&a, "val-fraction")) {
            char *end;
            if (!(v = cli_value(&a))) {
                code = CLI_USAGE;
            } else if ((val_fraction = strtod(v, &end)),
                       end == v || *end || !(val_fraction >= 0 && val_fraction < 1)) {
                /* below 1: a train shard with no document is of no use */
                cli_error("--val-fraction %s: expected a number from 0 to below 1", v);
                code = CLI_USAGE;
            }
        } else {
            code = cli_unknown(&a, "tokenize");
        }
    }
    if (code == CLI_OK && decode_path && (out || ninputs)) {
        cli_error("--decode SHARD takes no --out or input files");
        code = CLI_USAGE;
    } else if (code == CLI_OK && !decode_path && !out) {
        cli_error("tokenize needs --out PREFIX (see fourfold tokenize --help)");
        code = CLI_USAGE;
    } else if (code == CLI_OK && !decode_path && !ninputs) {
        cli_error("tokenize needs input files (see fourfold tokenize --help)");
        code = CLI_USAGE;
    } else if (code == CLI_OK && sep && strchr(sep, '\n')) {
        cli_error("--doc-sep: the separator is one line, without a newline");
        code = CLI_USAGE;
    }
    if (code != CLI_OK || decode_path) {
        free(inputs);
        return code == CLI_OK ? decode(decode_path, sep) : code;
    }

    char err[1024] = "";
    code = tokenize_files(inputs, ninputs, sep, val_fraction, out, err, sizeof err);
    if (code != CLI_OK)
        cli_error("%s", err);
    free(inputs);
    return code;
}
