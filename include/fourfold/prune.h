/* Magnitude pruning of the GPT's weight matrices and the masks it leaves
 * (docs/samo.md).
 *
 * A mask marks, for every entry of the canonical parameters
 * (ff_gpt_canonical_size, llm.c's order), whether it is kept (1) or pruned
 * (0). Pruning removes the smallest weights by magnitude among the
 * candidates: the linear layers' weight matrices (qkvw, attprojw, fcw,
 * fcprojw, and a mixture of experts' efcw, efcprojw), and with `embedding`
 * the token embedding's V real rows; biases, LayerNorms, the positions and
 * the routers are never pruned. A mask file is `<checkpoint>.mask` beside
 * the checkpoint it belongs to, so a run started from that checkpoint finds
 * it. */
#ifndef FOURFOLD_PRUNE_H
#define FOURFOLD_PRUNE_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    double sparsity; /* the fraction of the candidates pruned, [0, 1) */
    /* 0: one threshold over all candidates (global); 1: each matrix (a
     * block's, an expert's, the embedding) loses the fraction on its own */
    int per_layer;
    int embedding; /* the token embedding is a candidate too */
} ff_prune_opts;

/* Sparsity 0, global, without the embedding. */
void ff_prune_opts_default(ff_prune_opts *o);

/* Prunes by magnitude: keep (ff_gpt_canonical_size(g) bytes, 1 kept and 0
 * pruned) comes in with the entries already pruned (all 1 the first time)
 * and leaves with round(sparsity x candidates) of the candidates pruned (per
 * matrix with per_layer): the already pruned ones and the smallest |w| of
 * canon (canonical parameters) among the kept ones, ties pruned in canonical
 * order, so the same parameters give the same mask whatever the grid. Entries
 * that are not candidates stay kept. Counts of the candidates and the pruned
 * (may be NULL). FF_OK, or FF_EINVAL (a sparsity outside [0, 1), a
 * non-finite candidate) with a message in err. Pure: no communication. */
int ff_prune(const ff_gpt *g, const float *canon, const ff_prune_opts *o, unsigned char *keep,
             int64_t *candidates, int64_t *pruned, char *err, size_t err_len);
/* Entries `keep` already prunes beyond what o's sparsity asks of their
 * group (ff_prune's groups: all candidates, or each tensor per layer): 0
 * when pruning to o would only add, else how many more (ff_prune leaves
 * them pruned); -1 out of memory. `fourfold prune` refuses a target below
 * its input's mask. */
int64_t ff_prune_excess(const ff_gpt *g, const ff_prune_opts *o, const unsigned char *keep);

/* Writes keep as a mask file for g's shape, atomically: a header (magic
 * FF_MASK_MAGIC, version 1, the entry and kept counts, the options, the
 * model's shape), one bit per entry, a CRC-32. ff_mask_read checks all of it
 * against g (another model's mask is refused) and fills keep. Pure file I/O
 * on the calling rank, in the machine's byte order (little-endian on x86-64
 * and Arm64, as llm.c's files); FF_EIO, FF_ECORRUPT, FF_EINVAL or FF_ENOMEM
 * with a message. Another model is one of another layout (the checkpoint
 * header's slots 2-9); the routing options of a mixture of experts may
 * differ. */
enum { FF_MASK_MAGIC = 20261126 };
int ff_mask_write(const ff_gpt *g, const char *path, const unsigned char *keep,
                  const ff_prune_opts *o, char *err, size_t err_len);
int ff_mask_read(const ff_gpt *g, const char *path, unsigned char *keep, int64_t *kept, char *err,
                 size_t err_len);
/* "<checkpoint>.mask" into out (len bytes); FF_EINVAL if it does not fit. */
int ff_mask_path(const char *checkpoint, char *out, size_t len);

/* Trains with a mask from now on (docs/samo.md, "Masked training"): keep is
 * canonical, on world rank root (ignored elsewhere; root's NULL removes the
 * mask); the parameters and AdamW's moments are multiplied by it at once,
 * ff_gpt_finish_grads multiplies the gradients by it (so the norm and every
 * caller see them masked; the data-parallel all-reduces send the kept
 * entries only) and ff_gpt_step the parameters after AdamW, so pruned
 * weights stay exactly zero. On failure the model has no mask. Collective. */
int ff_gpt_set_mask(ff_gpt *g, const unsigned char *keep, int root);
/* 1 if the model trains with a mask. */
int ff_gpt_has_mask(const ff_gpt *g);
/* Reads a mask file on rank 0 (checked against g) and trains with it from
 * now on (ff_gpt_set_mask). With `optional`, a path that does not exist
 * is no error and leaves the model as it is. Collective; the outcome
 * agrees on every rank. */
int ff_gpt_load_mask(ff_gpt *g, const char *path, int optional);
/* Writes the model's mask to path (rank 0, atomically); a model without a
 * mask removes a file left at path instead. Its header's options are what
 * the mask tells: the embedding a candidate if any of it is pruned, the
 * sparsity the pruned fraction of the candidates, per_layer 0. Collective. */
int ff_gpt_save_mask(ff_gpt *g, const char *path);

/* SAMO (docs/samo.md, "SAMO"): from now on the model keeps the gradient and
 * AdamW's moments of the weight matrices only at the mask's kept entries,
 * compressed, with one array of 32-bit offsets into the rank's shard; the
 * weights stay dense (pruned ones exactly zero) for the products, and the
 * dense mask is freed. Training is bitwise masked training with the same
 * mask; the mask cannot change any more (ff_gpt_set_mask refuses). Needs a
 * mask that prunes weight matrices only. Gradients are zero afterwards (a
 * step's are lost: call it between steps); moments are kept. Gathers and
 * scatters of the gradients, moments and mask go through a dense copy for
 * the moment. Collective; the outcome agrees on every rank. */
int ff_gpt_samo(ff_gpt *g);
int ff_gpt_is_samo(const ff_gpt *g);

#ifdef __cplusplus
}
#endif

#endif
