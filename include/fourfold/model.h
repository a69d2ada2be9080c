/* One model interface (docs/design.md §4, docs/unet.md "The model
 * interface"): what the trainer (include/fourfold/trainer.h), its
 * checkpoints, its log and `fourfold train` need of a model, as a table of
 * functions beside an opaque handle. The GPT (src/train/trainer.c's
 * binding, wrapping ff_gpt and its token data) and the U-Net
 * (src/train/net_unet.c, wrapping ff_unet and its images) implement it; a
 * third model needs only its own binding.
 *
 * (The planner's model description is `ff_model`, include/fourfold/plan.h;
 * this one is `ff_net`.)
 *
 * Every function is collective over the model's context and returns the
 * same code on every rank (the message: ff_ctx_error), but `name` and
 * `flops_per_step`, which are local. A binding owns its data source: the
 * trainer asks for "the next training batch's step" and "validation batch
 * i of n", never for tokens or images. */
#ifndef FOURFOLD_MODEL_H
#define FOURFOLD_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/train.h"
#include "fourfold/unet.h" /* ff_unet_sampler */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FF_NET_GPT = 0, FF_NET_UNET } ff_net_kind;

/* One optimizer step as the model reports it. */
typedef struct {
    float loss, lr, grad_norm;
    float aux_loss, dropped; /* a mixture of experts' (0 otherwise) */
} ff_net_step;

typedef struct {
    ff_net_kind kind;
    const char *name;      /* "gpt", "unet": messages and the log */
    const char *loss_unit; /* the loss plot's unit */
    /* One optimizer step (`step`: 0-based, the AdamW step counter and the
     * schedule's position) on the model's next training batch. FF_ENUMERIC,
     * the parameters left as they were, for a loss that is not finite. */
    int (*step)(void *impl, int64_t step, const ff_adamw *h, ff_net_step *info);
    /* The loss of validation batch i of n, spread over the validation data
     * (the same batches every time), changing nothing. */
    int (*eval)(void *impl, int i, int n, float *loss);
    /* Whether the model has validation data. Local. */
    int (*has_val)(void *impl);
    /* Writes the model's checkpoint files of st->step into dir (the
     * trainer's checkpoint folder; each file atomic, with a checksum); the
     * DONE marker and the pruning of old checkpoints are the caller's
     * (ff_ckpt_commit). st->data: the data position to save. */
    int (*save)(void *impl, const char *dir, ff_train_state *st);
    /* Verifies and loads checkpoint `step` of dir (all of it checked before
     * any of it reaches the model), filling st and restoring the data
     * position. FF_ECORRUPT for damaged or mismatched files (the trainer
     * then tries an older checkpoint), FF_EINVAL for another model's. */
    int (*load)(void *impl, const char *dir, int64_t step, ff_train_state *st);
    /* Model FLOPs of one step over the whole grid (0: not known). Local. */
    double (*flops_per_step)(void *impl);
    /* The model's fields of the log's config line (JSON members, no braces)
     * and the loss plot's title prefix. Local. */
    void (*describe)(void *impl, char *json, size_t json_len, char *title, size_t title_len);
    /* Writes samples of the model to path (the U-Net: a PNG grid of DDPM
     * samples); NULL where the model has none (the GPT samples text through
     * `fourfold train --sample` and `fourfold sample`). */
    int (*write_samples)(void *impl, const char *path, uint64_t seed);
    void (*destroy)(void *impl);
} ff_net_ops;

typedef struct {
    const ff_net_ops *ops;
    void *impl;
} ff_net;

/* Checkpoint st->step of `net` into dir: withdraws an existing DONE marker
 * of the step, writes the model's files (ops->save), then the DONE marker,
 * and keeps the newest `keep` complete checkpoints (include/fourfold/train.h
 * describes the folder). */
int ff_ckpt_commit(ff_ctx *ctx, const ff_net *net, const char *dir, ff_train_state *st, int keep);

/* Samples of the model in a checkpoint file into png (the U-Net's
 * `model_N.bin`: its configuration from the header, the parameters
 * verified and loaded on this grid, n images of the reverse process in
 * `steps` steps (1 .. T; 0: FF_UNET_SAMPLE_STEPS, or T if less) of the
 * sampler's update (ff_unet_sample) drawn with seed; n a multiple of the
 * grid's Gz Gd). FF_EINVAL for another model's file (a GPT's samples are
 * text: ff_gpt_sample_next) or steps beyond T. */
int ff_net_file_samples(ff_grid *grid, const char *path, int64_t n, int steps,
                        ff_unet_sampler sampler, uint64_t seed, const char *png);
/* The validation loss of the U-Net in a checkpoint file, as its run's
 * validation computes it (the mean of `batches` batches spread over the
 * test images, the DDPM draws of the run's seed; forward only): images an
 * IDX file (NULL: Fashion-MNIST's test images), n images per batch (0: the
 * run's batch; a multiple of Gz Gd), *batch the batch used. The same on
 * every rank; FF_EINVAL for another model's file. Collective. */
int ff_net_file_eval(ff_grid *grid, const char *path, const char *images, int64_t n, int batches,
                     float *loss, int64_t *batch);
/* FF_NET_UNET if the file at path is a U-Net checkpoint (by its magic),
 * else FF_NET_GPT (whose reader names what else is wrong). Collective: rank
 * 0 reads, every rank gets its answer. */
ff_net_kind ff_net_file_kind(ff_ctx *ctx, const char *path);

#ifdef __cplusplus
}
#endif
#endif
