/* The U-Net's internals shared by its model (unet.c) and its objective
 * (unet_ddpm.c); include/fourfold/unet.h describes the model. */
#ifndef FF_UNET_INTERNAL_H
#define FF_UNET_INTERNAL_H

#include "fourfold/conv.h"
#include "fourfold/unet.h"

/* A convolution or linear layer and its views into the flat buffers. */
typedef struct {
    ff_conv *conv; /* NULL for a plain linear layer */
    ff_linear *lin;
    size_t off_w, off_b, nw, nb; /* into params / grads */
    int64_t cin, cout, taps;
    ff_linear_kind kind;
} unet_layer;

/* GroupNorm's gain and bias over a part of C channels, G = C / group
 * channels, on the ranks of gs (layout Y: Y, layout X: X). */
typedef struct {
    int64_t C, cl;
    int G;
    int layout_x;
    size_t off;         /* gain at off, bias at off + cl */
    float *mean, *rstd; /* (images, G) */
} unet_gn;

/* An activation: (images, size, size, C / G_layout), its gradient. */
typedef struct {
    int64_t size, C;
    int layout_x;
    float *x, *dx;
} unet_act;

typedef enum { OP_BLOCK, OP_DOWN, OP_UP, OP_ATTN } unet_op_kind;

typedef struct {
    unet_op_kind kind;
    int in[2], nparts, out; /* activations */
    /* a residual block */
    int64_t cin[2], cout, size;
    unet_gn gn1[2], gn2;
    unet_layer *conv1[2], *tproj, *conv2, *skip[2]; /* skip: NULL without */
    float *g1[2], *s1[2], *h1, *g2, *s2;
    /* self-attention (OP_ATTN): gn1[0] and its output g1[0], the QKV layer
     * and its output (px, 3C/Gx), the heads' output (px, C/Gx) and
     * probabilities (images, heads/Gx, hw, hw), the projection */
    unet_layer *qkv, *proj;
    float *qkv_out, *att_out, *att;
    int heads;
} unet_op;

/* (a tensor is a layer's weight or bias or a GroupNorm's gain or bias:
 * the table cannot overflow) */
enum {
    UNET_MAX_OPS = 96, /* (4 levels of 3 blocks with attention at two: 51) */
    UNET_MAX_LAYERS = 256,
    UNET_MAX_GN = 160,
    UNET_MAX_TENSORS = 2 * UNET_MAX_LAYERS + 2 * UNET_MAX_GN
};

/* A canonical tensor: a weight of one or two layers (input channels split),
 * a layer's bias, or a GroupNorm gain or bias of one or two parts. */
typedef struct {
    char name[48];
    int kind; /* 0 weight, 1 bias, 2 GN gain, 3 GN bias */
    unet_layer *layer[2];
    unet_gn *gn[2];
    int parts;
    int64_t fan_in; /* a weight's or bias's: the whole layer's (every part's) inputs x taps */
    ff_unet_tensor_info info;
} unet_tensor;

struct ff_unet {
    ff_grid *grid;
    ff_ctx *ctx;
    ff_unet_config cfg;
    ff_linear_seq *seq;
    ff_dims g, c;
    int64_t batch, images, first; /* per step; this rank's count and first */
    int64_t temb;                 /* base * temb_mult */

    unet_layer layers[UNET_MAX_LAYERS];
    int nlayers;
    unet_gn gns[UNET_MAX_GN];
    int ngn;
    unet_act acts[UNET_MAX_OPS + 4];
    int nacts;
    unet_op ops[UNET_MAX_OPS];
    int nops;
    unet_tensor tensors[UNET_MAX_TENSORS];
    int ntensors;

    unet_layer *lin1, *lin2, *conv_in, *conv_out;
    unet_gn *gn_out;
    float *params, *grads, *adam_m, *adam_v; /* the moments: at the first step */
    size_t nparams;

    /* the timestep embedding: (images, base/Gy) sinusoid, (images, temb/Gx)
     * Lin1 and its SiLU, (images, temb/Gy) emb and SiLU(emb), its gradient */
    int *t;
    float *sinus, *l1, *sl1, *emb, *semb, *dsemb;
    /* the output: GroupNorm, SiLU, (images, S, S, pad/Gx) the prediction and
     * its gradient */
    float *go, *so, *pred, *dpred;
    /* scratch: im2col, two activations, a full-width gather, GN sums */
    float *col, *dcol, *tmp[3], *full, *gscr;
    float *att_scratch; /* (threads, hw, hw): attention's backward */
    double *abar;       /* (T) ff_ddpm_alpha_bar */
    float *noise;       /* (images, S, S, img_channels): this step's draws */
    size_t tmp_floats;
};

/* channels of a C-wide activation on this rank in a layout */
static inline int64_t local_c(const ff_unet *u, int64_t C, int layout_x)
{
    return C / (layout_x ? u->g.x : u->g.y);
}

/* the group that splits a GroupNorm's channels */
static inline ff_group *gn_group(const ff_unet *u, const unet_gn *n)
{
    return ff_grid_group(u->grid, n->layout_x ? FF_GROUP_X : FF_GROUP_Y);
}

/* x_t into acts[0].x (images, S, S, pad/Gx; zero beyond the data's
 * channels) and t into u->t; then forward to u->pred. */
int ff_unet_forward_(ff_unet *u);
/* u->dpred -> the gradients (+=). */
int ff_unet_backward_(ff_unet *u);

#endif
