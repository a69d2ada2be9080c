/* 2D convolutions as Algorithm 1 (docs/unet.md, "Convolutions"): a 3x3
 * (stride 1 or 2, padding 1) or 1x1 convolution is a 3D parallel linear
 * layer (include/fourfold/linear.h) whose matrix dimensions are the input
 * and output channels and whose rows are pixels (the 4D paper, §III-B: the
 * algorithm "can be easily extended to convolution layers").
 *
 * Images are NHWC: an activation is a matrix of B*H*W pixel rows (image
 * after image, each row-major) by C channels, cut like the GPT's token rows
 * (docs/design.md §2): rank q = z + Gz*d holds whole images
 * [q*B/(Gz*Gd), (q+1)*B/(Gz*Gd)), and the channels of block y (input of an
 * N layer, output of a T layer) or x. A 3x3 layer multiplies the im2col
 * matrix of its input, one row per output pixel and 9*Cin/|R| columns in
 * the order (local channel, ky, kx), by the layer's weight:
 *
 *   O (B*Ho*Wo, Cout) = im2col(I) (B*Ho*Wo, 9*Cin) W (9*Cin, Cout) + b
 *
 * The weight is stored NK (FF_WEIGHT_NK): its canonical matrix is W^T,
 * Cout x 9*Cin row-major, which is PyTorch's conv2d weight (Cout, Cin, 3,
 * 3) as it lies in memory; row block r of W holds the 9 taps of input
 * channels [r*Cin/|R|, (r+1)*Cin/|R|), exactly the columns rank r's
 * im2col makes from its channel slice. So ff_linear_scatter / gather of the
 * layer move PyTorch's weight and bias unchanged, and the layer has the
 * linear layer's Z sharding, overlaps (OAR, ORS, OAG, AG cache) and byte
 * counters as they are. The backward's input gradient is col2im of the
 * linear layer's: each input pixel sums the up to 9 taps that read it.
 *
 * A 1x1 layer is the linear layer on the pixel rows as they are (no
 * im2col). */
#ifndef FOURFOLD_CONV_H
#define FOURFOLD_CONV_H

#include <stdint.h>

#include "fourfold/grid.h"
#include "fourfold/linear.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;      /* for errors (copied by the linear layer) */
    ff_linear_kind kind;   /* N: input channels over Y, output over X; T: the reverse */
    int64_t cin, cout;     /* channels */
    int64_t height, width; /* of an input image */
    int ksize;             /* 3 (padding 1) or 1 */
    int stride;            /* 1, or 2 for 3x3 */
    int bias;              /* 1: a bias of cout elements */
    uint32_t rng_stream;   /* the linear layer's (ff_linear_init) */
} ff_conv_desc;

typedef struct ff_conv ff_conv;

/* Adds the convolution's linear layer to s (on grid, the sequence's grid).
 * Refuses, naming the layer: FF_EDIVIDE when |R| does not divide cin or |C|
 * cout (or the linear layer refuses its block); FF_EUNSUPPORTED for a
 * kernel other than 3x3 and 1x1 or a strided 1x1 ("not supported yet");
 * FF_EINVAL for sizes below 1. The layer belongs to the sequence; the
 * ff_conv (its shapes) to the caller: ff_conv_destroy. */
int ff_conv_create(ff_linear_seq *s, ff_grid *grid, const ff_conv_desc *desc, ff_conv **out);
void ff_conv_destroy(ff_conv *c);
/* Its linear layer: bind, init, scatter and gather through linear.h. */
ff_linear *ff_conv_linear(const ff_conv *c);

typedef struct {
    int64_t cin_local, cout_local; /* channels of this rank's input and output */
    int64_t out_height, out_width; /* (H + 2p - k) / stride + 1 */
    int64_t col_per_image;         /* floats of im2col per image: Ho*Wo*k*k*cin_local,
                                      0 for 1x1 */
} ff_conv_sizes;
ff_conv_sizes ff_conv_local_sizes(const ff_conv *c);

/* inp (images, H, W, cin_local) -> out (images, Ho, Wo, cout_local),
 * overwritten. col: images * col_per_image floats of workspace (NULL for
 * 1x1), left holding im2col(inp). Must be the program's next use of the
 * layer, as ff_linear_forward. */
int ff_conv_forward(ff_conv *c, float *out, const float *inp, int64_t images, float *col);
/* dout (images, Ho, Wo, cout_local), inp as given to the forward -> dinp
 * (images, H, W, cin_local) overwritten (NULL: not needed); the weight and
 * bias gradients accumulate as ff_linear_backward's. col and dcol: images *
 * col_per_image floats each (NULL for 1x1; dcol unused without dinp); im2col
 * is made again into col, so it need not survive from the forward. */
int ff_conv_backward(ff_conv *c, float *dinp, const float *dout, const float *inp, int64_t images,
                     float *col, float *dcol);

#ifdef __cplusplus
}
#endif
#endif
