/* Training checkpoints and sampling on top of the GPT model (docs/train.md).
 *
 * A checkpoint of step s in a folder is three files:
 *
 *   model_%08d.bin  the parameters, canonical (llm.c gpt2_*.bin v3, fp32,
 *                   loadable by llm.c), with a CRC-32 in free header slots
 *   state_%08d.bin  the training state: step, seed, data position,
 *                   schedule, and the AdamW moments m and v in canonical
 *                   layout (so a run resumes on any grid), with a CRC-32 of
 *                   the whole file and the model file's CRC (the pair must match)
 *   DONE_%08d       written last: the checkpoint is complete
 *
 * Each file is written to a temporary name, fsync'd and renamed, then the
 * folder is fsync'd; older checkpoints are removed only after the new DONE
 * marker exists, so a run killed at any moment leaves the previous complete
 * checkpoint. Everything is canonical, so the files do not depend on the
 * grid; rank 0 writes and reads them, the others take part in the gathers
 * and scatters. All functions are collective over the model's context and
 * every rank gets the same result. */
#ifndef FOURFOLD_TRAIN_H
#define FOURFOLD_TRAIN_H

#include <stdint.h>

#include "fourfold/data.h"
#include "fourfold/gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { FF_STATE_MAGIC = 20261122, FF_STATE_VERSION = 1 };

typedef struct {
    int64_t step;                /* optimizer steps completed */
    uint64_t seed;               /* the run's seed (initialisation; sampling) */
    ff_data_pos data;            /* the training data's position after `step` steps */
    int batch, micro_batch, seq; /* global sequences per step and per micro-batch, T */
    ff_adamw hyper;              /* the schedule and optimizer settings of the run */
    uint32_t model_crc;          /* filled by save/load: the CRC of the paired model file */
} ff_train_state;

/* Writes the checkpoint of st->step into `dir` (which must exist) and then
 * removes all but the newest `keep` complete checkpoints of steps up to
 * st->step there (keep <= 0: remove none). A complete checkpoint of the
 * same step is replaced (its DONE marker is withdrawn first). */
int ff_ckpt_save(ff_gpt *g, const char *dir, ff_train_state *st, int keep);
/* The newest complete checkpoint in `dir` (the largest step with a DONE
 * marker): *step, or -1 if there is none. */
int ff_ckpt_latest(ff_ctx *ctx, const char *dir, int64_t *step);
/* The newest complete checkpoint in `dir` older than step `before`: *step,
 * or -1 if there is none (a resume that falls back past a bad one). */
int ff_ckpt_older(ff_ctx *ctx, const char *dir, int64_t before, int64_t *step);
/* Removes every checkpoint in `dir` (a new run in a used folder). */
int ff_ckpt_clear(ff_ctx *ctx, const char *dir);
/* Loads parameters, AdamW moments and the state of checkpoint `step` from
 * `dir`, verifying both checksums, the pairing, and the model shape. A
 * masked run's checkpoint also has the mask (model_N.bin.mask, written
 * before the DONE marker; docs/samo.md): it is loaded with it. */
int ff_ckpt_load(ff_gpt *g, const char *dir, int64_t step, ff_train_state *st);
/* The file names of checkpoint `step` in `dir` (model, state, done, mask). */
void ff_ckpt_path(char *buf, size_t len, const char *dir, const char *kind, int64_t step);

/* ---- sampling ---------------------------------------------------------------------- */

typedef struct {
    float temperature; /* 0: greedy (argmax) */
    int top_k;         /* 0: the whole vocabulary */
    uint64_t seed;
} ff_sampler;

/* One token for each of this rank's sequences (ff_gpt_local_sequences):
 * runs the model forward on tokens (count x T, this rank's rows), takes the
 * logits at position `pos` (over the true vocabulary V; padded entries are
 * never chosen), and draws from softmax(logits / temperature) restricted to
 * the top_k, with the grid-independent RNG keyed by (seed, global sequence
 * index, `draw`). Every rank of the sequence's (z, d) pair returns the same
 * token, and so does every grid. next: count entries. */
int ff_gpt_sample_next(ff_gpt *g, const int32_t *tokens, int pos, const ff_sampler *s,
                       uint64_t draw, int32_t *next);

#ifdef __cplusplus
}
#endif
#endif
