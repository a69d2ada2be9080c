/* IDX reading and PNG writing (include/fourfold/image.h).
 *
 *   usage: test_image DIR   (a scratch folder for the files it writes)
 *
 * - Debian's Fashion-MNIST test set (dataset-fashion-mnist, gzip-compressed):
 *   its sizes, its first labels and the byte sum of its first image, as
 *   Python's gzip module reads them (9 2 1 1 6 1 4 6 5 7; 33456), its
 *   images as floats in [-1, 1] padded to 32 x 32.
 * - Files that are not IDX files of unsigned bytes, plain and gzipped: each
 *   refused with its code and a message naming the file and the problem.
 * - PNG grids (grayscale and RGB) read back with libpng's own decoder, every
 *   pixel equal to the expected byte (gaps included); Fashion-MNIST's bytes
 *   through floats and a PNG come back exactly; a value that is not finite
 *   and a folder that does not exist refused, nothing left behind. */
#include <math.h>
#include <png.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "fourfold/image.h"
#include "test_util.h"

static char dir[512];

static void path_of(char *out, size_t len, const char *name)
{
    if (snprintf(out, len, "%.512s/%.256s", dir, name) >= (int)len)
        CHECK(0, "path too long");
}

static void write_plain(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, len, f) == len && fclose(f) == 0, "cannot write %s", path);
}

static void write_gz(const char *path, const void *data, size_t len)
{
    gzFile f = gzopen(path, "wb");
    CHECK(f && gzwrite(f, data, (unsigned)len) == (int)len && gzclose(f) == Z_OK, "cannot write %s",
          path);
}

/* ---- the real data set ------------------------------------------------------ */

static void case_fashion_mnist(void)
{
    char err[512], path[1024];
    ff_idx labels;
    snprintf(path, sizeof path, "%s/t10k-labels-idx1-ubyte.gz", FF_FASHION_MNIST_DIR);
    int rc = ff_idx_read(path, &labels, err, sizeof err);
    CHECK(rc == 0, "%s (install Debian's dataset-fashion-mnist: scripts/setup.sh)", err);
    if (rc)
        return;
    static const uint8_t first[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
    CHECK(labels.ndims == 1 && labels.dims[0] == 10000 && labels.count == 10000 &&
              !memcmp(labels.data, first, 10),
          "t10k labels: %d dims, %lld labels, first %d %d %d", labels.ndims,
          (long long)labels.dims[0], labels.data[0], labels.data[1], labels.data[2]);
    ff_idx_free(&labels);

    snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte.gz", FF_FASHION_MNIST_DIR);
    ff_idx x;
    rc = ff_idx_read(path, &x, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    if (rc)
        return;
    long sum = 0;
    for (int i = 0; i < 784; i++)
        sum += x.data[i];
    CHECK(x.ndims == 3 && x.dims[0] == 10000 && x.dims[1] == 28 && x.dims[2] == 28 && sum == 33456,
          "t10k images: %d dims %lld x %lld x %lld, image 0 sums to %ld (Python: 33456)", x.ndims,
          (long long)x.dims[0], (long long)x.dims[1], (long long)x.dims[2], sum);

    float *img;
    int64_t n;
    rc = ff_images_load(path, 32, &img, &n, err, sizeof err);
    CHECK(rc == 0 && n == 10000, "ff_images_load: %s", err);
    if (rc == 0) {
        int bad = 0;
        float lo = 1, hi = -1;
        for (int64_t i = 0; i < 16; i++)
            for (int r = 0; r < 32; r++)
                for (int c = 0; c < 32; c++) {
                    float v = img[(i * 32 + r) * 32 + c];
                    int inside = r >= 2 && r < 30 && c >= 2 && c < 30;
                    float want =
                        inside ? x.data[(i * 28 + r - 2) * 28 + c - 2] / 127.5f - 1.0f : -1.0f;
                    bad += v != want;
                    lo = v < lo ? v : lo, hi = v > hi ? v : hi;
                }
        CHECK(bad == 0 && lo == -1.0f && hi == 1.0f,
              "16 images padded to 32 x 32: %d pixels differ, range [%g, %g]", bad, lo, hi);
        /* through a PNG and back: the bytes exactly */
        char png[1024];
        path_of(png, sizeof png, "fashion.png");
        rc = ff_png_write_grid(png, img, 16, 32, 32, 1, 4, err, sizeof err);
        CHECK(rc == 0, "%s", err);
        png_image pi;
        memset(&pi, 0, sizeof pi);
        pi.version = PNG_IMAGE_VERSION;
        uint8_t *pix = NULL;
        if (rc == 0 && png_image_begin_read_from_file(&pi, png)) {
            pi.format = PNG_FORMAT_GRAY;
            pix = malloc(PNG_IMAGE_SIZE(pi));
            if (pix && png_image_finish_read(&pi, NULL, pix, 0, NULL)) {
                int64_t w = 4 * 34 + 2, diff = 0;
                for (int64_t i = 0; i < 16; i++)
                    for (int r = 0; r < 28; r++)
                        for (int c = 0; c < 28; c++) {
                            int64_t y = 2 + (i / 4) * 34 + 2 + r, xx = 2 + (i % 4) * 34 + 2 + c;
                            diff += pix[y * w + xx] != x.data[(i * 28 + r) * 28 + c];
                        }
                CHECK(pi.width == (png_uint_32)w && diff == 0,
                      "Fashion-MNIST through a PNG: width %u, %lld bytes differ", pi.width,
                      (long long)diff);
            } else {
                CHECK(0, "libpng cannot read %s: %s", png, pi.message);
            }
        } else if (rc == 0) {
            CHECK(0, "libpng cannot open %s: %s", png, pi.message);
        }
        free(pix);
        png_image_free(&pi);
        free(img);
    }
    ff_idx_free(&x);
    printf("fashion-mnist: t10k 10000 labels and 10000 images of 28 x 28 read; padded to 32 x 32 "
           "in [-1, 1]; 16 through a PNG unchanged\n");
}

/* ---- refusals ----------------------------------------------------------------- */

/* A file of `len` bytes (gzipped if gz) must be refused with code `want`
 * and a message holding the file's name and `what`. */
static void refused(const char *name, const void *data, size_t len, int gz, int want,
                    const char *what)
{
    char path[1024], err[512] = "";
    path_of(path, sizeof path, name);
    if (data)
        (gz ? write_gz : write_plain)(path, data, len);
    ff_idx x;
    int rc = ff_idx_read(path, &x, err, sizeof err);
    CHECK(rc == want && strstr(err, path) && strstr(err, what) && !x.data,
          "%s: code %d (want %d), message '%s' (want the path and '%s')", name, rc, want, err,
          what);
    printf("refused %-16s %s\n", name, err);
}

static void case_refusals(void)
{
    /* a valid 2 x 3 file, then broken copies of it */
    uint8_t good[4 + 8 + 6] = {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6};
    char path[1024], err[512];
    ff_idx x;
    path_of(path, sizeof path, "good.idx.gz");
    write_gz(path, good, sizeof good);
    int rc = ff_idx_read(path, &x, err, sizeof err);
    CHECK(rc == 0 && x.ndims == 2 && x.dims[0] == 2 && x.dims[1] == 3 && x.data[5] == 6,
          "a good gzipped 2 x 3 file: %s", err);
    ff_idx_free(&x);
    path_of(path, sizeof path, "good.idx");
    write_plain(path, good, sizeof good);
    rc = ff_idx_read(path, &x, err, sizeof err);
    CHECK(rc == 0 && x.count == 6 && x.data[0] == 1, "a good plain 2 x 3 file: %s", err);
    float img[9];
    rc = ff_images_from_idx(&x, 3, img, err, sizeof err);
    CHECK(rc == FF_EINVAL && strstr(err, "3 dimensions"), "2-dimensional file as images: %s", err);
    ff_idx_free(&x);

    uint8_t bad[sizeof good + 3];
    for (int gz = 0; gz <= 1; gz++) {
        char name[64];
#define NAME(s) (snprintf(name, sizeof name, "%s%s", s, gz ? ".gz" : ""), name)
        memcpy(bad, good, sizeof good);
        bad[1] = 8;
        refused(NAME("magic"), bad, sizeof good, gz, FF_ECORRUPT, "is not an IDX file");
        memcpy(bad, good, sizeof good);
        bad[2] = 0x0d;
        refused(NAME("float"), bad, sizeof good, gz, FF_EUNSUPPORTED, "type 0x0d: not supported");
        memcpy(bad, good, sizeof good);
        bad[3] = 9;
        refused(NAME("dims"), bad, sizeof good, gz, FF_ECORRUPT, "has 9 dimensions");
        memcpy(bad, good, sizeof good);
        bad[7] = 0;
        refused(NAME("empty"), bad, sizeof good, gz, FF_ECORRUPT, "dimension 0 is 0 (empty)");
        refused(NAME("short"), good, 2, gz, FF_ECORRUPT, "truncated: 2 bytes");
        refused(NAME("header"), good, 9, gz, FF_ECORRUPT, "truncated: 9 bytes");
        refused(NAME("data"), good, sizeof good - 1, gz, FF_ECORRUPT,
                "truncated: 17 bytes, its sizes need 18");
        memset(bad, 0, sizeof bad);
        memcpy(bad, good, sizeof good);
        refused(NAME("long"), bad, sizeof good + 3, gz, FF_ECORRUPT,
                "is 21 bytes, its sizes give 18 (3 bytes after the data)");
#undef NAME
    }
    /* a gzip stream cut short, and one whose data is damaged */
    path_of(path, sizeof path, "good.idx.gz");
    FILE *f = fopen(path, "rb");
    uint8_t z[256];
    size_t zn = f ? fread(z, 1, sizeof z, f) : 0;
    if (f)
        fclose(f);
    CHECK(zn > 20, "cannot read back %s", path);
    refused("cut.gz", z, zn - 6, 0, FF_ECORRUPT, "unexpected end of file");
    z[zn - 3] ^= 0xff; /* the stream's length field: gzip's check fails */
    refused("damaged.gz", z, zn, 0, FF_ECORRUPT, "incorrect length check");
    refused("missing", NULL, 0, 0, FF_EIO, "cannot open the IDX file");
    path_of(path, sizeof path, "folder");
    mkdir(path, 0700);
    refused("folder", NULL, 0, 0, FF_EIO, "not a regular file");
    rmdir(path);
}

/* ---- PNG grids ------------------------------------------------------------------ */

/* The byte a value becomes: round((v + 1) * 127.5), clamped. */
static int byte_of(double v)
{
    double b = nearbyint((v + 1.0) * 127.5);
    return b < 0 ? 0 : b > 255 ? 255 : (int)b;
}

static void case_png(int channels)
{
    enum { N = 5, H = 3, W = 4, COLS = 2 };
    float img[N * H * W * 3];
    for (int i = 0; i < N * H * W * channels; i++)
        img[i] = (float)(((i * 37) % 61) / 25.0 - 1.2); /* -1.2 .. 1.2: clamps at both ends */
    char path[1024], err[512];
    path_of(path, sizeof path, channels == 1 ? "gray.png" : "rgb.png");
    int rc = ff_png_write_grid(path, img, N, H, W, channels, COLS, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    png_image pi;
    memset(&pi, 0, sizeof pi);
    pi.version = PNG_IMAGE_VERSION;
    if (rc || !png_image_begin_read_from_file(&pi, path)) {
        CHECK(0, "libpng cannot open %s: %s", path, pi.message);
        return;
    }
    int64_t width = COLS * (W + FF_PNG_GAP) + FF_PNG_GAP;
    int64_t height = 3 * (H + FF_PNG_GAP) + FF_PNG_GAP;
    CHECK(pi.width == width && pi.height == height &&
              (channels == 1 ? pi.format == PNG_FORMAT_GRAY : pi.format == PNG_FORMAT_RGB),
          "%s: %u x %u, format %u", path, pi.width, pi.height, pi.format);
    pi.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    uint8_t *pix = malloc(PNG_IMAGE_SIZE(pi));
    if (!pix || !png_image_finish_read(&pi, NULL, pix, 0, NULL)) {
        CHECK(0, "libpng cannot read %s: %s", path, pi.message);
        free(pix);
        png_image_free(&pi);
        return;
    }
    long diff = 0;
    for (int64_t y = 0; y < height; y++)
        for (int64_t xx = 0; xx < width; xx++) {
            int64_t gy = y - FF_PNG_GAP, gx = xx - FF_PNG_GAP;
            int64_t i = (gy / (H + FF_PNG_GAP)) * COLS + gx / (W + FF_PNG_GAP);
            int64_t r = gy % (H + FF_PNG_GAP), c = gx % (W + FF_PNG_GAP);
            int in = gy >= 0 && gx >= 0 && r < H && c < W && i < N;
            for (int ch = 0; ch < channels; ch++) {
                int want = in ? byte_of(img[((i * H + r) * W + c) * channels + ch]) : 255;
                diff += pix[(y * width + xx) * channels + ch] != want;
            }
        }
    CHECK(diff == 0, "%s: %ld of %lld bytes differ from the images", path, diff,
          (long long)(width * height * channels));
    free(pix);
    png_image_free(&pi);
    printf("png: %d images of %d x %d x %d in %d columns read back by libpng, %lld x %lld, "
           "every byte as expected\n",
           N, H, W, channels, COLS, (long long)width, (long long)height);

    /* refusals: nothing written */
    img[7] = NAN;
    path_of(path, sizeof path, "nan.png");
    rc = ff_png_write_grid(path, img, N, H, W, channels, COLS, err, sizeof err);
    CHECK(rc == FF_EINVAL && strstr(err, "not finite") && access(path, F_OK) != 0,
          "a NaN: code %d, '%s'", rc, err);
    img[7] = 0;
    rc = ff_png_write_grid(path, img, N, H, W, 2, COLS, err, sizeof err);
    CHECK(rc == FF_EINVAL && access(path, F_OK) != 0, "2 channels: code %d, '%s'", rc, err);
    path_of(path, sizeof path, "no/such/folder.png");
    rc = ff_png_write_grid(path, img, N, H, W, channels, COLS, err, sizeof err);
    CHECK(rc == FF_EIO && strstr(err, path), "an unwritable path: code %d, '%s'", rc, err);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_image DIR\n");
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", argv[1]);
    mkdir(dir, 0700);
    case_fashion_mnist();
    case_refusals();
    case_png(1);
    case_png(3);
    return test_finish("test_image");
}
