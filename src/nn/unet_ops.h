/* The U-Net's operations besides its convolutions (src/nn/unet_ops.c;
 * docs/unet.md): GroupNorm over channel shards, SiLU, nearest-neighbour
 * up-sampling and average down-sampling, forward and backward, in llm.c's
 * style (shapes in comments, no allocation inside). Activations are NHWC:
 * (images, hw, cl) with hw = H*W pixels of each of the rank's images and cl
 * of the C channels, the rank's block of them (docs/unet.md, "Layout").
 * GroupNorm is the only one that communicates: its statistics are sums over
 * a group's channels, which may lie on several ranks of the group `gs` that
 * splits the channels (Y for layout Y, X for layout X). The others are local
 * and the same bits on every grid. Every pass runs on the context's team of
 * threads (ctx may be NULL: the caller's thread), the same bits for any
 * number of threads. Internal to the library. */
#ifndef FF_UNET_OPS_H
#define FF_UNET_OPS_H

#include <stdint.h>

#include "fourfold/comm.h"
#include "fourfold/grid.h"

/* GroupNorm (Wu and He; torch.nn.functional.group_norm): G groups of C/G
 * consecutive channels; per image and group, the mean and variance over its
 * hw * C/G values; out = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var +
 * eps). This rank holds channels [r*cl, (r+1)*cl), r its rank in gs. inp,
 * out (images, hw, cl); w, b (cl); mean, rstd (images, G) saved for the
 * backward (entries of groups without a channel here: 0). Two passes (mean,
 * then the squares about it), each a double sum rounded to float; where a
 * group's channels span ranks (cl not a multiple of C/G) each pass is one
 * AllReduce over gs of images*G floats, a rank adding exact zeros for the
 * groups it holds nothing of. FF_EDIVIDE (on the context) unless G divides
 * C and C = cl * |gs|. */
int ff_gn_forward(ff_group *gs, float *out, float *mean, float *rstd, const float *inp,
                  const float *w, const float *b, int64_t images, int64_t hw, int64_t cl, int64_t C,
                  int G, float eps);
/* dinp += d GroupNorm (NULL: not needed); dw, db += sums over this rank's
 * pixels of dout * xhat and dout (the caller all-reduces them over ZD, as
 * the linear layers' biases). One AllReduce over gs of 2*images*G floats
 * where groups span ranks. scratch: 2*images*G floats. */
int ff_gn_backward(ff_group *gs, float *dinp, float *dw, float *db, const float *dout,
                   const float *inp, const float *w, const float *mean, const float *rstd,
                   int64_t images, int64_t hw, int64_t cl, int64_t C, int G, float *scratch);

/* SiLU: out = x / (1 + exp(-x)). n elements. */
void ff_silu_forward(ff_ctx *ctx, float *out, const float *inp, int64_t n);
/* dinp = dout * s (1 + x (1 - s)), s = 1 / (1 + exp(-x)); overwritten. */
void ff_silu_backward(ff_ctx *ctx, float *dinp, const float *dout, const float *inp, int64_t n);

/* Nearest-neighbour up-sampling by 2: inp (images, h, w, cl) -> out
 * (images, 2h, 2w, cl), each pixel copied to its 2x2 block. */
void ff_upsample_forward(ff_ctx *ctx, float *out, const float *inp, int64_t images, int64_t h,
                         int64_t w, int64_t cl);
/* dinp (images, h, w, cl) = the sum of each 2x2 block of dout, overwritten;
 * the four added in row-major order. */
void ff_upsample_backward(ff_ctx *ctx, float *dinp, const float *dout, int64_t images, int64_t h,
                          int64_t w, int64_t cl);

/* Average down-sampling by 2 (2x2 blocks, stride 2): inp (images, h, w, cl),
 * h and w even -> out (images, h/2, w/2, cl) = ((a + b) + c + d) * 0.25. */
void ff_downsample_forward(ff_ctx *ctx, float *out, const float *inp, int64_t images, int64_t h,
                           int64_t w, int64_t cl);
/* dinp (images, h, w, cl) = dout / 4 on each pixel of its block,
 * overwritten. */
void ff_downsample_backward(ff_ctx *ctx, float *dinp, const float *dout, int64_t images, int64_t h,
                            int64_t w, int64_t cl);

#endif
