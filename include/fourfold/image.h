/* Images: IDX files (the MNIST family's format, as Debian's
 * dataset-fashion-mnist ships it) read into floats, and a grid of images
 * written as a PNG file (docs/unet.md).
 *
 * IDX (LeCun's MNIST page): two zero bytes, a type byte, the number of
 * dimensions d, then d big-endian uint32 sizes and the elements in row-major
 * order. Only unsigned bytes (type 0x08) are read, the only type the
 * datasets use; the file may be gzip-compressed (read through zlib), and its
 * (uncompressed) length must be exactly 4 + 4 d + the product of the sizes.
 *
 * These functions take no context: they report an error as a code plus one
 * sentence naming the file and the problem in the caller's buffer
 * (ff_grid_parse's convention); the caller agrees on it across ranks. */
#ifndef FOURFOLD_IMAGE_H
#define FOURFOLD_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { FF_IDX_MAX_DIMS = 4, FF_IDX_UBYTE = 0x08 };

/* Where Debian's dataset-fashion-mnist package installs its files. */
#define FF_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
/* Its training (60000) and test (10000) images. */
#define FF_FASHION_MNIST_TRAIN FF_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz"
#define FF_FASHION_MNIST_TEST  FF_FASHION_MNIST_DIR "/t10k-images-idx3-ubyte.gz"

typedef struct {
    int ndims;                     /* 1 .. FF_IDX_MAX_DIMS */
    int64_t dims[FF_IDX_MAX_DIMS]; /* each >= 1 */
    int64_t count;                 /* the product of dims */
    uint8_t *data;                 /* count bytes, row-major (malloc'd) */
} ff_idx;

/* Reads an IDX file of unsigned bytes, gzip-compressed or not. On error
 * (FF_EIO: cannot open or read; FF_ECORRUPT: bad magic, truncated, longer
 * than its sizes, a bad gzip stream; FF_EUNSUPPORTED: another element type;
 * FF_ENOMEM) *out is empty and err names the file and the problem. */
int ff_idx_read(const char *path, ff_idx *out, char *err, size_t errlen);
void ff_idx_free(ff_idx *x);

/* An IDX of images (n x h x w bytes) as n single-channel float images of
 * size x size (NHWC with C = 1, row-major): byte p becomes p / 127.5 - 1,
 * in [-1, 1], centred with (size - h) / 2 rows and (size - w) / 2 columns of
 * -1 (black) before. FF_EINVAL if x is not 3-dimensional or size < h or w. */
int ff_images_from_idx(const ff_idx *x, int64_t size, float *out, char *err, size_t errlen);

/* ff_idx_read and ff_images_from_idx: *images (malloc'd, n * size * size
 * floats) and *n. */
int ff_images_load(const char *path, int64_t size, float **images, int64_t *n, char *err,
                   size_t errlen);

/* Writes n images (each h x w x channels floats in [-1, 1], channels 1 for
 * grayscale or 3 for RGB, images one after another) as one 8-bit PNG of a
 * grid with `cols` columns (the last row may be short), images separated
 * and surrounded by FF_PNG_GAP pixels of white. A value v becomes the byte
 * round((v + 1) * 127.5) clamped to [0, 255], so ff_images_from_idx's
 * bytes come back exactly. Written atomically (temporary file, fsync,
 * rename). FF_EINVAL for a bad shape or a value that is not finite (nothing
 * written), FF_EIO if the file cannot be written. */
enum { FF_PNG_GAP = 2 };
int ff_png_write_grid(const char *path, const float *images, int64_t n, int64_t h, int64_t w,
                      int channels, int64_t cols, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
