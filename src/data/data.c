/* Token shards and the grid-independent batch reader (include/fourfold/data.h).
 *
 * The reader keeps only the shards' names and token counts; tokens are read
 * with pread() from the shard the position is in (one descriptor kept open),
 * so opening a data set of many gigabytes costs a header read per shard. */
#include "fourfold/data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/file.h"

enum { HEADER_BYTES = FF_SHARD_HEADER_INTS * (int)sizeof(int32_t) };

struct ff_data {
    ff_ctx *ctx;
    int nshards;
    char **names;   /* (nshards) sorted by name */
    int64_t *ntok;  /* (nshards) tokens of each shard */
    int64_t total;  /* tokens of all shards */
    int64_t window; /* S = n_micro*B*T + 1 */
    ff_data_pos pos;
    int fd;        /* open descriptor of shard fd_shard, or -1 */
    int fd_shard;  /* which shard fd is */
    uint16_t *buf; /* (T + 1) tokens of one sequence and its last target */
    size_t buf_len;
};

/* ---- the shard format -------------------------------------------------------------- */

/* Reads exactly len bytes at offset; returns 0, or -1 with errno set (0 for
 * an unexpected end of file). */
static int pread_full(int fd, void *dst, size_t len, off_t offset)
{
    char *p = dst;
    while (len > 0) {
        ssize_t got = pread(fd, p, len, offset);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got == 0)
                errno = 0;
            return -1;
        }
        p += got;
        len -= (size_t)got;
        offset += got;
    }
    return 0;
}

/* Opens `path` and checks its header against its size. On success returns 0
 * with the open descriptor in *fd and the token count in *ntok; otherwise a
 * negative code with the message in err (and no descriptor left open). */
static int shard_open(const char *path, int *fd_out, int64_t *ntok, char *err, size_t errlen)
{
    *fd_out = -1;
    int fd = ff_open_regular(path);
    if (fd < 0)
        return ff_format_error(err, errlen, FF_EIO, "cannot open the shard '%s': %s", path,
                               ff_open_error(errno));
    struct stat st;
    int32_t h[FF_SHARD_HEADER_INTS];
    int rc = FF_OK;
    if (fstat(fd, &st) != 0)
        rc = ff_format_error(err, errlen, FF_EIO, "cannot stat the shard '%s': %s", path,
                             strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = ff_format_error(err, errlen, FF_EIO, "the shard '%s' is not a regular file", path);
    else if (st.st_size < HEADER_BYTES)
        rc = ff_format_error(
            err, errlen, FF_ECORRUPT,
            "the shard '%s' is truncated: %lld bytes, shorter than its %d-byte header", path,
            (long long)st.st_size, HEADER_BYTES);
    else if (pread_full(fd, h, sizeof h, 0) != 0)
        rc = ff_format_error(err, errlen, FF_EIO, "cannot read the header of the shard '%s': %s",
                             path, errno ? strerror(errno) : "unexpected end of file");
    else if (h[0] != FF_SHARD_MAGIC)
        rc = ff_format_error(err, errlen, FF_ECORRUPT,
                             "'%s' is not a token shard (magic %d, expected %d)", path, (int)h[0],
                             FF_SHARD_MAGIC);
    else if (h[1] != FF_SHARD_VERSION)
        rc = ff_format_error(
            err, errlen, FF_EUNSUPPORTED,
            "the shard '%s' has version %d%s; fourfold reads version %d (uint16 tokens)", path,
            (int)h[1], h[1] == 2 ? " (uint32 tokens)" : "", FF_SHARD_VERSION);
    else if (h[2] < 0)
        rc = ff_format_error(err, errlen, FF_ECORRUPT,
                             "the shard '%s' has a negative token count (%d)", path, (int)h[2]);
    if (rc == FF_OK) {
        /* exactly header + n uint16: a shorter file lost its end, a longer one
         * is not what its header says (llm.c's readers check the same) */
        int64_t n = h[2], body = (int64_t)st.st_size - HEADER_BYTES;
        if (body < 2 * n)
            rc = ff_format_error(
                err, errlen, FF_ECORRUPT,
                "the shard '%s' is truncated: header says %lld tokens, the file holds "
                "%lld",
                path, (long long)n, (long long)(body / 2));
        else if (body > 2 * n)
            rc = ff_format_error(
                err, errlen, FF_ECORRUPT,
                "the shard '%s' is longer than its header says: header says %lld tokens "
                "(%lld bytes), the file has %lld bytes",
                path, (long long)n, (long long)(HEADER_BYTES + 2 * n), (long long)st.st_size);
        else
            *ntok = n;
    }
    if (rc != FF_OK)
        close(fd);
    else
        *fd_out = fd;
    return rc;
}

int ff_shard_write(const char *path, const uint16_t *tokens, int64_t n, char *err, size_t errlen)
{
    if (!path || n < 0 || n > INT32_MAX || (n > 0 && !tokens))
        return ff_format_error(err, errlen, FF_EINVAL,
                               "cannot write the shard '%s': %lld tokens (a shard holds 0 to %d)",
                               path ? path : "(null)", (long long)n, INT32_MAX);
    int32_t h[FF_SHARD_HEADER_INTS];
    memset(h, 0, sizeof h);
    h[0] = FF_SHARD_MAGIC;
    h[1] = FF_SHARD_VERSION;
    h[2] = (int32_t)n;
    /* a reader sees the old file or the whole new one (util/file.h) */
    char tmp[FF_TMP_PATH_MAX];
    errno = 0;
    FILE *f = ff_atomic_open(path, tmp);
    int ok = f && fwrite(h, sizeof h, 1, f) == 1 &&
             (n == 0 || fwrite(tokens, sizeof(uint16_t), (size_t)n, f) == (size_t)n);
    if (f && !ok)
        ff_atomic_abort(f, tmp);
    if (f && ok && ff_atomic_commit(f, tmp, path) != 0)
        ok = 0;
    return ok ? FF_OK
              : ff_format_error(err, errlen, FF_EIO, "cannot write the shard '%s': %s", path,
                                errno ? strerror(errno) : "write failed");
}

int ff_shard_read(const char *path, uint16_t **tokens, int64_t *n, char *err, size_t errlen)
{
    *tokens = NULL;
    *n = 0;
    int fd;
    int64_t ntok;
    int rc = shard_open(path, &fd, &ntok, err, errlen);
    if (rc != FF_OK)
        return rc;
    uint16_t *t = malloc(ntok > 0 ? (size_t)ntok * sizeof(uint16_t) : 1);
    if (!t)
        rc = ff_format_error(err, errlen, FF_ENOMEM, "out of memory for the %lld tokens of '%s'",
                             (long long)ntok, path);
    else if (ntok > 0 && pread_full(fd, t, (size_t)ntok * sizeof(uint16_t), HEADER_BYTES) != 0)
        rc = ff_format_error(err, errlen, FF_EIO, "cannot read the tokens of the shard '%s': %s",
                             path, errno ? strerror(errno) : "unexpected end of file");
    close(fd);
    if (rc != FF_OK) {
        free(t);
        return rc;
    }
    *tokens = t;
    *n = ntok;
    return FF_OK;
}

/* ---- opening ----------------------------------------------------------------------- */

static void data_free(ff_data *d)
{
    if (!d)
        return;
    if (d->fd >= 0)
        close(d->fd);
    for (int i = 0; d->names && i < d->nshards; i++)
        free(d->names[i]);
    free(d->names);
    free(d->ntok);
    free(d->buf);
    free(d);
}

/* The local part of ff_data_open: every rank runs it on the same files. */
static int data_scan(ff_ctx *ctx, const char *pattern, int64_t window, ff_data *d)
{
    if (!pattern || !*pattern)
        return ff_ctx_set_error(ctx, FF_EINVAL, "no token files given (an empty pattern)");
    if (window < 2)
        return ff_ctx_set_error(
            ctx, FF_EINVAL, "a window of %lld tokens: a step reads at least 2 (n_micro*B*T + 1)",
            (long long)window);
    glob_t g;
    int grc = glob(pattern, 0, NULL, &g);
    if (grc == GLOB_NOMATCH) {
        globfree(&g);
        return ff_ctx_set_error(ctx, FF_EIO, "no file matches '%s'", pattern);
    }
    if (grc != 0) {
        globfree(&g);
        return grc == GLOB_NOSPACE
                   ? ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory expanding '%s'", pattern)
                   : ff_ctx_set_error(ctx, FF_EIO, "cannot read a directory of '%s'", pattern);
    }
    if (g.gl_pathc > (size_t)INT32_MAX) {
        globfree(&g);
        return ff_ctx_set_error(ctx, FF_EINVAL, "'%s' matches too many files", pattern);
    }
    int n = (int)g.gl_pathc, rc = FF_OK;
    d->names = calloc((size_t)n, sizeof *d->names);
    d->ntok = calloc((size_t)n, sizeof *d->ntok);
    if (!d->names || !d->ntok)
        rc = ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory for %d shard names", n);
    /* glob(3) returns the names sorted (no GLOB_NOSORT) */
    for (int i = 0; i < n && rc == FF_OK; i++) {
        if (!(d->names[i] = strdup(g.gl_pathv[i]))) {
            rc = ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory for the shard names");
            break;
        }
        d->nshards = i + 1;
        char err[512];
        int fd;
        rc = shard_open(d->names[i], &fd, &d->ntok[i], err, sizeof err);
        if (rc != FF_OK) {
            ff_ctx_set_error(ctx, rc, "%s", err);
            break;
        }
        close(fd);
        d->total += d->ntok[i];
    }
    globfree(&g);
    if (rc != FF_OK)
        return rc;
    int largest = 0;
    for (int i = 1; i < n; i++)
        if (d->ntok[i] > d->ntok[largest])
            largest = i;
    if (d->ntok[largest] < window)
        return ff_ctx_set_error(
            ctx, FF_EINVAL,
            "no shard of '%s' holds a window of %lld tokens (n_micro*B*T + 1); the largest, "
            "'%s', has %lld",
            pattern, (long long)window, d->names[largest], (long long)d->ntok[largest]);
    return FF_OK;
}

int ff_data_open(ff_ctx *ctx, const char *pattern, int64_t window, ff_data **out)
{
    *out = NULL;
    ff_data *d = calloc(1, sizeof *d);
    int rc = d ? FF_OK : ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory for a data reader");
    if (d) {
        d->ctx = ctx;
        d->fd = -1;
        d->window = window;
        rc = data_scan(ctx, pattern, window, d);
    }
    /* every rank saw the same files, but a file system may disagree (a shard
     * written while the job starts): one outcome for all */
    rc = ff_ctx_agree(ctx, rc);
    if (rc != FF_OK) {
        data_free(d);
        return rc;
    }
    *out = d;
    return FF_OK;
}

void ff_data_close(ff_data *d) { data_free(d); }

int ff_data_num_shards(const ff_data *d) { return d->nshards; }
int64_t ff_data_total_tokens(const ff_data *d) { return d->total; }
const char *ff_data_shard_name(const ff_data *d, int i)
{
    return i >= 0 && i < d->nshards ? d->names[i] : NULL;
}

/* ---- position ---------------------------------------------------------------------- */

ff_data_pos ff_data_tell(const ff_data *d) { return d->pos; }

ff_data_pos ff_data_spread(const ff_data *d, int64_t i, int64_t n)
{
    /* shard s has ntok[s] - S + 1 starts of a whole window (none if shorter) */
    int64_t starts = 0;
    for (int s = 0; s < d->nshards; s++)
        starts += d->ntok[s] >= d->window ? d->ntok[s] - d->window + 1 : 0;
    if (n < 1 || i < 0 || i >= n)
        i = 0, n = 1;
    int64_t g = i * (starts / n) + i * (starts % n) / n; /* floor(i * starts / n) */
    for (int s = 0; s < d->nshards; s++) {
        int64_t k = d->ntok[s] >= d->window ? d->ntok[s] - d->window + 1 : 0;
        if (g < k)
            return (ff_data_pos){s, g, 0};
        g -= k;
    }
    return (ff_data_pos){0, 0, 0}; /* not reached: ff_data_open found a window */
}

int ff_data_seek(ff_data *d, ff_data_pos pos)
{
    if (pos.shard < 0 || pos.shard >= d->nshards || pos.offset < 0 ||
        pos.offset > d->ntok[pos.shard] || pos.epoch < 0)
        return ff_ctx_set_error(d->ctx, FF_EINVAL,
                                "data position (shard %lld, offset %lld, epoch %lld) is outside "
                                "the %d shards (a checkpoint of other data?)",
                                (long long)pos.shard, (long long)pos.offset, (long long)pos.epoch,
                                d->nshards);
    d->pos = pos;
    return FF_OK;
}

/* Moves the position to where the next window starts: here if the window
 * fits, else the beginning of the next shard that holds one (wrapping to
 * the first shard with epoch + 1). ff_data_open made sure one exists. */
static void normalize(ff_data *d)
{
    ff_data_pos *p = &d->pos;
    while (p->offset + d->window > d->ntok[p->shard]) {
        p->offset = 0;
        if (++p->shard == d->nshards) {
            p->shard = 0;
            p->epoch++;
        }
    }
}

static int ensure_open(ff_data *d, int shard)
{
    if (d->fd >= 0 && d->fd_shard == shard)
        return FF_OK;
    if (d->fd >= 0)
        close(d->fd);
    d->fd = open(d->names[shard], O_RDONLY);
    d->fd_shard = shard;
    if (d->fd < 0)
        return ff_ctx_set_error(d->ctx, FF_EIO, "cannot open the shard '%s': %s", d->names[shard],
                                strerror(errno));
    return FF_OK;
}

int ff_data_next(ff_data *d, int n_micro, int B, int T, int first, int count, int vocab,
                 int32_t *tokens, int32_t *targets)
{
    if (n_micro < 1 || B < 1 || T < 1 || first < 0 || count < 0 || count > B - first || vocab < 1)
        return ff_ctx_set_error(d->ctx, FF_EINVAL,
                                "data: bad step shape n_micro=%d B=%d T=%d sequences [%d, %d) "
                                "vocab %d",
                                n_micro, B, T, first, first + count, vocab);
    const int64_t S = (int64_t)n_micro * B * T + 1;
    if (S != d->window)
        return ff_ctx_set_error(d->ctx, FF_EINVAL,
                                "data: a step of %d x %d x %d tokens reads windows of %lld, the "
                                "reader was opened for %lld",
                                n_micro, B, T, (long long)S, (long long)d->window);
    if (d->buf_len < (size_t)T + 1) {
        uint16_t *b = realloc(d->buf, ((size_t)T + 1) * sizeof(uint16_t));
        if (!b)
            return ff_ctx_set_error(d->ctx, FF_ENOMEM, "out of memory for a sequence");
        d->buf = b;
        d->buf_len = (size_t)T + 1;
    }
    normalize(d);
    const int shard = (int)d->pos.shard;
    int rc = ensure_open(d, shard);
    if (rc != FF_OK)
        return rc;
    for (int u = 0; u < n_micro; u++)
        for (int j = 0; j < count; j++) {
            /* sequence s of the step: tokens [s*T, s*T + T] of the window */
            const int64_t s = (int64_t)u * B + first + j;
            const int64_t at = d->pos.offset + s * T;
            const size_t row = ((size_t)u * (size_t)count + (size_t)j) * (size_t)T;
            if (pread_full(d->fd, d->buf, ((size_t)T + 1) * sizeof(uint16_t),
                           (off_t)(HEADER_BYTES + 2 * at)) != 0)
                return ff_ctx_set_error(d->ctx, FF_EIO,
                                        "cannot read tokens %lld..%lld of the shard '%s': %s",
                                        (long long)at, (long long)(at + T), d->names[shard],
                                        errno ? strerror(errno) : "the file became shorter");
            for (int t = 0; t <= T; t++)
                if (d->buf[t] >= vocab)
                    return ff_ctx_set_error(d->ctx, FF_ECORRUPT,
                                            "the shard '%s' has token %d at offset %lld, outside "
                                            "the vocabulary of %d",
                                            d->names[shard], (int)d->buf[t], (long long)(at + t),
                                            vocab);
            for (int t = 0; t < T; t++) {
                tokens[row + (size_t)t] = d->buf[t];
                targets[row + (size_t)t] = d->buf[t + 1];
            }
        }
    d->pos.offset += S - 1;
    return FF_OK;
}
