/* The trainer's internal pieces of checkpoints and model bindings
 * (include/fourfold/model.h; src/train/checkpoint.c, net_unet.c). */
#ifndef FF_TRAIN_CKPT_H
#define FF_TRAIN_CKPT_H

#include <stdint.h>
#include <string.h>

#include "fourfold/model.h"
#include "fourfold/trainer.h"

/* The GPT's files of checkpoint st->step (model_N.bin in llm.c's v3 layout,
 * state_N.bin, a masked run's mask) without the DONE marker. */
int ff_ckpt_gpt_files(ff_gpt *g, const char *dir, ff_train_state *st);
/* Rank 0: FF_EINVAL, naming the file, if the model file at path is another
 * model kind's checkpoint (a U-Net's given to a GPT or the reverse); FF_OK
 * otherwise (the model's own reader checks the rest). Local. */
int ff_ckpt_check_kind(ff_ctx *ctx, const char *path, int kind);

/* Header words (int32 slots) of the checkpoint files: a 64-bit value in two
 * slots, a float in one; and AdamW's settings in nine from `slot` (lr,
 * min_lr_frac, warmup, steps, beta1, beta2, eps, weight decay, clip), as
 * both models' files keep them. */
static inline void ff_slot_put64(int32_t *h, int slot, uint64_t v)
{
    memcpy(&h[slot], &v, sizeof v);
}
static inline uint64_t ff_slot_get64(const int32_t *h, int slot)
{
    uint64_t v;
    memcpy(&v, &h[slot], sizeof v);
    return v;
}
static inline void ff_slot_putf(int32_t *h, int slot, float v) { memcpy(&h[slot], &v, sizeof v); }
static inline float ff_slot_getf(const int32_t *h, int slot)
{
    float v;
    memcpy(&v, &h[slot], sizeof v);
    return v;
}
void ff_ckpt_put_adamw(int32_t *h, int slot, const ff_adamw *a);
void ff_ckpt_get_adamw(const int32_t *h, int slot, ff_adamw *a);

/* The U-Net's binding: the model of cfg->unet on grid with its images
 * (cfg->data and cfg->val_data: IDX files; NULL: Fashion-MNIST's training
 * and test images), initialised from cfg->seed. Collective. */
int ff_net_unet_create(ff_grid *grid, const ff_trainer_config *cfg, ff_net *out);
/* The image files a U-Net run of cfg reads: cfg->data and cfg->val_data,
 * or without data Fashion-MNIST's training and test images. */
void ff_net_unet_data(const ff_trainer_config *cfg, const char **train, const char **val);
/* The U-Net of a binding (NULL for another model's). */
struct ff_unet *ff_net_unet(const ff_net *net);

#endif
