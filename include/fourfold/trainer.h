/* The training loop as a library (docs/train.md): data, learning-rate
 * schedule, steps, validation, checkpoints, a JSON-lines log and a loss
 * plot, with a hook for the caller's printing. `fourfold train` is option
 * parsing and printing on top of it; examples/train_tiny.c is the smallest
 * program that uses it.
 *
 *     ff_trainer_config c;
 *     ff_trainer_config_default(&c);      // the mini model on the fortunes
 *     c.steps = 100;
 *     ff_trainer *t;
 *     if (ff_trainer_create(grid, &c, &t) == FF_OK)
 *         ff_trainer_run(t);              // or ff_trainer_step in a loop
 *     ff_trainer_destroy(t);
 *
 * create, step, eval, save, run and write_loss_svg are collective over the
 * grid's context and return the same code on every rank (the message:
 * ff_ctx_error); the others are local. Losses are the same on every rank;
 * times are each rank's own. The strings and `user` of the configuration
 * are borrowed: they must stay valid until ff_trainer_destroy. */
#ifndef FOURFOLD_TRAINER_H
#define FOURFOLD_TRAINER_H

#include <stdint.h>

#include "fourfold/gpt.h"
#include "fourfold/grid.h"
#include "fourfold/model.h"
#include "fourfold/prune.h"
#include "fourfold/train.h"
#include "fourfold/unet.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One optimizer step as measured on this rank. */
typedef struct {
    int64_t step;  /* steps completed, this one included (counts from 1) */
    int64_t steps; /* the run's last step */
    float loss, lr, grad_norm;
    double ms;                  /* wall time of the step, data included */
    double tokens_per_s;        /* whole grid (a U-Net: images per second) */
    double model_flops_per_s;   /* 6N + 12LCT per token (ff_gpt_flops_per_token) */
    double sgemm_fraction;      /* of the sgemm rate of every rank together */
    double compute_ms, wait_ms; /* ms = compute + blocked in collectives */
    double hidden_ms;           /* collectives in flight beside compute */
    double eta_s; /* to the last step: this run's elapsed time / steps done x steps left */
    /* mixture of experts (0 for a dense model): the load-balancing loss (in
     * the gradient, not in `loss`) and the fraction of assignments dropped */
    float aux_loss, dropped;
} ff_train_step_info;

typedef enum {
    FF_TRAIN_STEP, /* a step finished: .step */
    FF_TRAIN_VAL,  /* a validation finished: .val_loss */
    FF_TRAIN_SAVE, /* a checkpoint was written: .path (its model file) */
    FF_TRAIN_NOTE  /* something the user should read: .text (one line, no newline) */
} ff_train_event_kind;

typedef struct {
    ff_train_event_kind kind;
    int64_t at; /* steps completed */
    const ff_train_step_info *step;
    float val_loss;
    const char *path, *text;
} ff_train_event;

/* Called on every rank, in step order, with the same events; the event's
 * pointers live until it returns. It must return (no longjmp, no C++
 * exception) and may call collectives only if every rank does. */
typedef void (*ff_train_hook)(const ff_train_event *ev, void *user);

typedef struct {
    /* the model (include/fourfold/model.h): FF_NET_GPT, the default (model,
     * gpt and the token data below), or FF_NET_UNET (unet, on images: data
     * and val_data are IDX files, NULL for Fashion-MNIST's training and test
     * images; batch images per step, micro_batch = batch; seq unused).
     * init_from, mask, pruning, SAMO and bf16-mixed are the GPT's only. */
    ff_net_kind kind;
    ff_unet_config unet;
    int sample_steps;    /* the U-Net's samples: reverse steps, 1 .. T (improved DDPM's
                            respacing, ff_unet_sample); 0: FF_UNET_SAMPLE_STEPS, or T if less */
    ff_gpt_config model; /* the shape (with init_from the file's; a mixture of experts
                            here, experts > 0, must match the file's experts and
                            expert_every, and its top_k, capacity_factor and
                            aux_coef replace the file's) */
    ff_gpt_opts gpt;     /* checkpointing, overlaps, wire */
    int batch;           /* sequences per step, whole grid */
    int micro_batch;     /* sequences per micro-batch; must divide batch */
    int seq;             /* tokens per sequence */
    int steps;           /* the last step (counting from 1) */
    ff_adamw hyper;      /* lr, warm-up, cosine floor, AdamW; hyper.steps := steps */
    uint64_t seed;       /* initialisation (and the run's sampling seed) */
    /* data: llm.c shards (a glob); NULL: the fortunes under corpus_dir */
    const char *data, *val_data; /* val_data NULL: no validation (unless data is NULL) */
    const char *corpus_dir;      /* NULL: OUT/corpus, or ./corpus without out */
    int val_every;               /* validate every N steps and at the end; 0: at the end */
    int val_batches;             /* micro-batches per validation, spread over the data */
    /* output: NULL: no log, no checkpoints, no plot */
    const char *out;
    int save_every;          /* checkpoint every N steps and at the end; 0: at the end */
    int keep;                /* complete checkpoints kept; 0: all */
    int overwrite;           /* a new run in an `out` that holds checkpoints removes them */
    const char *resume_from; /* continue from the newest checkpoint in this folder */
    const char *init_from;   /* start from an llm.c gpt2_*.bin v3 file */
    /* masked training (docs/samo.md): a mask file (fourfold prune), or "auto"
     * for init_from's (init_from.mask); pruned weights stay zero. A masked
     * run's checkpoints carry its mask, so resuming needs none. NULL: none */
    const char *mask;
    /* iterative magnitude pruning (docs/samo.md): after steps prune_every,
     * 2 prune_every, ..., prune_steps x prune_every the candidates are pruned
     * to 1 - (1 - prune.sparsity)^(i / prune_steps) in round i, what is pruned
     * staying pruned (ff_prune), and training goes on with the mask.
     * prune.sparsity 0: none */
    ff_prune_opts prune;
    int prune_every, prune_steps;
    /* SAMO (docs/samo.md; ff_gpt_samo): the weight matrices' gradients and
     * moments compressed to the mask's kept entries, bitwise the same
     * training in less memory. Needs a mask (mask, a resumed masked run's,
     * or the pruning schedule's: SAMO then starts after its last round). */
    int samo;
    double sgemm_rate; /* this rank's sgemm FLOP/s; 0 on any rank: all measure at create */
    ff_train_hook hook;
    void *user;
} ff_trainer_config;

/* The mini model (L=4 C=128 NH=4, byte vocabulary) on the default corpus,
 * batch 16 x 64 tokens, 200 steps, lr 1e-3, validation every 50 steps of 8
 * batches, no output folder. */
void ff_trainer_config_default(ff_trainer_config *c);

typedef struct {
    int64_t start_step;          /* where this run began (0, or the checkpoint's) */
    const char *data, *val_data; /* the globs in use (val_data NULL: none) */
    double sgemm_rate;           /* mean over ranks, per rank */
    /* the share of a core each compute thread has, which the measured rate
     * includes (< 1 where the ranks' threads outnumber the CPUs; 1 on a GPU
     * or with the caller's rates) */
    double sgemm_core_share;
    double flops_per_step;       /* model FLOPs of one step, whole grid */
    const ff_train_state *state; /* the checkpointed state (step, data position, ...) */
} ff_trainer_info;

typedef struct ff_trainer ff_trainer;

/* Checks the configuration, prepares `out` (created if missing; refused if
 * it holds another run's checkpoints, unless overwrite), makes the default
 * corpus if needed, builds the model on the grid, opens the data, and
 * initialises (seed), loads (init_from) or resumes (resume_from). On
 * failure *t is NULL. */
int ff_trainer_create(ff_grid *grid, const ff_trainer_config *cfg, ff_trainer **t);
/* One optimizer step on the next batch. A NaN or Inf loss stops with
 * FF_ENUMERIC before the update; the message names the last checkpoint
 * known good. FF_EINVAL after the last step. */
int ff_trainer_step(ff_trainer *t, ff_train_step_info *info);
/* The mean loss over val_batches micro-batches spread evenly over the
 * validation data (ff_data_spread; the same every time). FF_EINVAL without validation data. */
int ff_trainer_eval(ff_trainer *t, float *val_loss);
/* Checkpoints the current step into `out` (FF_EINVAL without one). */
int ff_trainer_save(ff_trainer *t);
/* Steps to the last one, validating and saving on the schedule; then logs
 * the bytes each group moved (rank 0's counters) and, if a step ran,
 * writes OUT/loss.svg (with out). */
int ff_trainer_run(ff_trainer *t);
/* Training and validation loss against steps (this run's: after a resume,
 * from the checkpoint on) as an SVG file, written atomically by rank 0.
 * FF_EIO before the first step (nothing to plot). */
int ff_trainer_write_loss_svg(ff_trainer *t, const char *path);

/* Samples of the model into path (the U-Net: a PNG grid of DDPM samples of
 * one batch, drawn with seed); FF_EUNSUPPORTED for a model without
 * (the GPT: ff_gpt_sample_next). */
int ff_trainer_write_samples(ff_trainer *t, const char *path, uint64_t seed);

int64_t ff_trainer_steps_done(const ff_trainer *t);
/* The model as the interface (include/fourfold/model.h). */
const ff_net *ff_trainer_net(const ff_trainer *t);
/* The GPT (NULL for another model) and the U-Net (NULL for another). */
ff_gpt *ff_trainer_gpt(ff_trainer *t);
ff_unet *ff_trainer_unet(ff_trainer *t);
void ff_trainer_get_info(const ff_trainer *t, ff_trainer_info *info);
/* Closes the log; frees everything (the grid stays the caller's). NULL is a no-op. */
void ff_trainer_destroy(ff_trainer *t);

#ifdef __cplusplus
}
#endif
#endif
