/* A grid of images as an 8-bit PNG (include/fourfold/image.h): the PNG
 * specification's chunks (signature, IHDR, one IDAT of zlib-deflated
 * scanlines with filter type 0, IEND), each with its CRC-32, through zlib;
 * written atomically (src/util/file.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "fourfold/ctx.h"
#include "fourfold/image.h"
#include "util/file.h"

/* Largest picture: its raw scanlines must fit zlib's uLong and one chunk
 * (PNG allows 2^31 - 1 bytes of data per chunk). */
static const int64_t MAX_RAW = (int64_t)1 << 30;

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}

/* One chunk: length, type, data, CRC-32 of type and data. 0 or -1. */
static int put_chunk(FILE *f, const char *type, const uint8_t *data, uint32_t len)
{
    uint8_t head[8], tail[4];
    put32(head, len);
    memcpy(head + 4, type, 4);
    uLong crc = crc32(0L, head + 4, 4);
    if (len)
        crc = crc32(crc, data, len);
    put32(tail, (uint32_t)crc);
    return fwrite(head, 1, 8, f) == 8 && (!len || fwrite(data, 1, len, f) == len) &&
                   fwrite(tail, 1, 4, f) == 4
               ? 0
               : -1;
}

static uint8_t to_byte(float v)
{
    double b = nearbyint(((double)v + 1.0) * 127.5);
    return (uint8_t)(b < 0 ? 0 : b > 255 ? 255 : b);
}

int ff_png_write_grid(const char *path, const float *images, int64_t n, int64_t h, int64_t w,
                      int channels, int64_t cols, char *err, size_t errlen)
{
    if (n < 1 || h < 1 || w < 1 || cols < 1 || (channels != 1 && channels != 3))
        return ff_format_error(err, errlen, FF_EINVAL,
                               "a PNG grid needs at least one image of at least 1 x 1 pixels, "
                               "1 or 3 channels and 1 column (got %lld images of %lld x %lld x "
                               "%d, %lld columns)",
                               (long long)n, (long long)h, (long long)w, channels, (long long)cols);
    if (cols > n)
        cols = n;
    int64_t rows = (n + cols - 1) / cols;
    if (h > MAX_RAW / rows || w > MAX_RAW / cols)
        return ff_format_error(err, errlen, FF_EINVAL, "a PNG grid of %lld images is too large",
                               (long long)n);
    int64_t width = cols * (w + FF_PNG_GAP) + FF_PNG_GAP;
    int64_t height = rows * (h + FF_PNG_GAP) + FF_PNG_GAP;
    int64_t line = 1 + width * channels; /* the filter byte, then the pixels */
    if (width * channels > MAX_RAW / height)
        return ff_format_error(err, errlen, FF_EINVAL,
                               "a PNG grid of %lld x %lld pixels is too large", (long long)width,
                               (long long)height);
    for (int64_t i = 0; i < n * h * w * channels; i++)
        if (!isfinite(images[i]))
            return ff_format_error(err, errlen, FF_EINVAL,
                                   "cannot write '%s': image %lld has a value that is not "
                                   "finite",
                                   path, (long long)(i / (h * w * channels)));
    size_t raw_len = (size_t)(line * height);
    uint8_t *raw = malloc(raw_len);
    uLongf packed_len = compressBound((uLong)raw_len);
    uint8_t *packed = malloc(packed_len);
    if (!raw || !packed) {
        free(raw), free(packed);
        return ff_format_error(err, errlen, FF_ENOMEM, "cannot write '%s': out of memory", path);
    }
    memset(raw, 255, raw_len); /* the gaps: white */
    for (int64_t y = 0; y < height; y++)
        raw[y * line] = 0; /* filter type 0: none */
    for (int64_t i = 0; i < n; i++) {
        int64_t y0 = FF_PNG_GAP + (i / cols) * (h + FF_PNG_GAP);
        int64_t x0 = FF_PNG_GAP + (i % cols) * (w + FF_PNG_GAP);
        const float *img = images + i * h * w * channels;
        for (int64_t y = 0; y < h; y++) {
            uint8_t *dst = raw + (y0 + y) * line + 1 + x0 * channels;
            for (int64_t e = 0; e < w * channels; e++)
                dst[e] = to_byte(img[y * w * channels + e]);
        }
    }
    int zrc = compress2(packed, &packed_len, raw, (uLong)raw_len, Z_DEFAULT_COMPRESSION);
    free(raw);
    if (zrc != Z_OK) {
        free(packed);
        return ff_format_error(err, errlen, FF_ENOMEM, "cannot write '%s': zlib: %s", path,
                               zError(zrc));
    }
    uint8_t ihdr[13];
    put32(ihdr, (uint32_t)width);
    put32(ihdr + 4, (uint32_t)height);
    ihdr[8] = 8;                        /* bits per sample */
    ihdr[9] = channels == 1 ? 0 : 2;    /* colour type: grayscale or RGB */
    ihdr[10] = ihdr[11] = ihdr[12] = 0; /* deflate, adaptive filtering, no interlace */
    static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    char tmp[FF_TMP_PATH_MAX];
    FILE *f = ff_atomic_open(path, tmp);
    int ok = f && fwrite(signature, 1, 8, f) == 8 && put_chunk(f, "IHDR", ihdr, 13) == 0 &&
             put_chunk(f, "IDAT", packed, (uint32_t)packed_len) == 0 &&
             put_chunk(f, "IEND", NULL, 0) == 0;
    free(packed);
    if (ok) {
        ok = ff_atomic_commit(f, tmp, path) == 0;
    } else if (f) {
        ff_atomic_abort(f, tmp);
    }
    if (!ok)
        return ff_format_error(err, errlen, FF_EIO, "cannot write '%s': %s", path, strerror(errno));
    return FF_OK;
}
