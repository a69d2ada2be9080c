/* IDX files through zlib, and images as floats (include/fourfold/image.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "fourfold/ctx.h"
#include "fourfold/image.h"
#include "util/file.h"

/* Largest file the reader accepts: the data must fit a size_t and one
 * gzread call takes an unsigned int, so it reads in pieces of this. */
enum { READ_PIECE = 1 << 30 };
static const int64_t MAX_ELEMENTS = (int64_t)1 << 40;

/* Reads up to n bytes; the number read, or -1 with the stream's error in
 * err (a truncated gzip stream is an error here, not a short read). */
static int64_t read_bytes(gzFile f, void *buf, int64_t n, const char *path, char *err,
                          size_t errlen)
{
    int64_t got = 0;
    while (got < n) {
        unsigned want = (unsigned)(n - got < READ_PIECE ? n - got : READ_PIECE);
        int r = gzread(f, (char *)buf + got, want);
        int zerr;
        const char *msg = gzerror(f, &zerr);
        if (r < 0 || (zerr != Z_OK && zerr != Z_STREAM_END)) {
            /* zlib names the stream "<fd:N>: " before its message */
            const char *colon = zerr == Z_ERRNO ? NULL : strstr(msg, ": ");
            ff_format_error(err, errlen, FF_ECORRUPT, "the IDX file '%s': %s%s", path,
                            zerr == Z_ERRNO ? "" : "gzip stream: ",
                            zerr == Z_ERRNO ? strerror(errno)
                            : colon         ? colon + 2
                                            : msg);
            return -1;
        }
        if (r == 0)
            break;
        got += r;
    }
    return got;
}

int ff_idx_read(const char *path, ff_idx *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int fd = ff_open_regular(path);
    if (fd < 0)
        return ff_format_error(err, errlen, FF_EIO, "cannot open the IDX file '%s': %s", path,
                               ff_open_error(errno));
    gzFile f = gzdopen(fd, "rb"); /* reads a plain file as it is */
    if (!f) {
        close(fd);
        return ff_format_error(err, errlen, FF_ENOMEM, "cannot read the IDX file '%s': %s", path,
                               "out of memory");
    }
    int rc = FF_OK;
    uint8_t head[4 + 4 * FF_IDX_MAX_DIMS];
    int64_t got = read_bytes(f, head, 4, path, err, errlen);
    if (got < 0) {
        rc = FF_ECORRUPT;
    } else if (got < 4) {
        rc = ff_format_error(err, errlen, FF_ECORRUPT,
                             "the IDX file '%s' is truncated: %lld bytes, shorter than the "
                             "4-byte magic",
                             path, (long long)got);
    } else if (head[0] != 0 || head[1] != 0) {
        rc = ff_format_error(err, errlen, FF_ECORRUPT,
                             "'%s' is not an IDX file: its magic starts 0x%02x 0x%02x, not two "
                             "zero bytes",
                             path, head[0], head[1]);
    } else if (head[2] != FF_IDX_UBYTE) {
        rc = ff_format_error(err, errlen, FF_EUNSUPPORTED,
                             "the IDX file '%s' holds elements of type 0x%02x: not supported "
                             "(only unsigned bytes, 0x08)",
                             path, head[2]);
    } else if (head[3] < 1 || head[3] > FF_IDX_MAX_DIMS) {
        rc = ff_format_error(err, errlen, FF_ECORRUPT,
                             "the IDX file '%s' has %d dimensions (1 to %d supported)", path,
                             head[3], FF_IDX_MAX_DIMS);
    }
    int nd = rc == FF_OK ? head[3] : 0;
    int64_t header = 4 + 4 * (int64_t)nd, count = 1;
    if (rc == FF_OK) {
        got = read_bytes(f, head + 4, 4 * nd, path, err, errlen);
        if (got < 0)
            rc = FF_ECORRUPT;
        else if (got < 4 * nd)
            rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                 "the IDX file '%s' is truncated: %lld bytes, shorter than its "
                                 "%lld-byte header",
                                 path, (long long)(4 + got), (long long)header);
    }
    for (int i = 0; i < nd && rc == FF_OK; i++) {
        const uint8_t *b = head + 4 + 4 * i;
        int64_t d = (int64_t)b[0] << 24 | (int64_t)b[1] << 16 | (int64_t)b[2] << 8 | b[3];
        if (d < 1 || d > MAX_ELEMENTS / count)
            rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                 "the IDX file '%s': dimension %d is %lld (%s)", path, i,
                                 (long long)d, d < 1 ? "empty" : "too large");
        out->dims[i] = d;
        count *= d;
    }
    if (rc == FF_OK) {
        out->ndims = nd;
        out->count = count;
        out->data = malloc((size_t)count);
        if (!out->data)
            rc = ff_format_error(err, errlen, FF_ENOMEM,
                                 "the IDX file '%s': out of memory for %lld bytes", path,
                                 (long long)count);
    }
    if (rc == FF_OK) {
        got = read_bytes(f, out->data, count, path, err, errlen);
        if (got < 0)
            rc = FF_ECORRUPT;
        else if (got < count)
            rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                 "the IDX file '%s' is truncated: %lld bytes, its sizes need %lld",
                                 path, (long long)(header + got), (long long)(header + count));
    }
    if (rc == FF_OK) {
        uint8_t extra[4096];
        int64_t more = 0;
        while ((got = read_bytes(f, extra, sizeof extra, path, err, errlen)) > 0)
            more += got;
        if (got < 0)
            rc = FF_ECORRUPT;
        else if (more)
            rc = ff_format_error(err, errlen, FF_ECORRUPT,
                                 "the IDX file '%s' is %lld bytes, its sizes give %lld (%lld "
                                 "bytes after the data)",
                                 path, (long long)(header + count + more),
                                 (long long)(header + count), (long long)more);
    }
    gzclose(f);
    if (rc != FF_OK)
        ff_idx_free(out);
    return rc;
}

void ff_idx_free(ff_idx *x)
{
    free(x->data);
    memset(x, 0, sizeof *x);
}

int ff_images_from_idx(const ff_idx *x, int64_t size, float *out, char *err, size_t errlen)
{
    if (x->ndims != 3)
        return ff_format_error(err, errlen, FF_EINVAL,
                               "images need an IDX file of 3 dimensions (count, rows, columns), "
                               "not %d",
                               x->ndims);
    int64_t n = x->dims[0], h = x->dims[1], w = x->dims[2];
    if (size < h || size < w)
        return ff_format_error(err, errlen, FF_EINVAL,
                               "images of %lld x %lld do not fit %lld x %lld", (long long)h,
                               (long long)w, (long long)size, (long long)size);
    int64_t top = (size - h) / 2, left = (size - w) / 2;
    for (int64_t i = 0; i < n; i++) {
        float *img = out + i * size * size;
        const uint8_t *src = x->data + i * h * w;
        for (int64_t p = 0; p < size * size; p++)
            img[p] = -1.0f;
        for (int64_t r = 0; r < h; r++)
            for (int64_t c = 0; c < w; c++)
                img[(top + r) * size + left + c] = (float)src[r * w + c] / 127.5f - 1.0f;
    }
    return FF_OK;
}

int ff_images_load(const char *path, int64_t size, float **images, int64_t *n, char *err,
                   size_t errlen)
{
    *images = NULL;
    *n = 0;
    ff_idx x;
    int rc = ff_idx_read(path, &x, err, errlen);
    if (rc != FF_OK)
        return rc;
    if (x.ndims != 3) {
        rc = ff_format_error(err, errlen, FF_EINVAL,
                             "the IDX file '%s' has %d dimensions: images need 3 (count, rows, "
                             "columns)",
                             path, x.ndims);
    } else if (size < x.dims[1] || size < x.dims[2]) {
        rc = ff_format_error(err, errlen, FF_EINVAL,
                             "the IDX file '%s' holds images of %lld x %lld, larger than %lld x "
                             "%lld",
                             path, (long long)x.dims[1], (long long)x.dims[2], (long long)size,
                             (long long)size);
    } else {
        *images = malloc((size_t)(x.dims[0] * size * size) * sizeof(float));
        if (!*images)
            rc = ff_format_error(err, errlen, FF_ENOMEM, "the IDX file '%s': out of memory", path);
    }
    if (rc == FF_OK) {
        rc = ff_images_from_idx(&x, size, *images, err, errlen);
        *n = x.dims[0];
    }
    ff_idx_free(&x);
    return rc;
}
