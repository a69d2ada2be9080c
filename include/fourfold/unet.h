/* A small DDPM U-Net (Ho et al. 2020; improved DDPM's layout, scaled down) on
 * the 4D grid (docs/unet.md, "The U-Net"): its convolutions and linear
 * layers are Algorithm 1 (include/fourfold/conv.h), their weights sharded
 * along Z; GroupNorm, SiLU and the resampling are src/nn/unet_ops.h.
 *
 *   emb = Lin2(SiLU(Lin1(sinusoid(t))))                    (images, 4 C0)
 *   h   = conv_in(x_t)                                      (Cpad -> C0)
 *   down: per level i, nres residual blocks to C0 mult[i], pushed; then
 *         (not after the last level) average down-sampling, pushed
 *   mid:  two residual blocks, with self-attention between them
 *         (attn_head_channels > 0)
 *   (each residual block of a level in attn_levels, down and up, is
 *   followed by self-attention: improved DDPM's attention_resolutions)
 *   up:   per level, from the last, nres + 1 residual blocks, each on
 *         concat(h, popped); then (not after level 0) nearest up-sampling
 *   out = conv_out(SiLU(GroupNorm(h)))                      (C0 -> Cpad)
 *
 * A residual block on x (one part, or the two parts of a concatenation):
 *   h1 = conv3x3(SiLU(GN(x))) + Lin(SiLU(emb))   (broadcast over pixels)
 *   out = conv3x3(SiLU(GN(h1))) + (x, or conv1x1(x) when channels change)
 *
 * Activations are NHWC, whole images per rank (docs/unet.md, "Layout");
 * the blocks' inputs and outputs are in layout Y (channels over Y), the
 * first convolution of a block is N (Y -> X), the second T (X -> Y). A
 * convolution over a concatenation is the sum of convolutions over its
 * parts, conv(concat(a, b), W) = conv(a, W_a) + conv(b, W_b), W split along
 * its input channels, and GroupNorm's groups (a fixed number of channels
 * each) never straddle the parts: no channel permutation is needed
 * (docs/unet.md, "Skip concatenations"). A 1x1 skip is N (Y -> X); its
 * output is moved to layout Y by an all-gather over X. Self-attention:
 * x + proj(attention(QKV(GN(x)))), the QKV projection N with each X rank's
 * columns whole heads (ff_qkv_permutation), attention over an image's
 * pixels without a mask (local: whole images per rank), the projection T.
 *
 * Image channels are padded with zero channels to img_channels_pad (which
 * the grid's X and Y must divide): conv_in reads zeros there and conv_out's
 * extra outputs are not in the loss, so their weights' gradients are 0. */
#ifndef FOURFOLD_UNET_H
#define FOURFOLD_UNET_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/gpt.h" /* ff_adamw */
#include "fourfold/grid.h"
#include "fourfold/linear.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { FF_UNET_MAX_LEVELS = 6 };
/* The reverse steps of a sample unless told (ff_unet_sample; T if less):
 * docs/unet.md, "Sampling". */
enum { FF_UNET_SAMPLE_STEPS = 100 };
/* The U-Net's checkpoint file (docs/unet.md, "Checkpoints"). */
enum { FF_UNET_CKPT_MAGIC = 20261128, FF_UNET_CKPT_VERSION = 1 };

typedef enum { FF_SCHEDULE_LINEAR = 0, FF_SCHEDULE_COSINE } ff_schedule;

typedef struct {
    int64_t image_size;           /* H = W, halved (levels - 1) times */
    int img_channels;             /* of the data: 1 for Fashion-MNIST */
    int img_channels_pad;         /* conv_in's input and conv_out's output channels */
    int base;                     /* C0 */
    int levels;                   /* resolutions */
    int mult[FF_UNET_MAX_LEVELS]; /* channels at level i: base * mult[i] */
    int nres;                     /* residual blocks per level on the way down */
    int group_channels;           /* GroupNorm: channels per group (every width divisible) */
    int temb_mult;                /* the timestep embedding's width: base * temb_mult */
    int attn_head_channels;       /* self-attention between the two middle blocks, heads of
                                     this many channels; 0: none */
    int attn_levels;              /* bit i: every residual block of level i (down and up, at
                                     image_size >> i pixels) is followed by self-attention
                                     (improved DDPM's attention_resolutions; needs heads) */
    int timesteps;                /* T of the diffusion */
    ff_schedule schedule;         /* betas: linear from beta_first to beta_last, or cosine */
    double beta_first, beta_last;
} ff_unet_config;

/* "tiny" (tests: 8x8 images, C0 8, levels 2, 1 block each, attention of
 * 8 heads of 2 channels) and "fmnist" (Fashion-MNIST padded to 32x32: C0
 * 32, mult 1,2,2, 2 blocks, attention of 8 heads of 8 at 8x8); the paper's:
 * "50m" (Figure 8: improved DDPM's CIFAR-10 U-Net on Fashion-MNIST, C0 128,
 * mult 1,2,2,2, 3 blocks, attention at 16x16 and 8x8) and Table II's
 * "250m", "500m", "1b", "2b", "4b" (C0 256, 384, 512, 768, 1024 in improved
 * DDPM's ImageNet-64 layout: 64x64 RGB, mult 1,2,3,4, 3 blocks, attention
 * at 16x16 and 8x8), heads of 64 channels (docs/unet.md, "Presets").
 * FF_EINVAL for another name (no context: the caller reports). */
int ff_unet_preset(const char *name, ff_unet_config *cfg);

typedef struct ff_unet ff_unet;

/* Builds the model for `batch` images per step (split over Z and D as the
 * GPT's sequences) on grid, its layers in a sequence of its own with opts
 * (NULL: the defaults). Refuses, naming the size: channels the grid does not
 * divide, an image size the levels cannot halve, a batch Gz*Gd does not
 * divide, widths the group width does not divide, attention heads X does
 * not divide (FF_EDIVIDE, FF_EINVAL);
 * bf16-mixed products (opts->bf16: FF_EUNSUPPORTED, not yet). */
int ff_unet_create(ff_grid *grid, const ff_unet_config *cfg, const ff_linear_opts *opts,
                   int64_t batch, ff_unet **out);
void ff_unet_destroy(ff_unet *u);

/* Parameter tensors, canonical as PyTorch's state_dict of the same model
 * (tools/unet_oracle.py): a convolution's weight (Cout, Cin, k, k), a linear
 * layer's (out, in), biases and GroupNorm's gain and bias (C). */
int ff_unet_tensors(const ff_unet *u);
typedef struct {
    const char *name;
    int64_t numel;
    int64_t shape[4];
    int ndim;
} ff_unet_tensor_info;
ff_unet_tensor_info ff_unet_tensor(const ff_unet *u, int i);
/* Collective over the grid: canonical (on every rank, read there) -> this
 * rank's parameters; and this rank's parameters (which 0), gradients (1) or
 * AdamW moments (2: m, 3: v; after a step) -> canonical, on rank 0 of the
 * grid (GroupNorm's: on every rank). */
int ff_unet_scatter(ff_unet *u, int i, const float *canon);
/* ff_unet_scatter into the parameters (which 0) or the AdamW moments (2: m,
 * 3: v; allocated, zero, if no step made them yet): a checkpoint's load. */
int ff_unet_scatter_to(ff_unet *u, int i, int which, const float *canon);
/* AdamW's moments, zero, if no step or load made them yet. Collective. */
int ff_unet_alloc_moments(ff_unet *u);
/* The model's configuration (as created). */
ff_unet_config ff_unet_get_config(const ff_unet *u);
int ff_unet_gather(ff_unet *u, int i, int which, float *canon);
/* PyTorch's default initialisation of each layer as one unsplit layer:
 * weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in the whole
 * layer's inputs (a skip concatenation's parts together) times its taps,
 * drawn by canonical index; GroupNorm gains 1 and biases 0: the same on
 * every grid. Collective. */
int ff_unet_init(ff_unet *u, uint64_t seed);
/* This rank's flat parameters and gradients (ff_unet_params_count floats). */
float *ff_unet_params(ff_unet *u);
float *ff_unet_grads(ff_unet *u);
size_t ff_unet_params_count(const ff_unet *u);
void ff_unet_zero_grads(ff_unet *u);

/* ---- DDPM (src/nn/unet_ddpm.c) ------------------------------------------ */

/* alpha_bar[t], t = 0 .. T-1, of the config's schedule, in double. */
void ff_ddpm_alpha_bar(const ff_unet_config *cfg, double *abar);
/* The draws of image g (global, 0 .. batch-1) at `step`: its timestep and
 * its noise (H*W*img_channels floats, NHWC), pure functions of (seed, step,
 * batch, g): the same images get the same draws on every grid. */
int ff_ddpm_draw(const ff_unet_config *cfg, uint64_t seed, int64_t step, int64_t batch, int64_t g,
                 float *noise);

/* One micro-batch of the objective: x0 holds this rank's images (its block
 * of the batch, images * H * W * img_channels floats, NHWC in [-1, 1]);
 * noises them with the draws of `step`, predicts the noise, and adds the
 * gradients of the mean squared error over the batch's pixels into the
 * gradients (ff_unet_zero_grads first). *loss: the batch's loss, the same on
 * every rank. Then ff_unet_allreduce_grads. */
int ff_unet_ddpm_loss(ff_unet *u, const float *x0, uint64_t seed, int64_t step, float *loss);
/* The same loss without the backward (a forward-only program of the
 * layers): validation. The same bits as ff_unet_ddpm_loss's loss; the
 * gradients are not touched. */
int ff_unet_ddpm_eval(ff_unet *u, const float *x0, uint64_t seed, int64_t step, float *loss);
/* The update of a reverse step (ff_unet_sample): improved DDPM's ancestral
 * step, or DDIM's deterministic one (Song et al. 2021, eta = 0). */
typedef enum { FF_UNET_DDPM = 0, FF_UNET_DDIM } ff_unet_sampler;
/* The reverse process for this rank's images (improved DDPM's sampler,
 * Nichol and Dhariwal 2021, with the fixed small variance), on `steps` of
 * the T timesteps (improved DDPM's respacing, ff_ddpm_respace: steps = T is
 * DDPM's own): x_T ~ N(0, I); for i = steps-1 .. 0, at t = t_i, with abar
 * the kept step's and abar' its predecessor's (1 at i = 0), beta_i = 1 -
 * abar/abar': x0^ = (x - sqrt(1 - abar) eps(x, t)) / sqrt(abar) clipped to
 * [-1, 1], x' = beta_i sqrt(abar') / (1 - abar) x0^ + (1 - abar')
 * sqrt(1 - beta_i) / (1 - abar) x + sqrt(beta_i (1 - abar') / (1 - abar)) z
 * (the posterior q(x_{t'} | x_t, x0^); z = 0 at i = 0, where x' = x0^).
 * FF_UNET_DDIM instead: x' = sqrt(abar') x0^ + sqrt(1 - abar') eps^, eps^ =
 * (x/sqrt(abar) - x0^) / sqrt(1/abar - 1) the noise of the clipped x0^, no
 * draws after x_T (DDIM with eta = 0, as improved DDPM's ddim_sample).
 * The draws of image g (global) are pure functions of (seed, g, t): the
 * same images on every grid. out: this rank's images x_0 (images, S, S,
 * img_channels), every channel on every rank (an all-gather over X).
 * FF_EINVAL for steps outside 1 .. T. */
int ff_unet_sample(ff_unet *u, uint64_t seed, int steps, ff_unet_sampler sampler, float *out);
/* ff_unet_sample stopped before step i = stop - 1: out is the images after
 * steps steps-1 .. stop (stop = steps: x_T; 0: the samples); eps (NULL: not
 * wanted) the model's predicted noise at the last step taken (stop < steps),
 * laid out as out. For tests. */
int ff_unet_sample_partial(ff_unet *u, uint64_t seed, int steps, ff_unet_sampler sampler, int stop,
                           float *out, float *eps);
/* improved DDPM's respacing (its space_timesteps for one section): the
 * `steps` kept timesteps t[k] = round(k (T-1)/(steps-1)) (from 0 to T-1,
 * increasing) and their betas beta[k] = 1 - abar(t[k]) / abar(t[k-1])
 * (abar(t[-1]) = 1), in double. FF_EINVAL for steps outside 1 .. T (no
 * context: the caller reports), FF_ENOMEM. */
int ff_ddpm_respace(const ff_unet_config *cfg, int steps, int *t, double *beta);
/* The sampler's draws for image g: x_T (t = T) or the z of step t (S*S*
 * img_channels floats, NHWC). */
void ff_ddpm_sample_noise(const ff_unet_config *cfg, uint64_t seed, int64_t g, int t, float *z);
/* Data parallelism: the linear layers' (ff_linear_seq_allreduce_grads) and
 * GroupNorm's gradients over ZD. */
int ff_unet_allreduce_grads(ff_unet *u);
/* The rank's images: first global index and count. */
void ff_unet_images(const ff_unet *u, int64_t *first, int64_t *count);

/* ---- AdamW (src/nn/unet_optim.c) ----------------------------------------- */

/* The global norm of the gradients, each parameter counted once (a weight
 * shard at d = 0; a bias or GroupNorm slice at z = d = 0 and the first rank
 * of the group it is replicated over); the same on every rank. */
int ff_unet_grad_norm(ff_unet *u, float *norm);

typedef struct {
    float loss, grad_norm, lr;
} ff_unet_step_info;

/* One training step: the objective's gradients on this rank's images x0
 * (ff_unet_ddpm_loss with `step`), the data-parallel all-reduces, the norm,
 * clipping as torch's clip_grad_norm_, and AdamW with the GPT's arithmetic
 * and schedule (ff_adamw, ff_adamw_lr; decay on the convolutions' and
 * linear layers' weights only). FF_ENUMERIC, the parameters left as they
 * were, for a loss or norm that is not finite. */
int ff_unet_step(ff_unet *u, const float *x0, uint64_t seed, int step, const ff_adamw *h,
                 ff_unet_step_info *info);

#ifdef __cplusplus
}
#endif
#endif
