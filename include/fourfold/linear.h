/* The 3D parallel linear layer (Algorithm 1 of the 4D paper, docs/design.md §3) and
 * the sequence of layers that schedules its weight all-gathers.
 *
 * O = I W + b with W of shape k x n (in x out). A normal layer (N) takes its
 * input in layout Y and gives its output in layout X; a transposed layer (T)
 * swaps the roles of X and Y. Write R for the group that splits W's rows (Y
 * for N, X for T) and C for the one that splits its columns (X for N, Y for
 * T). Rank (x, y, z, d) owns only its Z-piece of the row-major block W_rc
 * (k/|R| x n/|C|), flattened and cut into Gz equal contiguous pieces, and the
 * bias slice b_c:
 *
 *   forward   W_rc = AllGather_Z(W_shard); O = I W_rc; O = AllReduce_R(O); O += b_c
 *   backward  dI = AllReduce_C(dO W_rc^T); dW_rc = I^T dO;
 *             dW_shard += ReduceScatter_Z(dW_rc); db_c += colsum(dO)
 *   later     dW_shard = AllReduce_D(dW_shard); db_c = AllReduce_ZD(db_c)
 *
 * Parameters are not owned by the layer: the caller binds views into its own
 * flat buffers (llm.c's habit), so optimizer, checkpoint and gradient
 * collectives act on contiguous ranges.
 *
 * A sequence (ff_linear_seq) holds the layers of a model and the program of
 * their weight uses in execution order (forward, recompute under activation
 * checkpointing, backward). It knows which use comes next, so it can post the
 * next all-gather early (OAG), keep a gathered weight for a later use (AG
 * cache), and defer waiting on reduce-scatters (ORS). Every overlap is a
 * switch; results are bitwise identical with any combination (only time
 * changes). */
#ifndef FOURFOLD_LINEAR_H
#define FOURFOLD_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/comm.h"
#include "fourfold/gemm.h"
#include "fourfold/grid.h"
#include "fourfold/layerplan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FF_LINEAR_N = 0, FF_LINEAR_T } ff_linear_kind;

/* How the gathered block and the canonical matrix are stored. KN: W (k x n)
 * row-major, blocks W_rc row-major (the default). NK: W^T (n x k) row-major
 * and blocks W_rc^T row-major, as a token embedding (V x C) used as the tied
 * LM head (C -> V) is stored. */
typedef enum { FF_WEIGHT_KN = 0, FF_WEIGHT_NK } ff_weight_layout;

typedef struct {
    const char *name;    /* for errors, traces and reports (copied) */
    ff_linear_kind kind; /* N or T */
    int64_t k, n;        /* in and out features */
    int bias;            /* 1: the layer has a bias of n elements */
    ff_weight_layout layout;
    /* Optional output-column permutation (n entries, copied): the layer's
     * column j (in the order blocks are cut) is canonical column col_perm[j].
     * The QKV projection uses it to give each X rank whole heads. */
    const int64_t *col_perm;
    uint32_t rng_stream; /* the layer's identity in the RNG (ff_linear_init);
                            unique within a sequence */
} ff_linear_desc;

typedef struct {
    int oar;             /* post dI's all-reduce, compute dW, then wait (paper IV-A) */
    int ors;             /* wait on dW's reduce-scatter only when needed (IV-B) */
    int oag;             /* post the next use's all-gather during this one (IV-C) */
    int ag_cache_layers; /* keep the first forward's gathered weight until the backward
                            for this many layers, the last ones in forward order
                            (IV-D); -1: all */
    ff_gemm_tune tune;   /* GEMM mode tuning */
    ff_coll_opts coll;   /* wire and algorithm of the layer's collectives */
    int decompose;       /* row chunks of the dependent all-reduces (docs/linear.md,
                            "Decomposition"); 0 or 1: off, at most FF_DECOMPOSE_MAX */
    int cmm;             /* 1: the collective matmul (docs/linear.md): a layer whose
                            Z-shards are whole rows of its stored block computes its
                            forwards shard by shard, undecomposed, and one whose gather
                            was not prefetched (OAG off, or the run's first gather)
                            multiplies each shard as the ring all-gather (forced for
                            it) delivers it. Other BLAS calls: bounded, not bitwise */
    int rs_cmm;          /* 1: the reduce-scatter collective matmul (docs/linear.md):
                            a layer whose Z-shards are whole rows of its stored block
                            computes dW_rc at its last backward use of a run shard by
                            shard, in the order the ring reduce-scatter (forced for it)
                            reads them, each shard fed to the ring as it is done, so
                            the products overlap the reduce-scatter. The same messages
                            and bytes; bounded, not bitwise, against it off */
    int bf16;            /* 1: bf16-mixed products (docs/design.md §13): the
                            weights read (ff_linear_bind_bf16: the caller's 2-byte
                            bf16 copy) gathered on the bf16 wire;
                            inputs and output gradients are rounded to bf16 for the
                            products (fp32 accumulation); the outputs' and input
                            gradients' all-reduces on the bf16 wire, the gradients'
                            reduce-scatter and all-reduces (ff_linear_seq_allreduce_grads)
                            in fp32 whatever coll.wire says */
} ff_linear_opts;

enum { FF_DECOMPOSE_MAX = 64 };

/* The chunks decomposition cuts a product of `rows` rows into, computed in
 * panels of `panel` rows: whole panels, t = ceil(rows / panel) of them, at
 * most t chunks (1 for decompose < 2), chunk i the panels
 * [t i / chunks, t (i + 1) / chunks). Fills bounds[0..chunks] with row
 * offsets and returns the number of chunks (docs/linear.md,
 * "Decomposition"; the planner uses it too). */
int ff_decompose_bounds(int decompose, int64_t panel, int64_t rows,
                        int64_t bounds[FF_DECOMPOSE_MAX + 1]);

/* All overlaps on, AG cache for every layer, tuning of layouts, fp32 wire,
 * no decomposition. */
void ff_linear_opts_default(ff_linear_opts *o);

typedef struct ff_linear ff_linear;
typedef struct ff_linear_seq ff_linear_seq;

/* FF_USE_GRAD: a backward use by code other than the layer's product that
 * adds into the weight's gradient without reading the weight (the tied
 * embedding's lookup backward); it needs no gathered weight. */
typedef enum { FF_USE_FORWARD = 0, FF_USE_RECOMPUTE, FF_USE_BACKWARD, FF_USE_GRAD } ff_use_kind;
typedef struct {
    int layer; /* index in the order of ff_linear_add */
    ff_use_kind kind;
} ff_linear_use;

int ff_linear_seq_create(ff_grid *grid, const ff_linear_opts *opts, ff_linear_seq **out);
/* Waits for anything still in flight, frees buffers. */
void ff_linear_seq_destroy(ff_linear_seq *s);

/* Adds a layer. Refuses (FF_EDIVIDE, naming the layer and size) a shape the
 * grid does not divide: k by |R|, n by |C|, the block by Gz. */
int ff_linear_add(ff_linear_seq *s, const ff_linear_desc *desc, ff_linear **out);
ff_linear *ff_linear_seq_layer(const ff_linear_seq *s, int index);
int ff_linear_seq_count(const ff_linear_seq *s);

/* Local sizes: the weight shard (elements), the bias slice, the block
 * dimensions (rows x cols of W_rc) and the local input / output widths. */
typedef struct {
    size_t w_shard, bias;
    int64_t block_rows, block_cols; /* k/|R|, n/|C| */
    int64_t in_local, out_local;    /* = block_rows, block_cols */
} ff_linear_sizes;
ff_linear_sizes ff_linear_local_sizes(const ff_linear *l);
const char *ff_linear_name(const ff_linear *l);

/* One layer's own options (a per-layer plan, include/fourfold/layerplan.h),
 * replacing the sequence's for this layer: decomposition, OAR, ORS, OAG (its
 * all-gather posted during the previous use), AG cache (ag_cache 1 keeps the
 * first forward's gathered weight to the backward whatever ag_cache_layers
 * says) and wire (the algorithm stays the sequence's). Before the program is
 * set; FF_EINVAL for an option out of range. */
int ff_linear_set_options(ff_linear *l, const ff_layer_opts *o);
/* The options the layer runs with (the sequence's unless set; ag_cache is
 * the one set, else the program's choice, 0 before a program is set). */
void ff_linear_options(const ff_linear *l, ff_layer_opts *o);

/* Binds the parameter views: w_shard and dw_shard (sizes.w_shard floats), b
 * and db (sizes.bias floats; NULL without bias). dw/db may be NULL for
 * inference. */
void ff_linear_bind(ff_linear *l, float *w_shard, float *b, float *dw_shard, float *db);
/* After ff_linear_bind (bf16-mixed, docs/design.md §13): the shard's bf16
 * copy, 2 bytes a weight (sizes.w_shard of them), which the gathers and
 * products read instead of w_shard; w_shard stays what initialization
 * writes. NULL: w_shard again. */
void ff_linear_bind_bf16(ff_linear *l, const uint16_t *w_bf16);
/* After ff_linear_bind (SAMO, docs/samo.md): the weight gradient is kept
 * compressed, only at the shard's entries idx[k] - base (k < n, increasing),
 * in g[k]; no dense gradient shard. Each micro-batch's contribution is added
 * into g[k] with the same arithmetic the dense gradient's entry would see
 * (a reduce-scatter's result added; with Gz = 1 the product accumulating on
 * the expanded gradient), so the kept entries are bitwise those of dense
 * training. The layer's own data-parallel all-reduce
 * (ff_linear_seq_allreduce_grads) leaves a compressed gradient alone. */
void ff_linear_bind_sparse(ff_linear *l, const uint32_t *idx, size_t n, uint32_t base, float *g);

/* The program of weight uses for one micro-batch (copied). A layer's
 * backward must follow its forward where the program has both; a program
 * may hold only backward uses of a layer (a pipeline stage runs the forward
 * and the backward of a micro-batch as two runs). */
int ff_linear_seq_set_program(ff_linear_seq *s, const ff_linear_use *uses, int n);
/* The usual program: forward in order of addition, backward in reverse. With
 * block_layers > 0, activation checkpointing in blocks of that many layers:
 * each block is recomputed just before its backward. */
int ff_linear_seq_program_standard(ff_linear_seq *s, int block_layers);

/* Starts one run of the program (a micro-batch): posts the first all-gather
 * (when OAG is on).
 *
 * Errors after a run has begun (out of memory, an MPI failure) are local to a
 * rank whose peers may then wait in a collective: report and abort, as for
 * any collective (comm.h). */
int ff_linear_seq_begin(ff_linear_seq *s);

/* inp (rows, k/|R|) in the input layout -> out (rows, n/|C|), overwritten.
 * Must be the program's next use (a forward or recompute of this layer). */
int ff_linear_forward(ff_linear *l, float *out, const float *inp, int64_t rows);
/* The same, calling done(arg, row0, n) for each range of finished output
 * rows in order as soon as it is complete (all-reduced and biased): with
 * decomposition into k chunks, k calls, each while the next chunks'
 * all-reduces are in flight; without, one call for all rows. Row-wise work
 * that consumes the output (an activation, a residual) runs there. */
typedef void (*ff_linear_rows_fn)(void *arg, int64_t row0, int64_t n);
int ff_linear_forward_rows(ff_linear *l, float *out, const float *inp, int64_t rows,
                           ff_linear_rows_fn done, void *arg);
/* dout (rows, n/|C|), inp (rows, k/|R|) as given to the forward -> dinp
 * (rows, k/|R|) overwritten (NULL: not needed); dw_shard and db accumulate
 * (+=), so micro-batches add up. Must be the program's next use. */
int ff_linear_backward(ff_linear *l, float *dinp, const float *dout, const float *inp,
                       int64_t rows);
/* bf16-mixed (opts.bf16; docs/design.md §13): an input that only the
 * products read kept in 2 bytes. ff_linear_forward_keep is
 * ff_linear_forward_rows that also stores its input's bf16 values in keep
 * (rows x k/|R|, 2 bytes each), which the products then read;
 * ff_linear_backward_bf16 is ff_linear_backward reading its input from
 * there. The same bits as the fp32 input rounded by the layer. */
int ff_linear_forward_keep(ff_linear *l, float *out, const float *inp, uint16_t *keep, int64_t rows,
                           ff_linear_rows_fn done, void *arg);
int ff_linear_backward_bf16(ff_linear *l, float *dinp, const float *dout, const uint16_t *inp16,
                            int64_t rows);

/* A use of the layer's weight by code other than its product (the tied
 * embedding's lookup, which reads the LM head's wte block). The program's
 * next use must be this layer's forward or recompute: *w_block is then the
 * gathered block W_rc in the layer's storage (W_rc^T for NK), and *dw_block
 * NULL; or its FF_USE_GRAD: *w_block is NULL and *dw_block the block's
 * gradient of this run, stored like the block, to add into (zeroed at the
 * run's first contribution). ff_linear_use_end finishes the use (after the
 * layer's last backward use, it posts the gradient's reduce-scatter). */
int ff_linear_use_begin(ff_linear *l, const float **w_block, float **dw_block);
/* The same, except that with Gz = 1 and a bf16 copy bound
 * (ff_linear_bind_bf16) a weight use gets that 2-byte block itself in
 * *w16_block (and *w_block NULL) instead of a widened one; else *w16_block
 * is NULL. */
int ff_linear_use_begin_bf16(ff_linear *l, const uint16_t **w16_block, const float **w_block,
                             float **dw_block);
int ff_linear_use_end(ff_linear *l);

/* Ends the run: checks that every use of the program was made and releases
 * gathered weights. Reduce-scatters stay in flight (ORS): a layer's result is
 * added into dw_shard when the gradient is needed, or before the same layer's
 * next reduce-scatter (the next micro-batch), so additions keep their order. */
int ff_linear_seq_end(ff_linear_seq *s);
/* Waits for one layer's / every layer's reduce-scatter and adds the result
 * into dw_shard: call before reading dw_shard (optimizer, data-parallel
 * all-reduce, a gather). */
int ff_linear_wait_grad(ff_linear *l);
int ff_linear_seq_wait_grads(ff_linear_seq *s);

/* After the last micro-batch: ff_linear_seq_wait_grads, then dW_shard =
 * AllReduce_D(dW_shard) and db = AllReduce_ZD(db) for every layer (data
 * parallelism; a model with its own bucketing does this itself). */
int ff_linear_seq_allreduce_grads(ff_linear_seq *s);

/* Forwards run as collective matmuls (ff_linear_opts.cmm) since creation. */
long ff_linear_seq_cmm_uses(const ff_linear_seq *s);
/* Called before a layer's weight shard (the bound w_shard, n floats, and
 * its bound 2-byte copy w_bf16, either NULL where not bound) is read for a
 * use: its all-gather over Z is posted, or, with Gz = 1, the product reads
 * it. ZeRO over D (src/nn/gpt_zero.c) waits there for the post-AdamW
 * gather of that shard still in flight. A nonzero return fails the use.
 * NULL: none. */
typedef int (*ff_linear_weight_fn)(void *arg, const float *w_shard, const uint16_t *w_bf16,
                                   size_t n);
void ff_linear_seq_set_weight_hook(ff_linear_seq *s, ff_linear_weight_fn fn, void *arg);
/* Weight gradients computed by the reduce-scatter collective matmul
 * (ff_linear_opts.rs_cmm, ff_layer_opts.rs_cmm) since creation. */
long ff_linear_seq_rs_cmm_uses(const ff_linear_seq *s);
/* Bytes of gathered weights, gradient blocks and reduce-scatter outputs held
 * by the sequence now, and at most since creation. */
void ff_linear_seq_memory(const ff_linear_seq *s, size_t *current, size_t *peak);
/* Bytes of those buffers as allocated now: the ones in use and the ones
 * kept for reuse (a freed buffer stays in the sequence's pool, and serves
 * any request up to its size: this is what the process holds for them). */
size_t ff_linear_seq_held(const ff_linear_seq *s);
/* The gathers the program makes per run and how many uses the cache saved. */
void ff_linear_seq_gather_stats(const ff_linear_seq *s, int *gathers, int *reused);
ff_gemm *ff_linear_seq_gemm(ff_linear_seq *s);

/* ---- canonical layout ------------------------------------------------------
 * A canonical matrix is the whole W as a serial program or a file holds it:
 * k x n row-major (KN) or n x k row-major (NK); the bias has n elements, in
 * canonical column order. */

/* Scatters from `root` (a rank of the layer's pipeline stage: its rank in
 * FF_GROUP_STAGE, the world rank without stages): every rank of the stage
 * receives its shard of w_canon into w_shard and, for a layer with a bias,
 * its slice of b_canon into b (then both are required). w_canon and b_canon
 * are read on root only. Collective over the stage; arguments are agreed
 * on first, so a bad one fails on every rank of it. */
int ff_linear_scatter(ff_linear *l, const float *w_canon, const float *b_canon, float *w_shard,
                      float *b, int root);
/* Gathers shard-shaped data (weights, gradients, optimizer moments) from the
 * ranks that own it (d = 0) into canonical layout on `root`. */
int ff_linear_gather(ff_linear *l, const float *w_shard, const float *b, float *w_canon,
                     float *b_canon, int root);
/* The same for a layer replicated over D in ge slots (expert parallelism,
 * docs/moe.md): the ranks with d mod ge == slot hold the layer, the others
 * another of the same shape (`l` stands for the shape there). A gather
 * takes the first replica's shards (d == slot); a scatter fills every
 * replica's. ge 1 and slot 0 are the two functions above. */
int ff_linear_scatter_slot(ff_linear *l, const float *w_canon, const float *b_canon, float *w_shard,
                           float *b, int root, int ge, int slot);
int ff_linear_gather_slot(ff_linear *l, const float *w_shard, const float *b, float *w_canon,
                          float *b_canon, int root, int slot);
/* Fills the bound weight shard with N(0, std^2) values that depend only on
 * (seed, desc.rng_stream, canonical index), and the bias with zeros. No rank
 * materializes more than its shard. */
int ff_linear_init(ff_linear *l, uint64_t seed, float std);
/* The canonical index (into w_canon) of element e of this rank's weight
 * shard, and of element j of its bias slice. */
int64_t ff_linear_canonical_index(const ff_linear *l, size_t e);
int64_t ff_linear_canonical_bias_index(const ff_linear *l, size_t j);

#ifdef __cplusplus
}
#endif
#endif
