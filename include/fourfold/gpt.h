/* The GPT-2 model in 4D (docs/design.md §4): every parameter and activation laid out
 * over the grid, forward and backward on the rank's shards, AdamW on them,
 * and the canonical (llm.c gpt2_*.bin v3) layout for files and tests.
 *
 * One block, residual stream h in layout Y (rows of the rank's sequences,
 * columns C/Gy):
 *
 *   LayerNorm 1 (row statistics AllReduce_Y) -> QKV (N layer, whole heads per
 *   X rank) -> causal attention of the rank's NH/Gx heads (local) ->
 *   projection (T layer) -> residual -> LayerNorm 2 -> MLP up (N) -> GELU ->
 *   MLP down (T) -> residual.
 *
 * The token embedding wte (Vp x C) is one linear layer (NK storage, kind N,
 * C -> Vp) with four uses per micro-batch: the lookup (vocab-parallel over X,
 * then AllReduce_X), the tied LM head's forward and backward, and the
 * lookup's gradient. Cross-entropy is vocab-parallel over X.
 *
 * Parameters live in one flat buffer per rank: first the Z-sharded weights
 * (wte, then each block's four weight shards, contiguous per block: the
 * data-parallel buckets), then everything else (positions, LayerNorms,
 * biases: split over X or Y, replicated over Z and D, gradients all-reduced
 * over ZD in one call). Gradients and AdamW moments mirror it. */
#ifndef FOURFOLD_GPT_H
#define FOURFOLD_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "fourfold/grid.h"
#include "fourfold/linear.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int L;    /* blocks */
    int C;    /* channels */
    int NH;   /* heads */
    int V;    /* vocabulary */
    int Vp;   /* padded vocabulary; 0: V rounded up to a multiple of 128 (llm.c) */
    int maxT; /* positions */
    /* Mixture of experts (docs/moe.md; experts 0: a dense model, the rest
     * ignored). Block l's MLP is E experts, each an MLP of the dense shape,
     * where (l + 1) % expert_every == 0, behind a router C -> E (softmax)
     * that sends each token to its top_k (1 or 2) experts; an expert takes at
     * most ceil(capacity_factor top_k T / E) tokens of a sequence, the rest
     * are dropped (the residual carries them). aux_coef weighs the Switch
     * Transformer's load-balancing loss, added to the loss of each MoE block. */
    int experts, expert_every, top_k;
    float capacity_factor, aux_coef;
} ff_gpt_config;

/* Sets the MoE fields to E experts in every second block, top-1, capacity
 * factor 1.25 and aux_coef 0.01 (Switch Transformer's defaults); E 0: dense. */
void ff_gpt_config_moe(ff_gpt_config *c, int E);
/* 1 if block l of the model is a mixture of experts. */
int ff_gpt_block_is_moe(const ff_gpt_config *c, int l);

/* Pipeline stages (docs/pipeline.md): the grid's stages (ff_grid_create_staged)
 * each hold a contiguous range of blocks, the first also the embedding, the
 * last the final LayerNorm, the tied LM head and the loss. A step's
 * micro-batches flow through them in one of two schedules. An error inside
 * a pipelined step (a failed message) is printed by the rank it happened on,
 * which then aborts the job (MPI_Abort): the other stages would otherwise
 * wait for its messages forever. */
typedef enum {
    FF_PIPE_MESSAGE = 0, /* AxoNN's message-driven schedule (dissertation Alg. 2):
                            each stage runs the forward or the backward whose
                            input arrived */
    FF_PIPE_1F1B         /* the fixed one-forward-one-backward schedule */
} ff_pipe_schedule;

typedef struct {
    ff_pipe_schedule schedule;
    int limit;               /* micro-batches in flight per stage; 0: the stages */
    const int *stage_layers; /* blocks of each stage (stages entries, sum L);
                                NULL: as even as possible, earlier stages
                                taking the remainder (the last has the head) */
    /* for measurements: stage slow_stage (-1: none) sleeps slow_s seconds
     * after each forward and each backward of a micro-batch (a straggler),
     * and every stage sleeps pass_s (compute emulated by sleeping, so that
     * more stages than cores keep their own timing) */
    int slow_stage;
    double slow_s, pass_s;
    /* 1: the straggler's delay varies, uniform in [0, 2 slow_s] per pass (a
     * fixed pseudo-random sequence), as a noisy neighbour's would */
    int slow_jitter;
} ff_pipe_opts;

/* The arithmetic of a run (docs/design.md §13). FF_PRECISION_BF16_MIXED:
 * fp32 master weights, gradients and AdamW moments; the matrix products
 * with weights take bf16 operands (the weights' bf16 copy, made after each
 * change of the master, and their inputs and output gradients rounded to
 * bf16) and accumulate in fp32; the weights are gathered and the
 * activations all-reduced on the bf16 wire, the gradients reduced in fp32;
 * everything else in fp32. */
typedef enum { FF_PRECISION_FP32 = 0, FF_PRECISION_BF16_MIXED } ff_precision;
/* "fp32", "bf16-mixed"; NULL for a value out of range. */
const char *ff_precision_name(ff_precision p);
/* Parses a name of ff_precision_name; FF_EINVAL for any other word. */
int ff_precision_parse(const char *s, ff_precision *out);
/* The choices, for messages: "fp32 or bf16-mixed". */
#define FF_PRECISION_CHOICES "fp32 or bf16-mixed"

/* How bf16-mixed precision runs its products (docs/design.md §13, "The
 * products"): EMULATED, the bf16 operands widened to fp32 and multiplied by
 * the BLAS (exact products, fp32 sums); ONEDNN, oneDNN's bf16 matmul (the
 * CPU's bf16 dot products where it has them; fp32 accumulation; a build
 * with oneDNN only); AUTO (the default), the faster of the two on this
 * machine, timed on the model's MLP product when the model is created,
 * oneDNN only where every rank found it faster. Either gives the same
 * values within fp32 summation error; runs are reproducible with either. */
typedef enum {
    FF_BF16_PRODUCTS_AUTO = 0,
    FF_BF16_PRODUCTS_EMULATED,
    FF_BF16_PRODUCTS_ONEDNN
} ff_bf16_products;
/* "auto", "emulated", "onednn"; NULL for a value out of range. */
const char *ff_bf16_products_name(ff_bf16_products p);
/* Parses a name of ff_bf16_products_name; FF_EINVAL for any other word. */
int ff_bf16_products_parse(const char *s, ff_bf16_products *out);
#define FF_BF16_PRODUCTS_CHOICES "auto, emulated or onednn"

typedef struct {
    ff_precision precision;         /* default fp32 */
    ff_bf16_products bf16_products; /* bf16-mixed's products (default auto) */
    int checkpoint;                 /* activation checkpointing: keep each block's input,
                                       recompute the block before its backward */
    int cac;                        /* communication-aware checkpointing (dissertation §7.3.2;
                                       default off): a checkpointed block also keeps what its
                                       collectives produced (LayerNorm statistics, QKV, the
                                       residual after attention, the MLP's or experts'
                                       all-reduced and all-to-all outputs) and its recompute
                                       runs only the local work between them, with no
                                       collective; bitwise the same results */
    int dp_overlap;                 /* post the D all-reduce of a block's gradients during the
                                       backward, as soon as they are complete (one bucket per block) */
    ff_linear_opts linear; /* overlaps of the linear layers, AG cache, wire, decomposition */
    /* A per-layer plan (include/fourfold/layerplan.h; NULL: none): each
     * block's checkpointing and each linear layer's options replace
     * `checkpoint` and the layers' `linear` settings (the algorithm, tuning
     * and dp_overlap stay), and its panel_rows, if set, the GEMM panels.
     * Read at ff_gpt_create, which refuses, on every rank with one message,
     * a plan for another model or grid. */
    const ff_layer_plan *plan;
    ff_pipe_opts pipe; /* used when the grid has stages */
    /* Expert parallelism (docs/moe.md; 0 or 1: none): Ge ranks of D share a
     * mixture of experts' experts, E/Ge each, tokens sent to their experts
     * and back by all-to-all; Ge divides Gd and E. */
    int expert_parallel;
    /* Duplicate token dropping (DTD, dissertation §7.3.1; default on): with
     * expert parallelism and Gx > 1, each X rank sends 1/Gx of the tokens
     * through each all-to-all and the X group all-gathers them. Results are
     * bitwise the same either way. */
    int dtd;
    /* Balanced routing (default off; for benchmarks and the planner's
     * validation, like Megatron-LM's forced load balancing): the router
     * still runs and its probabilities still weigh the experts' outputs
     * (and get gradients), but assignment j of the token at position t of
     * its sequence goes to expert (t k + j) mod E, so every expert receives
     * the same number of tokens of each sequence (when E divides k T), as
     * the planner assumes (docs/moe.md). */
    int balanced_routing;
    /* ZeRO over the data-parallel ranks (docs/design.md; default 0): 1
     * shards AdamW's moments of the Z-sharded weights over D (their
     * gradients reduce-scattered over D instead of all-reduced, AdamW on
     * the rank's slice, the parameters all-gathered back), 2 also releases
     * the gradients outside the rank's slice after the reduce-scatter.
     * Results bitwise those of 0 when D's all-reduce runs the ring; with
     * stages and experts too (the experts' buckets over EDP). Not yet with
     * masks or SAMO, a GPU, the bf16 wire, a forced algorithm other than
     * the ring: refused. Nothing to shard with Gd = 1 (the same as 0). */
    int zero;
} ff_gpt_opts;

void ff_gpt_opts_default(ff_gpt_opts *o);

/* AdamW, gradient clipping and the learning-rate schedule. */
typedef struct {
    float lr, min_lr_frac; /* peak rate; the cosine decays to lr * min_lr_frac */
    int warmup, steps;     /* linear warm-up steps; total steps of the schedule */
    float beta1, beta2, eps, weight_decay;
    float clip; /* global gradient-norm clipping; 0: none */
} ff_adamw;

/* lr 3e-4, min 0.1, warmup 0, steps 1, betas (0.9, 0.95), eps 1e-8, decay 0.1, clip 1. */
void ff_adamw_default(ff_adamw *h);
/* The rate of 0-based step `step`: linear warm-up to lr over `warmup` steps,
 * then cosine decay to lr * min_lr_frac at `steps`. */
float ff_adamw_lr(const ff_adamw *h, int step);

typedef struct ff_gpt ff_gpt;

/* Creates the model for micro-batches of B sequences of T tokens (the whole
 * grid's micro-batch; each (z, d) pair holds B/(Gz*Gd) of them). Refuses, on
 * every rank with one message, a shape the grid does not divide. Parameters
 * are zero until ff_gpt_init or a load. */
int ff_gpt_create(ff_grid *grid, const ff_gpt_config *cfg, const ff_gpt_opts *opts, int B, int T,
                  ff_gpt **out);
void ff_gpt_destroy(ff_gpt *g);
ff_gpt_config ff_gpt_get_config(const ff_gpt *g);
ff_ctx *ff_gpt_ctx(const ff_gpt *g); /* the grid's context (errors) */

/* The sequences of a micro-batch this rank reads: [*first, *first + *count). */
void ff_gpt_local_sequences(const ff_gpt *g, int *first, int *count);

/* GPT-2's initialization (OpenAI's model.py) from the grid-independent RNG:
 * wte and linear weights N(0, 0.02), the two residual projections
 * N(0, 0.02/sqrt(2L)), wpe N(0, 0.01), LayerNorm gains 1, biases 0, padded
 * vocabulary rows zero. Identical parameters on every grid. */
int ff_gpt_init(ff_gpt *g, uint64_t seed);

/* ---- training ---------------------------------------------------------------- */

int ff_gpt_zero_grad(ff_gpt *g);
/* One micro-batch (index `micro` of `n_micro`): forward, loss, backward;
 * gradients of the mean loss over all n_micro * B * T tokens accumulate.
 * tokens and targets: this rank's sequences (ff_gpt_local_sequences), T
 * each, row-major. Without pipeline stages only (FF_EUNSUPPORTED with
 * them: a pipeline runs a step's micro-batches together, ff_gpt_grads). */
int ff_gpt_forward_backward(ff_gpt *g, const int32_t *tokens, const int32_t *targets, int micro,
                            int n_micro);
/* After the last micro-batch: completes the gradients (reduce-scatters,
 * data-parallel and ZD all-reduces) and returns the mean loss of the step,
 * the same on every rank. */
int ff_gpt_finish_grads(ff_gpt *g, float *loss);
/* The gradients of a step: zero, the n_micro micro-batches (laid out as for
 * ff_gpt_step; through the pipeline schedule with stages), finish; the mean
 * loss into *loss. */
int ff_gpt_grads(ff_gpt *g, const int32_t *tokens, const int32_t *targets, int n_micro,
                 float *loss);
/* The global gradient norm, each parameter counted once. */
int ff_gpt_grad_norm(ff_gpt *g, float *norm);
/* AdamW update of the local shards (step: 0-based), gradients scaled by
 * grad_scale (clipping) first; with a mask the pruned parameters are then
 * set to zero again, and in bf16-mixed the bf16 copy is made. */
int ff_gpt_adamw_update(ff_gpt *g, const ff_adamw *h, int step, float grad_scale);

typedef struct {
    float loss, grad_norm, lr;
    /* MoE models (0 otherwise): the load-balancing loss (summed over the MoE
     * blocks, mean over the micro-batches; the gradient includes it, `loss`
     * does not) and the fraction of token-expert assignments dropped */
    float aux_loss, dropped;
} ff_gpt_step_info;
/* The aux_loss and dropped of the micro-batches since the last
 * ff_gpt_zero_grad (or, after ff_gpt_eval, of its forward), the same on
 * every rank once ff_gpt_finish_grads or ff_gpt_eval returned. */
void ff_gpt_moe_stats(const ff_gpt *g, float *aux_loss, float *dropped);
/* The routing of MoE block l (counted over the whole model) in the last
 * forward that ran it on this rank (ff_gpt_forward_backward's micro-batch,
 * ff_gpt_eval's batch), for each of the rank's m tokens
 * (ff_gpt_local_sequences' sequences in order, T tokens each):
 *  - choice (m top_k): its experts in order of choice, e where the
 *    assignment was kept and ~e (that is -1 - e) where capacity dropped it;
 *  - probs (m E, may be NULL): the router's probabilities (the softmax,
 *    float), on which the choice was made (docs/moe.md, "Routing across
 *    grids").
 * The ranks of an X and a Y group return the same. FF_EINVAL if block l is
 * not an MoE block of this rank's pipeline stage, or if its activations are
 * not its own: checkpointed without CAC (MoE blocks then share one set),
 * or with pipeline stages (a set per micro-batch in flight). */
int ff_gpt_moe_routing(const ff_gpt *g, int l, int *choice, float *probs);
/* The expert group of a mixture of experts with expert parallelism (its
 * all-to-alls, counted like the grid's groups' collectives:
 * ff_group_counters; NULL without expert parallelism), or with replicas 1
 * the experts' replicas (their gradients' all-reduces; D without expert
 * parallelism). NULL for a dense model. */
ff_group *ff_gpt_expert_group(const ff_gpt *g, int replicas);
/* A whole step: zero, n_micro micro-batches (tokens/targets hold this
 * rank's sequences of micro-batch u at offset u * count * T), finish,
 * clip, AdamW. A NaN or Inf loss or norm stops before the update with
 * FF_ENUMERIC (parameters untouched; the message names the step counting
 * from 1, as `fourfold train` prints steps). */
int ff_gpt_step(ff_gpt *g, const int32_t *tokens, const int32_t *targets, int n_micro,
                const ff_adamw *h, int step, ff_gpt_step_info *info);
/* Waits for what a step leaves in flight: under ZeRO over D (ff_gpt_opts.zero)
 * the gathers of the updated parameters, which otherwise run beside the
 * next forward (each waited for before its weights are read; anything
 * else that reads the parameters, ff_gpt_gather, a save, the next AdamW,
 * waits for all first). For counting a step's bytes alone (the counters
 * count a collective's bytes as its messages are posted). FF_OK at once
 * without ZeRO. */
int ff_gpt_sync(ff_gpt *g);
/* Forward only (no gradients): the mean loss over the micro-batch. */
int ff_gpt_eval(ff_gpt *g, const int32_t *tokens, const int32_t *targets, float *loss);
/* The rank's logits of the last forward: (count*T, Vp/Gx), vocabulary block
 * x of the padded vocabulary. Valid after ff_gpt_eval; with stages, on the
 * last stage only (NULL elsewhere). */
const float *ff_gpt_logits(const ff_gpt *g, int64_t *rows, int64_t *cols);

/* ---- canonical layout (llm.c gpt2_*.bin v3, fp32) -------------------------------
 * Tensors in llm.c's order: wte (Vp,C), wpe (maxT,C), ln1w (L,C), ln1b,
 * qkvw (L,3C,C), qkvb (L,3C), attprojw (L,C,C), attprojb, ln2w, ln2b,
 * fcw (L,4C,C), fcb (L,4C), fcprojw (L,C,4C), fcprojb (L,C), lnfw (C), lnfb.
 * A mixture-of-experts model (docs/moe.md) has Ld dense and Lm MoE blocks:
 * fcw, fcb, fcprojw, fcprojb hold the Ld dense blocks only, and five tensors
 * follow, each over the MoE blocks in order, experts one after another:
 * routerw (Lm,E,C), efcw (Lm,E,4C,C), efcb (Lm,E,4C), efcprojw (Lm,E,C,4C),
 * efcprojb (Lm,E,C). A dense model's are empty: its layout is llm.c's. */

enum { FF_GPT_NTENSORS = 21 };
const char *ff_gpt_tensor_name(int i);
/* Elements of canonical tensor i and of the whole canonical model. */
size_t ff_gpt_tensor_size(const ff_gpt *g, int i);
size_t ff_gpt_canonical_size(const ff_gpt *g);

/* FF_GPT_MASK: the pruning mask of masked training (fourfold/prune.h), 1.0
 * kept and 0.0 pruned, once ff_gpt_set_mask has made it. */
typedef enum {
    FF_GPT_PARAMS = 0,
    FF_GPT_GRADS,
    FF_GPT_ADAM_M,
    FF_GPT_ADAM_V,
    FF_GPT_MASK
} ff_gpt_buffer;
/* Gathers a flat buffer to canonical layout (ff_gpt_canonical_size floats,
 * tensors concatenated in order) on `root` (a world rank). Collective over
 * the world; with stages, the rank of each stage with root's grid
 * coordinates holds a canonical buffer for a moment. */
int ff_gpt_gather(ff_gpt *g, ff_gpt_buffer which, float *canon, int root);
/* Scatters canonical values from root into the flat buffer. */
int ff_gpt_scatter(ff_gpt *g, ff_gpt_buffer which, const float *canon, int root);

/* llm.c's 256-int32 header: magic 20240326, version 3, maxT, V, L, NH, C, Vp;
 * fourfold's files add a CRC-32 of header and parameters in two slots llm.c leaves
 * zero and ignores. */
enum { FF_GPT_SLOT_CRC_TAG = 252, FF_GPT_SLOT_CRC = 253, FF_GPT_CRC_TAG = 0x46463031 /* "FF01" */ };
/* A mixture-of-experts model's file (docs/moe.md) has its own magic and
 * version 1 (llm.c refuses it), the same slots 2-7, then experts,
 * expert_every, top_k, and capacity_factor and aux_coef as float bits in
 * slots 8-12; the canonical layout above; the CRC as for v3. */
enum { FF_GPT_MAGIC_MOE = 20261125 };
void ff_gpt_header(const ff_gpt *g, int32_t header[256]);
/* Writes the parameters (or another buffer of the same shape, e.g. the
 * gradients) as a v3 file: written by rank 0 to a temporary file, fsync,
 * rename. A CRC-32 of the header (CRC slot zero) and the parameters goes
 * in free header slots 252-253 (tag "FF01", then the CRC), which llm.c
 * ignores; ff_gpt_load verifies it when the tag is there. Collective. */
int ff_gpt_save(ff_gpt *g, ff_gpt_buffer which, const char *path);
/* The model shape in a v3 or MoE file's header (read on rank 0, broadcast).
 * Collective over the context; the outcome agrees on every rank. */
int ff_gpt_read_config(ff_ctx *ctx, const char *path, ff_gpt_config *cfg);
/* Loads a v3 fp32 file written by fourfold or llm.c, or fourfold's MoE
 * file: header checked against the model (a different shape, a dense file
 * for an MoE model or the reverse, is refused naming the field; top_k,
 * capacity_factor and aux_coef may differ), size checked.
 * Collective; the outcome agrees on every rank. */
int ff_gpt_load(ff_gpt *g, const char *path);

/* ---- memory and parameters --------------------------------------------------- */

typedef struct {
    size_t params, grads, adam; /* bytes of the flat buffers on this rank (under
                                   SAMO grads and adam hold the compressed ones too;
                                   bf16-mixed: params also the weights' 2-byte copy) */
    /* a pruned model's (fourfold/prune.h): masked training's mask (4 bytes
     * a parameter) and packed all-reduce (8 a packed entry), or SAMO's
     * offsets of the kept weights (4 each); 0 without a mask */
    size_t mask;
    size_t activations; /* bytes kept for the backward of one micro-batch */
    size_t scratch;     /* backward and cross-entropy work space */
    size_t linear_peak; /* gathered weights and gradient blocks, at most in use */
    /* Allocated now (0 before the first pass; they grow to what the passes
     * asked for and are kept): the layers' pool of gathered weights,
     * gradient blocks and bf16-rounded operands, in use and kept for reuse
     * (ff_linear_seq_held, >= linear_peak), and the GEMMs' transposes and
     * 2-byte operands (ff_gemm_scratch_bytes). With the fields above, what
     * the model holds: ff_gpt_memory_total. */
    size_t linear_held, gemm_scratch;
} ff_gpt_memory;
/* Every byte ff_gpt_memory counts as held: the model state, the
 * activations, the scratch, the layers' pool and the GEMMs' scratch (not
 * linear_peak, which linear_held covers). */
size_t ff_gpt_memory_total(const ff_gpt_memory *m);
void ff_gpt_memory_report(const ff_gpt *g, ff_gpt_memory *m);
/* bf16-mixed: the products the model runs (EMULATED or ONEDNN; AUTO in
 * fp32) and the rates (FLOP/s, this rank's) that chose them: 0 where not
 * timed (an option that named the path, or a build without oneDNN). */
ff_bf16_products ff_gpt_bf16_products(const ff_gpt *g, double *onednn_flops, double *blas_flops);
/* The default split of L blocks over P stages: L/P each, the first L%P
 * stages one more (the last stage also has the LM head). */
void ff_pipe_split(int L, int P, int *blocks);
/* This rank's time in pipelined steps since the model was created (zeros
 * without stages): busy_s in its stage's forward and backward passes, idle_s
 * waiting for its neighbours' messages inside the schedule (the bubble, and
 * transfers the passes did not hide). A stage's bubble over a step is
 * 1 - busy / step time. */
typedef struct {
    double busy_s, idle_s;
} ff_pipe_times;
void ff_gpt_pipeline_times(const ff_gpt *g, ff_pipe_times *t);
/* The passes of this rank's stage in the last pipelined step, in the order
 * they ran: u for micro-batch u's forward, -(u + 1) for its backward (the
 * first FF_GPT_PIPE_ORDER_MAX). Returns their count, copies at most max. */
enum { FF_GPT_PIPE_ORDER_MAX = 512 };
int ff_gpt_pipeline_order(const ff_gpt *g, int *order, int max);
/* The blocks [*first, *first + *count) this rank's stage holds. */
void ff_gpt_stage_blocks(const ff_gpt *g, int *first, int *count);
/* Parameters of the canonical model without the padded vocabulary rows. */
int64_t ff_gpt_num_params(const ff_gpt *g);
/* Model FLOPs of one token's forward and backward: 6 N (N without the
 * positions; in a mixture of experts the parameters a token uses: top_k of
 * each MoE block's experts) plus attention, 12 L C T for QK^T and AV
 * forward and backward (the causal half not taken off), as the PaLM paper
 * and nanoGPT count. */
double ff_gpt_flops_per_token(const ff_gpt *g, int T);
/* Causal attention runs in blocks of this many query rows, each against the
 * keys up to its last row (docs/gpt.md): (n + 1) / 2n of the T x T products
 * for n blocks. The planner counts the same. */
enum { FF_ATTENTION_ROWS = 64 };
ff_linear_seq *ff_gpt_linear_seq(ff_gpt *g);

#ifdef __cplusplus
}
#endif
#endif
