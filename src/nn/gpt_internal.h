/* The GPT model's state, shared by gpt.c (model, forward, backward),
 * gpt_optim.c (norm, AdamW, step) and gpt_io.c (canonical layout, files).
 * Internal to the library. */
#ifndef FF_GPT_INTERNAL_H
#define FF_GPT_INTERNAL_H

#include "fourfold/gpt.h"
#include "internal.h"

/* Named views into a flat buffer (parameters or gradients); per-block
 * arrays have L entries. */
typedef struct {
    float *wte, *wpe, *lnfw, *lnfb;
    float **qkvw, **attprojw, **fcw, **fcprojw;
    float **ln1w, **ln1b, **ln2w, **ln2b, **attprojb, **fcprojb; /* layout Y */
    float **qkvb, **fcb;                                         /* layout X */
    /* mixture of experts (NULL entries for dense blocks): the router (E,
     * C/Gy) per block; each local expert's layers, index l el + le (el = E / Ge) */
    float **routerw;
    float **efcw, **efcprojw, **efcprojb /* layout Y */, **efcb /* layout X */;
} ff_gpt_views;

/* What an MoE block keeps for its backward (gpt_moe.c); rows: the kept
 * token-expert assignments, at most m k, expert by expert. */
typedef struct {
    float *probs;             /* (m, E): the router's softmax */
    int *choice;              /* (m k) */
    int64_t *row, *row_token; /* (m k): each assignment's row (-1: dropped); each row's token */
    float *gate;              /* (m k) */
    int64_t *start;           /* E + 1: expert e's rows */
    double *f_over_n;         /* E: first-choice fraction over the micro-batch, / its tokens */
    float *X, *O;             /* (rows, C/Gy): the experts' inputs and outputs */
    float *Hp, *A;            /* (rows, 4C/Gx): before and after GELU */
    /* expert parallelism: rows are the local experts' (from every rank of
     * EP, expert by expert, source by source), and O is the outputs of this
     * rank's assignments as they came back, (E R, C/Gy): expert e's at e R */
    float *count_in; /* (ge el): rows from source j for local expert le at j el + le */
    int64_t *own0;   /* el + 1: local expert le's rows */
    int A_shared;    /* A is another set's (CAC) */
} ff_gpt_moe_acts;

/* What a block keeps for its backward (rows m = B/(Gz*Gd) * T). */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd; /* (m, C/Gy), (m), (m) */
    float *qkv;                       /* (m, 3C/Gx) */
    float *att;                       /* (B/(Gz*Gd), NH/Gx, T, T) */
    float *atty;                      /* (m, C/Gx) */
    float *mid;                       /* (m, C/Gy): the residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* (m, C/Gy), (m), (m) */
    float *fch, *fch_gelu;            /* (m, 4C/Gx); NULL in a set only MoE blocks use */
    ff_gpt_moe_acts moe;              /* a set MoE blocks use */
    /* bf16-mixed (docs/design.md §13): what only a product reads in the
     * backward, kept by its forward in 2 bytes a value (ff_linear_forward_keep):
     * ln1 (QKV), atty (projection), ln2 (a dense block's MLP up), fch_gelu
     * (MLP down). ln1, atty, fch_gelu and a dense set's ln2 then point into
     * the model's act32y / act32x, where they are made for the product */
    uint16_t *ln1h, *attyh, *ln2h, *fch_geluh;
    /* a set of a block under CAC: ln1, att, atty, ln2, fch_gelu and moe.A
     * are the shared set's (recomputed there) */
    int aliased;
} ff_gpt_acts;

struct ff_gpt {
    ff_grid *grid;
    ff_ctx *ctx;
    ff_gpt_config cfg;
    ff_gpt_opts opt;
    int B, T, Bl; /* micro-batch sequences: all, this rank's */
    int64_t m;    /* this rank's rows, Bl * T */
    ff_dims shape, me;
    int gx, gy, gz, gd;
    /* pipeline stages: this rank's stage of P holds blocks [l0, l0 + nb);
     * `first` has the embedding, `last` the final LayerNorm, LM head and
     * loss (both with P = 1) */
    int P, stage, l0, nb, first, last;
    int *stage_l0; /* P + 1: the first block of each stage, then L */
    ff_group *grp_pipe;
    float *emb_peer; /* the other copy's wte gradient (first and last stage, P > 1) */
    int64_t cy, cx, c3x, fx, vx, nhx, hs; /* local widths */
    ff_group *grp_x, *grp_y, *grp_d, *grp_zd, *grp_world;

    ff_linear_seq *seq;
    ff_linear *wte, **qkv, **attproj, **fc, **fcproj; /* fc, fcproj NULL in MoE blocks */
    /* mixture of experts: E experts (0: dense), top-k, capacity per
     * sequence; is_moe per block; local expert le of block l's layers at l el + le */
    int E, top_k;
    int64_t moe_cap;
    /* expert parallelism (ff_gpt_opts.expert_parallel): ge ranks of D share
     * the experts, el = E / ge each: this rank holds experts
     * [eslot el, (eslot + 1) el), eslot = d mod ge. EP: the ge ranks of D
     * with the same d / ge (all-to-all); EDP: those with the same eslot (the
     * experts' gradients) */
    int ge, el, eslot;
    ff_group *grp_ep, *grp_edp;
    size_t n_dense_z;    /* [0, n_dense_z) Z-sharded weights other than the experts' */
    size_t n_eby, n_ebx; /* [n_eby, n_ebx) the local experts' layout-Y biases, then to
                            n_params their layout-X ones */
    size_t *ebucket_off, *ebucket_len; /* block l's expert shards */
    ff_request **ebucket_req;
    int64_t moe_R;              /* rows per (rank, expert) block of the all-to-all */
    int moe_dtd;                /* duplicate token dropping: Gx > 1, Ge > 1, ff_gpt_opts.dtd */
    int64_t moe_ch;             /* with DTD: rows of a block each X rank moves, R / Gx up */
    float *moe_gath;            /* with DTD: (Gx E ch, C/Gy), the X group's pieces */
    float *moe_send, *moe_recv; /* (E R, C/Gy) each */
    int *is_moe, *layer0;       /* layer0: block l's first layer in the program's numbering */
    float **router_rows;        /* the routers' rows (C/Gy each), MoE blocks in order, experts */
    ff_linear **efc, **efcproj;
    float *moe_part, *moe_gather, *moe_stats, *moe_dO, *moe_dA, *moe_dX, *moe_dgate;
    float moe_aux_wt; /* the load-balancing loss's weight in this micro-batch's loss */
    double moe_aux_sum, moe_dropped_sum, moe_assign_sum; /* since zero_grad */
    float moe_aux, moe_dropped;                          /* ff_gpt_moe_stats */
    /* programs of weight uses: a whole micro-batch (the last stage), its
     * forward and its backward (the other stages), evaluation */
    ff_linear_use *progs[4];
    int n_prog[4], prog_mode;

    /* flat buffers: [0, n_zsharded) Z-sharded weights, [n_zsharded, n_decay)
     * positions, [n_decay, n_ytype) layout Y, [n_ytype, n_params) layout X */
    size_t n_params, n_zsharded, n_decay, n_ytype;
    float *params, *grads, *adam_m, *adam_v;
    uint16_t *wbf16;            /* bf16-mixed: [0, n_zsharded) of params in bf16, 2 bytes each
                                   (gpt_precision.c); else NULL */
    ff_bf16_gemm *bf16mm;       /* bf16-mixed on oneDNN: the linear layers' products */
    ff_bf16_products bf16_path; /* bf16-mixed: EMULATED or ONEDNN */
    double bf16_rate[2];        /* the rates that chose it: oneDNN's, the BLAS's (0: untimed) */
    ff_gpt_views pv, gv;
    size_t *bucket_off, *bucket_len; /* block l's weight shards in the flat buffer */
    ff_request **bucket_req;         /* nb + 1: blocks, then wte */

    /* Activations of up to n_slots micro-batches in flight (1 without
     * stages); `slot` is the one being computed. Blocks are the stage's,
     * numbered from 0. */
    int n_slots, slot;
    /* block inputs and the last output, (m, C/Gy) each: n_slots x (nb + 1),
     * or on the last stage (act_slots 1) the n_slots inputs then blocks
     * 1..nb once (ff_gpt_resid) */
    float *resid;
    ff_gpt_acts *acts;
    int n_own;     /* blocks with a set of their own per activation slot: those without
                      checkpointing, and under CAC those with it */
    int n_sets;    /* act_slots * n_own, and one more (shared) if any block checkpoints */
    int act_slots; /* n_slots, or 1 on the last stage (its backward follows at once) */
    int *ckpt;     /* block l recomputes its forward before its backward */
    int *set_of;   /* block l's set among the n_own, or -1: the shared one */
    float *grad_in, *grad_out;       /* n_slots x (m, C/Gy): gradients from / to the neighbours */
    double pipe_idle_s, pipe_busy_s; /* ff_gpt_pipeline_times */
    /* the last pipelined step's passes in order (ff_gpt_pipeline_order):
     * u for micro-batch u's forward, -(u + 1) for its backward */
    int pipe_order[FF_GPT_PIPE_ORDER_MAX];
    int pipe_order_n;
    uint64_t n_straggles; /* the jittered straggler's draws */
    ff_request **req_act_in, **req_act_out, **req_grad_in, **req_grad_out; /* per slot */
    /* the LayerNorm whose output the last MLP down's chunks already made
     * (block_forward): block ln_ready's LN1, nb the final one; -1 none */
    int ln_ready;
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *losses;
    /* bf16-mixed: lnf in 2 bytes (the LM head's input); the fp32 homes of
     * the layout-Y (m, C/Gy: the LayerNorms' outputs) and layout-X (m, 4C/Gx:
     * atty, fch_gelu) activations kept in bf16, between their making and
     * the product that keeps them (ff_gpt_acts) */
    uint16_t *lnfh;
    float *act32y, *act32x;
    float *dres, *dln, *tmp, *dqkv, *datty, *dfch, *att_scratch, *ce_scratch, *ln_scratch;
    float *att_bf16;   /* bf16-mixed: attention's rounded operands (FF_ATTN_BF16_SCRATCH) */
    double *norm_part; /* the gradient norm's block sums (gpt_optim.c) */
    float *mask;       /* n_params: 1 kept, 0 pruned (prune.c), or NULL */
    /* with a mask, the data-parallel all-reduces send the kept entries only
     * (docs/samo.md): range r (2l a block's bucket, 2l + 1 its experts', 2 nb
     * the embedding's) has its kept offsets at pack_idx[pack_off[r] ..
     * pack_off[r + 1]) and is packed at the same place of pack_buf */
    uint32_t *pack_idx;
    size_t *pack_off;
    float *pack_buf;
    /* SAMO (samo.c, docs/samo.md): the kept offsets of the Z-sharded
     * weights [samo_zc0, n_zsharded), increasing, samo_k of them, and their
     * gradient and AdamW moments compressed in samo_g, samo_m, samo_v; the
     * dense grads, adam_m and adam_v then hold [0, samo_zc0) (wte's shard
     * when nothing of it is pruned, else nothing) followed by [n_zsharded,
     * n_params) (ff_gpt_rest), and mask and the packing are gone */
    int samo;
    uint32_t *samo_idx;
    size_t samo_k, samo_zc0;
    float *samo_g, *samo_m, *samo_v;
    /* SAMO in bf16-mixed (docs/samo.md, the dissertation's eq. 4.1): the
     * products read the bf16 copy, so the fp32 master of the compressed
     * weights is compressed too, samo_p (samo_k floats); params then holds
     * [0, samo_zc0) and [n_zsharded, n_params) only (samo_prest), but while
     * samo_dense a dense master made for a moment (an initialisation, a
     * scatter, a gather: ff_gpt_samo_master_dense) */
    float *samo_p, *samo_prest;
    int samo_dense;
    /* the Z-sharded offset of each linear layer's weight shard, in the
     * program's numbering (wte 0 where the stage has it, then block l's
     * layers from layer0[l]); set by the layout */
    size_t *woff;
    /* ZeRO over D (gpt_zero.c; NULL: off, or nothing to shard with Gd = 1):
     * the moments hold the rank's slices only, ff_gpt_zero_state floats */
    struct ff_gpt_zero *zr;
    size_t act_bytes, scratch_bytes;

    double loss_sum; /* this rank's rows, over the step's micro-batches */
    int micro_done;
};

/* Point-to-point tags on PIPE (0..1999): micro-batch u's activation
 * 2 (u mod 999) and gradient 2 (u mod 999) + 1 (gpt_pipe.c), the tied
 * embedding's gradient exchange FF_GPT_TAG_EMB. */
enum { FF_GPT_TAG_SPAN = 999, FF_GPT_TAG_EMB = 1998 };

/* Entry `off` (>= n_zsharded) of a flat buffer of gradients or moments,
 * which under SAMO holds [0, samo_zc0) and [n_zsharded, n_params) only. */
static inline float *ff_gpt_rest(const ff_gpt *g, float *buf, size_t off)
{
    return buf + (off - (g->samo ? g->n_zsharded - g->samo_zc0 : 0));
}
/* Entries of the flat buffer of parameters: the dense state's and, in
 * bf16-mixed SAMO, the compressed master's (see samo_p). */
static inline size_t ff_gpt_param_state(const ff_gpt *g)
{
    return g->samo_p ? g->samo_zc0 + g->n_params - g->n_zsharded + g->samo_k : g->n_params;
}
/* Entries of the dense flat buffers of gradients and moments. */
static inline size_t ff_gpt_dense_state(const ff_gpt *g)
{
    return g->samo ? g->samo_zc0 + g->n_params - g->n_zsharded : g->n_params;
}
/* bf16-mixed precision (gpt_precision.c): checks g->opt.precision and what
 * the model refuses in it, and sets the layers' bf16 option; the bf16 copy
 * of the Z-sharded weights, 2 bytes each (allocated after the flat
 * buffers); what a layer whose weight shard is at Z-sharded offset off
 * reads (the copy there; NULL in fp32: the master itself); the floats of
 * storage the copy takes (n_zsharded / 2 rounded up; 0 in fp32); the copy
 * step, of all of it or of n entries at off from their master values, or
 * +0 there. */
int ff_gpt_precision_check(ff_gpt *g);
int ff_gpt_bf16_alloc(ff_gpt *g);
/* After the buffers (rc: their allocation's code, agreed here first): the
 * products' path, timed and agreed over the ranks for AUTO, handed to the
 * layers' tuner. FF_OK at once in fp32. */
int ff_gpt_bf16_choose(ff_gpt *g, int rc);
const uint16_t *ff_gpt_used_weight(const ff_gpt *g, size_t off);
size_t ff_gpt_bf16_floats(const ff_gpt *g);
void ff_gpt_bf16_weights(ff_gpt *g);
void ff_gpt_bf16_weights_at(ff_gpt *g, size_t off, const float *master, size_t n);
void ff_gpt_bf16_zero(ff_gpt *g, size_t off, size_t n);
/* ---- ZeRO over D (gpt_zero.c, docs/design.md) ---- */
typedef struct ff_gpt_zero ff_gpt_zero;
/* Refuses a zero level other than 0, 1, 2 (FF_EINVAL) and what ZeRO does
 * not support yet (FF_EUNSUPPORTED); the same answer on every rank. */
int ff_gpt_zero_check(const ff_gpt *g);
/* The check, then the layout of the slices (g->zr; none for zero 0 or
 * Gd = 1); FF_ENOMEM on this rank only. */
int ff_gpt_zero_setup(ff_gpt *g);
void ff_gpt_zero_destroy(ff_gpt *g);
/* Floats of a sliced buffer (the moments; under SAMO the dense ones). */
size_t ff_gpt_zero_state(const ff_gpt *g);
/* SAMO (docs/samo.md "SAMO with ZeRO"): floats of a sliced compressed
 * buffer (samo_m, samo_v, in bf16-mixed samo_p); the floats of the staging
 * vector of the gathers after AdamW (0 without SAMO); 1 if SAMO's master
 * (samo_prest and samo_p) is sliced (bf16-mixed). */
size_t ff_gpt_zero_samo_state(const ff_gpt *g);
size_t ff_gpt_zero_stage_floats(const ff_gpt *g);
int ff_gpt_zero_samo_master(const ff_gpt *g);
/* Space sp's (0: the dense buffers, 1: SAMO's compressed ones) whole
 * buffer `whole` from `src`, a sliced buffer (sliced 1) or a whole one
 * whose rank's chunks are current: the other chunks gathered over D
 * (collective over D, blocking). */
int ff_gpt_zero_whole(ff_gpt *g, int sp, const float *src, int sliced, float *whole);
/* The rank's slices of space sp taken from a dense flat buffer (SAMO:
 * entry k of space 1 is flat samo_idx[k]). */
void ff_gpt_zero_slice_flat(const ff_gpt *g, int sp, const float *flat, float *sliced);
/* SAMO's switch (samo.c): the moments and master made whole and ZeRO's
 * layout removed (collective over D, outcome agreed); ff_gpt_zero_setup
 * afterwards builds SAMO's. */
int ff_gpt_zero_unset(ff_gpt *g);
/* A masked model with ZeRO asked for and not SAMO (its mask set removed
 * ZeRO's layout, SAMO brings it back): FF_EUNSUPPORTED for a step, the
 * same on every rank; FF_OK otherwise. */
int ff_gpt_zero_masked_check(ff_gpt *g);
/* The reduce-scatter of a data-parallel range of the gradients, in place:
 * the ring all-reduce's reduce phase (ff_iallreduce_half). */
int ff_gpt_zero_reduce(ff_gpt *g, ff_group *grp, size_t off, size_t len, ff_request **req);
/* The step's gradients reduce-scattered (1; ZeRO-2 then releases those
 * outside the rank's slices), or zeroed for the next step (0). */
void ff_gpt_zero_reduced(ff_gpt *g, int reduced);
/* Part of the Z-sharded gradients' sum of squares, added to *out as the
 * plain pass adds it: part 0 the dense weights' (on d = 0; collective over
 * D), part 1 the local experts' (on d = eslot; collective over EDP). */
int ff_gpt_zero_sumsq(ff_gpt *g, int part, double *out);
/* AdamW on the slices (j as for the dense pass, over the whole flat
 * buffers), then the gather of the updated parameters over D (and, in
 * bf16-mixed, their bf16 copy): posted and left in flight, each range
 * waited for by its first reader (below), or, with a mask, blocking. */
int ff_gpt_zero_adamw(ff_gpt *g, const void *adamw_job);
/* Waits for the post-AdamW gathers of the ranges that meet [off, off +
 * len) of the parameters (the linear layers' weight hook, gpt.c). */
int ff_gpt_zero_params_wait(ff_gpt *g, size_t off, size_t len);
/* Waits for every one still in flight: before anything else reads or
 * writes the parameters (gathers, scatters, files, the next AdamW, masks,
 * destroy). FF_OK without ZeRO. */
int ff_gpt_zero_params_settle(ff_gpt *g);
/* A transfer of the gradients or moments `which` through a full flat
 * buffer *full: with gather 1 filled with the whole of `which` (the slices
 * gathered over D), with 0 zeroed for a scatter (outcome agreed on every
 * rank); then ff_gpt_zero_transfer_end, after a scatter (scattered 1)
 * taking the rank's slices from it. Between steps *full is the gradient
 * buffer itself, its slices kept aside meanwhile. */
int ff_gpt_zero_transfer_begin(ff_gpt *g, ff_gpt_buffer which, int gather, float **full);
void ff_gpt_zero_transfer_end(ff_gpt *g, ff_gpt_buffer which, float *full, int scattered);
/* bf16-mixed: the fp32 master sliced over D as the moments are (g->params
 * holds ff_gpt_zero_state floats; the products read the bf16 copy, which
 * the gathers after AdamW move). 0 without ZeRO, in fp32, or while the
 * master is whole for a reader (below). */
int ff_gpt_zero_master_sliced(const ff_gpt *g);
/* The view of n entries at flat offset off of the sliced master `base`,
 * NULL where they lie in a range sliced over D (gpt.c's layout). */
float *ff_gpt_zero_master_at(const ff_gpt *g, float *base, size_t off, size_t n);
/* The whole master for a reader that needs it (init, gathers, scatters):
 * the slices gathered over D into a full flat buffer that g->params then
 * is (collective over D; FF_OK and nothing without a sliced master;
 * outcome agreed); ff_gpt_zero_master_slice keeps the rank's slices again,
 * after making the bf16 copy from the whole master where `changed`. */
int ff_gpt_zero_master_whole(ff_gpt *g);
/* Only the whole master's views, for a transfer of the gradients or
 * moments, which needs their offsets, not the master's values: bound into
 * the gradient buffer, nothing gathered or allocated; undone by
 * ff_gpt_zero_master_slice. */
int ff_gpt_zero_master_views(ff_gpt *g);
void ff_gpt_zero_master_slice(ff_gpt *g, int changed);
/* The dense AdamW pass over n entries of job (gpt_optim.c). */
void ff_gpt_adamw_run(ff_gpt *g, const void *adamw_job, int64_t n);
/* Data-parallel range r of the flat buffers (gpt.c): block l's bucket
 * (r = 2l), its local experts' (2l + 1), the embedding's (2 nb). */
void ff_gpt_dp_range(const ff_gpt *g, int r, size_t *off, size_t *len);
/* Floats of the moments' buffers. */
static inline size_t ff_gpt_moment_state(const ff_gpt *g)
{
    return g->zr ? ff_gpt_zero_state(g) : ff_gpt_dense_state(g);
}
/* Floats of SAMO's compressed moments (and bf16-mixed master). */
static inline size_t ff_gpt_samo_state(const ff_gpt *g)
{
    return g->zr && g->samo ? ff_gpt_zero_samo_state(g) : g->samo_k;
}

/* SAMO: the first compressed entry whose offset is at least off. */
size_t ff_gpt_samo_lower(const ff_gpt *g, size_t off);
/* SAMO's part of the gradient norm: adds to *out, block after block, the
 * sums of squares of the gradients at offsets [a, b) (wte's dense prefix,
 * then the compressed ones), in the dense pass's blocks of FF_SUM_BLOCK
 * from a and their lanes, so *out gets the dense gradients' bits (samo.c). */
void ff_gpt_samo_sumsq(ff_gpt *g, size_t a, size_t b, double *out);
/* SAMO's AdamW on the compressed entries [k0, k0 + n) (samo.c), their
 * moments (and bf16-mixed master) at `at` of samo_m, samo_v (samo_p): the
 * whole or, under ZeRO, a slice; j as for the dense pass. */
void ff_gpt_samo_adamw(ff_gpt *g, const void *adamw_job, size_t k0, size_t n, size_t at);
/* SAMO: the pruned weights set to +0 again (after the parameters were
 * written: ff_gpt_init, a scatter or a load). */
void ff_gpt_samo_zero_pruned(ff_gpt *g);
/* SAMO: the dense flat buffer `which` (grads, moments, mask) made for a
 * moment (ff_fbuf_free it), or a compressed buffer set from a dense one. */
float *ff_gpt_samo_expand(ff_gpt *g, ff_gpt_buffer which);
void ff_gpt_samo_compress(ff_gpt *g, ff_gpt_buffer which, const float *dense);
/* SAMO in bf16-mixed: the dense master made for a moment (params and its
 * views dense; FF_ENOMEM agreed on every rank), then compressed back into
 * samo_p and the dense rest, the pruned weights +0 and the bf16 copy made
 * (`changed`: after an initialisation or a scatter). FF_OK and nothing to
 * do without a compressed master. */
int ff_gpt_samo_master_dense(ff_gpt *g);
void ff_gpt_samo_master_compress(ff_gpt *g, int changed);
/* SAMO in bf16-mixed: the bf16 copy from the compressed master, pruned +0. */
void ff_gpt_samo_bf16_weights(ff_gpt *g);
/* This rank's shard of wte in flat buffer `which`, *n floats (gpt_io.c):
 * NULL where its stage holds no wte, and for gradients and moments
 * compressed under SAMO. With stages the first and the last stage each
 * hold a copy, which tests/test_pipeline.c compares. */
const float *ff_gpt_wte_shard(const ff_gpt *g, ff_gpt_buffer which, size_t *n);
/* Binds the linear layers' gradients (compressed under SAMO) and the views (gpt.c). */
void ff_gpt_bind_views(ff_gpt *g);

/* The kept offsets of each data-parallel bucket under g->mask (NULL: none,
 * the packing removed); FF_ENOMEM on this rank only (gpt.c). */
int ff_gpt_pack_build(ff_gpt *g);
/* Entries (blocks, dense blocks, experts, or 1) of canonical tensor i. */
size_t ff_gpt_tensor_entries(const ff_gpt *g, int i);
/* The activation set of block l in the current slot. */
ff_gpt_acts *ff_gpt_acts_of(ff_gpt *g, int l);
/* Block l's input (l = nb: the stage's output) in slot `slot`. */
float *ff_gpt_resid(ff_gpt *g, int slot, int l);
/* One micro-batch's forward on this stage in `slot` (tokens: the
 * embedding's, targets: the loss's), in its own run of the program; on the
 * last stage its backward follows in the same run. dscale as for the loss. */
int ff_gpt_stage_forward(ff_gpt *g, int slot, const int32_t *tokens, const int32_t *targets,
                         float dscale, int last_micro);
/* The backward of the micro-batch in `slot` on a stage other than the last:
 * the gradient of its output is in grad_in[slot]; leaves the gradient of its
 * input in grad_out[slot] (not on the first stage). */
int ff_gpt_stage_backward(ff_gpt *g, int slot, const int32_t *tokens, int last_micro);
/* The micro-batches of a step through the stages (gpt_pipe.c). */
int ff_gpt_pipeline_run(ff_gpt *g, const int32_t *tokens, const int32_t *targets, int n_micro);
/* This stage's forward of evaluation (slot 0) in its own run. */
int ff_gpt_eval_forward_stage(ff_gpt *g, const int32_t *tokens, const int32_t *targets);
/* The forward of evaluation through the stages, losses on the last one. */
int ff_gpt_pipeline_eval(ff_gpt *g, const int32_t *tokens, const int32_t *targets);
/* Block l's linear layers in the order of its forward (QKV, projection,
 * then the MLP's up and down or each expert's), their number, and where
 * layer i keeps its weight shard and bias in views v. */
int ff_gpt_block_nlin(const ff_gpt *g, int l);
ff_linear *ff_gpt_block_lin(const ff_gpt *g, int l, int i);
void ff_gpt_lin_views(const ff_gpt *g, ff_gpt_views *v, int l, int i, float ***w, float ***b);
/* Block l's MoE activations (sizes from g); FF_ENOMEM. bytes into *acc.
 * shared_A not NULL: A is that buffer (CAC, gpt.c), not allocated. */
int ff_gpt_moe_alloc(ff_gpt *g, ff_gpt_moe_acts *a, float *shared_A, size_t *acc);
/* Rows of an MoE block's experts on this rank, at most (X, Hp, A). */
int64_t ff_gpt_moe_rows(const ff_gpt *g);
void ff_gpt_moe_free(ff_gpt_moe_acts *a);
/* An MoE block's MLP from act->ln2 (gpt_moe.c): out = act->mid + the
 * experts' combined output; under recompute only what the backward needs. */
int ff_gpt_moe_forward(ff_gpt *g, int l, ff_gpt_acts *act, float *out, int recompute);
/* From g->dres (d loss / d out) to g->dln (d loss / d ln2), parameter
 * gradients added. */
int ff_gpt_moe_backward(ff_gpt *g, int l, ff_gpt_acts *act);
/* The step's or evaluation's MoE statistics from the sums since they were
 * reset, over the stages; collective over PIPE when the model has experts. */
int ff_gpt_moe_finish(ff_gpt *g, int n_micro);
/* Allocates AdamW's moments (zero) if they are not yet. */
int ff_gpt_adam_ensure(ff_gpt *g);
/* A token or target outside [0, V) among this rank's `rows` rows: FF_EINVAL
 * with a message (this rank only; no communication). */
int ff_gpt_tokens_local(ff_gpt *g, const int32_t *tokens, const int32_t *targets, int64_t rows);
/* Refuses, on every rank, a token or target outside [0, V) on any rank. */
int ff_gpt_check_tokens(ff_gpt *g, const int32_t *tokens, const int32_t *targets);
/* ff_gpt_forward_backward for tokens the caller has checked and agreed on. */
int ff_gpt_forward_backward_agreed(ff_gpt *g, const int32_t *tokens, const int32_t *targets,
                                   int micro, int n_micro);
/* ff_gpt_step with the caller's own outcome `local_rc` (its reading of the
 * batch) agreed together with the tokens of every micro-batch: the step's one
 * agreement among the ranks (docs/design.md §10). */
int ff_gpt_step_agreed(ff_gpt *g, int local_rc, const int32_t *tokens, const int32_t *targets,
                       int n_micro, const ff_adamw *h, int step, ff_gpt_step_info *info);
/* The forward of the evaluation program: losses into g->losses, logits kept. */
int ff_gpt_run_forward(ff_gpt *g, const int32_t *tokens, const int32_t *targets);

/* Rank 0: a checkpoint file's header against the model (kind and shape),
 * without reading its parameters (the checkpoint loader checks it first). */
int ff_gpt_check_header(const ff_gpt *g, const char *path);

#endif
