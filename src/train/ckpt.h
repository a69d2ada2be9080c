/* The trainer's internal pieces of checkpoints and model bindings
 * (include/fourfold/model.h; src/train/checkpoint.c, net_unet.c). */
#ifndef FF_TRAIN_CKPT_H
#define FF_TRAIN_CKPT_H

#include "fourfold/model.h"
#include "fourfold/trainer.h"

/* The GPT's files of checkpoint st->step (model_N.bin in llm.c's v3 layout,
 * state_N.bin, a masked run's mask) without the DONE marker. */
int ff_ckpt_gpt_files(ff_gpt *g, const char *dir, ff_train_state *st);
/* Rank 0: FF_EINVAL, naming the file, if the model file at path is another
 * model kind's checkpoint (a U-Net's given to a GPT or the reverse); FF_OK
 * otherwise (the model's own reader checks the rest). Local. */
int ff_ckpt_check_kind(ff_ctx *ctx, const char *path, int kind);

/* The U-Net's binding: the model of cfg->unet on grid with its images
 * (cfg->data and cfg->val_data: IDX files; NULL: Fashion-MNIST's training
 * and test images), initialised from cfg->seed. Collective. */
int ff_net_unet_create(ff_grid *grid, const ff_trainer_config *cfg, ff_net *out);
/* The U-Net of a binding (NULL for another model's). */
struct ff_unet *ff_net_unet(const ff_net *net);

#endif
