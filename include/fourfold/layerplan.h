/* Per-layer plans (docs/planner.md, "Per-layer plans"): for each transformer
 * block, activation checkpointing, and for each of its four linear layers and
 * the token embedding / LM head, the decomposition of its dependent
 * all-reduces, the overlap switches, the AG cache and the wire precision.
 *
 * `fourfold plan --per-layer --out plan.json` writes one (the planner's
 * coordinate descent, ff_plan_per_layer in plan.h); `fourfold train --plan
 * plan.json` runs it (ff_gpt_opts.plan). The file is JSON, format
 * "fourfold-layer-plan", version 1, written atomically and checked strictly
 * when read: a plan is for one model and one grid, and a run refuses another
 * with one message.
 *
 * Pure computation and files: nothing here calls MPI. Functions return 0 or a
 * negative FF_E* code and write one sentence into (err, err_len). */
#ifndef FOURFOLD_LAYERPLAN_H
#define FOURFOLD_LAYERPLAN_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/grid.h" /* ff_dims */

#ifdef __cplusplus
extern "C" {
#endif

/* version 3: "rs_cmm" in every layer's options, "progress" optional; 2:
 * with "progress"; 1: without. All three are read; a plan is written as the
 * lowest that holds it (3 only if a layer has rs_cmm on). */
#define FF_LAYER_PLAN_VERSION 3

/* The options of one linear layer. */
typedef struct {
    int decompose;  /* row chunks of the forward all-reduce and the backward dI
                       all-reduce (docs/linear.md, "Decomposition"); 0 or 1: off */
    int oar;        /* 0/1: dI's all-reduce beside the dW GEMM */
    int ors;        /* 0/1: dW's reduce-scatter waited only when needed */
    int oag;        /* 0/1: this layer's all-gather posted during the previous use */
    int ag_cache;   /* 0/1: keep the first forward's gathered weight until the backward */
    int wire_bytes; /* 4: fp32, 2: bf16 on the wire for this layer's collectives */
    int rs_cmm;     /* 0/1: dW_rc computed as the reduce-scatter collective matmul
                       (ff_linear_opts.rs_cmm; docs/linear.md) */
} ff_layer_opts;

/* The linear layers of a block, in forward order. */
enum { FF_BLOCK_QKV = 0, FF_BLOCK_ATTPROJ, FF_BLOCK_FC, FF_BLOCK_FCPROJ, FF_BLOCK_LAYERS };

typedef struct {
    int checkpoint; /* 0/1: keep only the block's input, recompute before the backward */
    ff_layer_opts layer[FF_BLOCK_LAYERS];
} ff_block_opts;

typedef struct {
    /* what the plan is for: a run refuses a plan whose model or grid differ */
    int layers, heads;
    int64_t hidden, vocab; /* vocab as given (not padded) */
    ff_dims grid;          /* Gx, Gy, Gz, Gd */
    /* what it was planned with (informative: a run with another batch may use it) */
    int64_t batch, seq;
    int micro_batches;
    double predicted_step_s; /* the planner's prediction; 0: none */
    /* the GEMM panel height the plan was made for (fourfold plan
     * --panel-rows; 0: by shape): decomposition cuts at panel boundaries, so
     * a run with the plan uses these panels (ff_gemm_set_panel_rows) */
    int64_t panel_rows;
    /* the progress mode it was searched for (FF_PROGRESS_*, `fourfold plan
     * --progress`); -1: not recorded (a version 1 file, or a uniform plan;
     * a zeroed struct means FF_PROGRESS_WAIT: set -1 if unknown).
     * Informative: a run with another mode may use the plan, told so. */
    int progress;
    ff_layer_opts head;    /* the token embedding and tied LM head (wte) */
    ff_block_opts *blocks; /* `layers` entries, owned (ff_layer_plan_free) */
} ff_layer_plan;

/* The options a run uses when no plan is given: decomposition off, every
 * overlap on, AG cache on, fp32 wire. */
void ff_layer_opts_default(ff_layer_opts *o);

/* Allocates p->blocks for `layers` blocks, each block and the head set to
 * `opts` and checkpoint to `checkpoint`; the identification fields are zeroed
 * for the caller to fill, progress -1. FF_ENOMEM or FF_EINVAL (layers < 1). */
int ff_layer_plan_uniform(ff_layer_plan *p, int layers, const ff_layer_opts *opts, int checkpoint,
                          char *err, size_t err_len);
void ff_layer_plan_free(ff_layer_plan *p);

/* FF_EINVAL with a sentence if an option is out of range (decompose 0..64,
 * switches 0/1, wire_bytes 4 or 2) or the identification is impossible. */
int ff_layer_plan_check(const ff_layer_plan *p, char *err, size_t err_len);

/* The JSON text (malloc'd, NUL-terminated; NULL if out of memory):
 * version 2 with "progress", or version 1 for a plan whose progress is not
 * recorded. */
char *ff_layer_plan_to_json(const ff_layer_plan *p);
/* Parses a plan of version 1 or 2; `source` names it in messages.
 * FF_ECORRUPT on malformed JSON or another format/version, FF_EINVAL on a
 * missing, duplicated or out-of-range key or a block count other than
 * "layers". */
int ff_layer_plan_parse(const char *text, size_t len, const char *source, ff_layer_plan *out,
                        char *err, size_t err_len);
/* Writes atomically (a temporary file renamed over path) / reads and parses. */
int ff_layer_plan_write(const ff_layer_plan *p, const char *path, char *err, size_t err_len);
int ff_layer_plan_read(const char *path, ff_layer_plan *out, char *err, size_t err_len);

/* 0 if the plan is for this model (layers, heads, hidden, vocab) and grid;
 * else FF_EINVAL and one sentence naming every difference. */
int ff_layer_plan_match(const ff_layer_plan *p, int layers, int heads, int64_t hidden,
                        int64_t vocab, ff_dims grid, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif
