/* The GPT's canonical layout (llm.c gpt2_*.bin v3): gathering shards to it,
 * scattering from it, the file format; and the model's size reports. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device.h"
#include "gpt_internal.h"
#include "util/crc32.h"
#include "util/file.h"

enum { MAGIC = 20240326, VERSION_FP32 = 3, VERSION_BF16 = 5, HEADER_INTS = 256 };
/* fourfold's format for mixture-of-experts models (docs/moe.md), which llm.c's
 * v3 has no room for: the same header and canonical layout with its own
 * magic and version, slots 8-12 the MoE fields (experts, expert_every,
 * top_k, then capacity_factor and aux_coef as float bits), the CRC as in v3. */
enum { MAGIC_MOE = FF_GPT_MAGIC_MOE, VERSION_MOE = 1 };
/* llm.c reads header slots 0-7 and writes zeros in the rest; fourfold keeps
 * a CRC-32 of header and parameters in two of the free slots, so its files still
 * load in llm.c, and a file that carries the tag is verified when read
 * (llm.c's own files, without it, are checked for size only). */
enum { SLOT_CRC_TAG = FF_GPT_SLOT_CRC_TAG, SLOT_CRC = FF_GPT_SLOT_CRC, CRC_TAG = FF_GPT_CRC_TAG };

/* The CRC of a file: its header (with the CRC slot zero, the tag set) and
 * then the parameters, so a corrupt shape field is caught too. */
static uint32_t file_crc(const int32_t *header, const float *canon, size_t n)
{
    int32_t h[HEADER_INTS];
    memcpy(h, header, sizeof h);
    h[SLOT_CRC] = 0;
    return ff_crc32(ff_crc32(0, h, sizeof h), canon, n * sizeof(float));
}

static const char *const tensor_names[FF_GPT_NTENSORS] = {
    "wte",      "wpe",  "ln1w",    "ln1b", "qkvw", "qkvb",     "attprojw",
    "attprojb", "ln2w", "ln2b",    "fcw",  "fcb",  "fcprojw",  "fcprojb",
    "lnfw",     "lnfb", "routerw", "efcw", "efcb", "efcprojw", "efcprojb"};

/* MoE blocks among the first l blocks of the model. */
static int moe_before(const ff_gpt_config *c, int l)
{
    return c->experts > 0 ? l / c->expert_every : 0;
}

/* The entries of canonical tensor i (one per block, dense block, expert or
 * none) and the entry of model block gl's (for an expert tensor: expert 0's). */
static size_t cfg_tensor_entries(const ff_gpt_config *c, int i)
{
    const size_t L = (size_t)c->L, Lm = (size_t)moe_before(c, c->L);
    if (i >= 2 && i <= 9)
        return L;
    if (i >= 10 && i <= 13)
        return L - Lm;
    if (i == 16)
        return Lm;
    return i > 16 ? Lm * (size_t)c->experts : 1;
}

static size_t tensor_entries(const ff_gpt *g, int i) { return cfg_tensor_entries(&g->cfg, i); }

static size_t tensor_entry_of(const ff_gpt *g, int i, int gl)
{
    const int mb = moe_before(&g->cfg, gl);
    if (i >= 10 && i <= 13)
        return (size_t)(gl - mb);
    if (i >= 16)
        return (size_t)mb * (i == 16 ? 1 : (size_t)g->cfg.experts);
    return (size_t)gl;
}

const char *ff_gpt_tensor_name(int i)
{
    return i >= 0 && i < FF_GPT_NTENSORS ? tensor_names[i] : "?";
}

/* Elements of one entry of canonical tensor i. */
static size_t cfg_entry_size(const ff_gpt_config *c, int i)
{
    const size_t C = (size_t)c->C;
    switch (i) {
    case 0: return (size_t)c->Vp * C;
    case 1: return (size_t)c->maxT * C;
    case 4: return 3 * C * C;
    case 5: return 3 * C;
    case 6: return C * C;
    case 10:
    case 12:
    case 17:
    case 19: return 4 * C * C;
    case 11:
    case 18: return 4 * C;
    case 16: return (size_t)c->experts * C;
    default: return i >= 0 && i < FF_GPT_NTENSORS ? C : 0;
    }
}

static size_t entry_size(const ff_gpt *g, int i) { return cfg_entry_size(&g->cfg, i); }

/* The canonical floats of a model of this shape, in double (no overflow for
 * any header's values: a checkpoint's header is checked with it before
 * anything of that size is allocated). */
static double cfg_canonical_floats(const ff_gpt_config *c)
{
    double n = 0;
    for (int i = 0; i < FF_GPT_NTENSORS; i++)
        n += (double)cfg_tensor_entries(c, i) * (double)cfg_entry_size(c, i);
    return n;
}

size_t ff_gpt_tensor_entries(const ff_gpt *g, int i)
{
    return i >= 0 && i < FF_GPT_NTENSORS ? tensor_entries(g, i) : 0;
}

size_t ff_gpt_tensor_size(const ff_gpt *g, int i)
{
    return i >= 0 && i < FF_GPT_NTENSORS ? tensor_entries(g, i) * entry_size(g, i) : 0;
}

static size_t tensor_offset(const ff_gpt *g, int i)
{
    size_t off = 0;
    for (int j = 0; j < i; j++)
        off += ff_gpt_tensor_size(g, j);
    return off;
}

size_t ff_gpt_canonical_size(const ff_gpt *g) { return tensor_offset(g, FF_GPT_NTENSORS); }

int64_t ff_gpt_num_params(const ff_gpt *g)
{
    return (int64_t)ff_gpt_canonical_size(g) - (int64_t)(g->cfg.Vp - g->cfg.V) * g->cfg.C;
}

double ff_gpt_flops_per_token(const ff_gpt *g, int T)
{
    /* 6 N for the products with weights (N without positions: they are added,
     * not multiplied; wte counted once, as the LM head), and 12 L C T for
     * QK^T and AV forward (4 L C T) and backward (8 L C T) */
    double n = (double)ff_gpt_num_params(g) - (double)g->cfg.maxT * g->cfg.C;
    /* a mixture of experts: a token passes through top_k of each MoE block's
     * E experts (8C^2 + 5C parameters each), the router included (dropped
     * assignments still counted, as model FLOPs count the model's work) */
    const double C = g->cfg.C, Lm = moe_before(&g->cfg, g->cfg.L);
    n -= Lm * (g->cfg.experts - g->cfg.top_k) * (8 * C * C + 5 * C);
    return 6.0 * n + 12.0 * g->cfg.L * (double)g->cfg.C * T;
}

void ff_gpt_memory_report(const ff_gpt *g, ff_gpt_memory *m)
{
    memset(m, 0, sizeof *m);
    /* under SAMO the Z-sharded weights' gradient and moments are compressed */
    const size_t state = ff_gpt_dense_state(g) + g->samo_k;
    /* the fp32 master (compressed in bf16-mixed SAMO) and bf16-mixed's 2-byte copy */
    /* (bf16-mixed ZeRO: the master's slices; with SAMO its compressed and
     * dense slices, and SAMO's staging vector of the gathers after AdamW) */
    const size_t master = ff_gpt_zero_samo_master(g) ? ff_gpt_zero_state(g) + ff_gpt_samo_state(g)
                          : ff_gpt_zero_master_sliced(g) ? ff_gpt_zero_state(g)
                                                         : ff_gpt_param_state(g);
    m->params = (master + ff_gpt_bf16_floats(g) + ff_gpt_zero_stage_floats(g)) * sizeof(float);
    m->grads = state * sizeof(float);
    m->adam = 2 * (ff_gpt_moment_state(g) + (g->samo ? ff_gpt_samo_state(g) : 0)) * sizeof(float);
    const size_t packed = g->pack_idx ? g->pack_off[2 * g->nb + 1] : 0;
    m->mask = g->samo ? g->samo_k * sizeof(uint32_t)
                      : (g->mask ? g->n_params * sizeof(float) : 0) +
                            packed * (sizeof(uint32_t) + sizeof(float));
    m->activations = g->act_bytes;
    m->scratch = g->scratch_bytes;
    ff_linear_seq_memory(g->seq, NULL, &m->linear_peak);
    m->linear_held = ff_linear_seq_held(g->seq);
    m->gemm_scratch = ff_gemm_scratch_bytes(ff_linear_seq_gemm(g->seq));
}

size_t ff_gpt_memory_total(const ff_gpt_memory *m)
{
    return m->params + m->grads + m->adam + m->mask + m->activations + m->scratch + m->linear_held +
           m->gemm_scratch;
}

static float *flat_of(ff_gpt *g, ff_gpt_buffer which)
{
    switch (which) {
    case FF_GPT_PARAMS: return g->params;
    case FF_GPT_GRADS: return g->grads;
    case FF_GPT_ADAM_M: return g->adam_m;
    case FF_GPT_ADAM_V: return g->adam_v;
    case FF_GPT_MASK: return g->mask;
    }
    return NULL;
}

const float *ff_gpt_wte_shard(const ff_gpt *g, ff_gpt_buffer which, size_t *n)
{
    *n = 0;
    const float *flat = flat_of((ff_gpt *)g, which);
    if (!g->wte || !flat || (g->samo && (which != FF_GPT_PARAMS || g->samo_p) && g->samo_zc0 == 0))
        return NULL;
    *n = ff_linear_local_sizes(g->wte).w_shard;
    /* wte's shard is the first of the Z-sharded weights, at offset 0 in
     * every flat buffer (under SAMO a dense wte comes first there too) */
    return flat;
}

/* ---- the parameters in layout Y (positions and LayerNorms) -----------------
 * They travel as one vector: wpe, then ln1w, ln1b, ln2w, ln2b (L C each),
 * then lnfw, lnfb. Rank (0, y, 0, 0) of each stage owns slice y of the rows
 * its stage holds. */

typedef struct {
    int tensor;    /* canonical tensor */
    int64_t rows;  /* rows of C on this stage (0: the stage has none) */
    int64_t row0;  /* the canonical row of the first */
    float *local;  /* parameter view of row 0 (block 0), or NULL: per-block */
    float **block; /* per-block views */
} yparam;

static int yparams(ff_gpt *g, yparam out[8])
{
    const int64_t L = g->nb, l0 = g->l0, E = g->E;
    int64_t local_moe = 0;
    for (int l = 0; l < g->nb; l++)
        local_moe += g->is_moe[l];
    out[0] = (yparam){1, g->first ? g->cfg.maxT : 0, 0, g->pv.wpe, NULL};
    out[1] = (yparam){2, L, l0, NULL, g->pv.ln1w};
    out[2] = (yparam){3, L, l0, NULL, g->pv.ln1b};
    out[3] = (yparam){8, L, l0, NULL, g->pv.ln2w};
    out[4] = (yparam){9, L, l0, NULL, g->pv.ln2b};
    out[5] = (yparam){14, g->last, 0, g->pv.lnfw, NULL};
    out[6] = (yparam){15, g->last, 0, g->pv.lnfb, NULL};
    /* the routers: rows of C, E per MoE block */
    out[7] = (yparam){16, local_moe * E, moe_before(&g->cfg, g->l0) * E, NULL, g->router_rows};
    return 8;
}

/* Copies between the flat buffer `flat` and the packed vector `packed` (the
 * layout-Y tensors concatenated), for this rank's slice y. */
static void ycopy(ff_gpt *g, float *flat, float *packed, int to_canon)
{
    yparam yp[8];
    int n = yparams(g, yp);
    const int64_t C = g->cfg.C, cy = g->cy, y0 = (int64_t)g->me.y * cy;
    size_t base = 0;
    for (int i = 0; i < n; base += ff_gpt_tensor_size(g, yp[i].tensor), i++) {
        float *canon = packed + yp[i].row0 * C;
        for (int64_t r = 0; r < yp[i].rows; r++) {
            float *view = yp[i].local ? yp[i].local + r * cy : yp[i].block[r];
            float *local = flat + (view - g->params);
            float *c = canon + base + (size_t)(r * C + y0);
            if (to_canon)
                memcpy(c, local, (size_t)cy * sizeof(float));
            else
                memcpy(local, c, (size_t)cy * sizeof(float));
        }
    }
}

/* The linear layers of this stage: layer, canonical weight and bias
 * tensors, block; root is a rank of the stage. The tied embedding is
 * gathered from the first stage and scattered to the first and the last. */
static int for_each_linear(ff_gpt *g, float *flat, float *canon, int root, int gather)
{
    int rc = FF_OK;
    if (g->wte && (g->first || !gather)) {
        float *wte_l = flat + (g->pv.wte - g->params);
        rc = gather ? ff_linear_gather(g->wte, wte_l, NULL, canon, NULL, root)
                    : ff_linear_scatter(g->wte, canon, NULL, wte_l, NULL, root);
    }
    /* an expert's layers: for each slot s of expert parallelism, local
     * expert le of the ranks of slot s is the model's expert s el + le;
     * every rank takes part for every slot (its own layer stands for the
     * shape where it holds another expert) */
    for (int l = 0; l < g->nb && rc == FF_OK; l++)
        for (int i = 0; i < ff_gpt_block_nlin(g, l) && rc == FF_OK; i++)
            for (int s = 0; s < (i < 2 || !g->is_moe[l] ? 1 : g->ge) && rc == FF_OK; s++) {
                /* the weight's canonical tensor and entry (the bias's is next) */
                const int gl = g->l0 + l, up = i % 2 == 0, expert = i >= 2 && g->is_moe[l];
                int wt = i < 2 ? (up ? 4 : 6) : !expert ? (up ? 10 : 12) : (up ? 17 : 19);
                size_t entry = tensor_entry_of(g, wt, gl) +
                               (expert ? (size_t)s * g->el + (size_t)(i - 2) / 2 : 0);
                float *wc = canon ? canon + tensor_offset(g, wt) + entry * entry_size(g, wt) : NULL;
                float *bc =
                    canon ? canon + tensor_offset(g, wt + 1) + entry * entry_size(g, wt + 1) : NULL;
                float **w, **b;
                ff_gpt_lin_views(g, &g->pv, l, i, &w, &b);
                float *wl = flat + (*w - g->params), *bl = flat + (*b - g->params);
                ff_linear *lin = ff_gpt_block_lin(g, l, i);
                int ge = expert ? g->ge : 1;
                rc = gather ? ff_linear_gather_slot(lin, wl, bl, wc, bc, root, s)
                            : ff_linear_scatter_slot(lin, wc, bc, wl, bl, root, ge, s);
            }
    return rc;
}

static size_t ysize(ff_gpt *g)
{
    yparam yp[8];
    int k = yparams(g, yp);
    size_t n = 0;
    for (int i = 0; i < k; i++)
        n += ff_gpt_tensor_size(g, yp[i].tensor);
    return n;
}

/* Between the packed layout-Y vector and the canonical model. */
static void ypack(ff_gpt *g, float *packed, float *canon, int to_canon)
{
    yparam yp[8];
    int k = yparams(g, yp);
    size_t p = 0;
    for (int i = 0; i < k; i++) {
        size_t off = tensor_offset(g, yp[i].tensor), n = ff_gpt_tensor_size(g, yp[i].tensor);
        if (to_canon)
            memcpy(canon + off, packed + p, n * sizeof(float));
        else
            memcpy(packed + p, canon + off, n * sizeof(float));
        p += n;
    }
}

static int buffer_ready(ff_gpt *g, ff_gpt_buffer which, float **flat)
{
    if ((which == FF_GPT_ADAM_M || which == FF_GPT_ADAM_V) && !g->adam_m) {
        int rc = ff_gpt_adam_ensure(g);
        if (rc)
            return rc;
    }
    *flat = flat_of(g, which);
    if (!*flat && which == FF_GPT_MASK)
        return ff_set_error(g->ctx, FF_EINVAL, "the model trains without a mask");
    return *flat ? FF_OK : ff_set_error(g->ctx, FF_EINVAL, "no such model buffer (%d)", which);
}

/* ---- across pipeline stages ------------------------------------------------
 * Each stage moves its linear layers' tensors between its shards and a
 * canonical-layout buffer on its "stage root", the rank of the stage with
 * root's grid coordinates; the stage roots (one PIPE group) then send their
 * stage's ranges to root, or receive them from it, in messages of at most
 * 2^28 floats. A stage root's buffer is canonical-sized but only its
 * stage's ranges are touched (calloc's untouched pages take no memory). The
 * layout-Y parameters go over the world as without stages. */

enum { TAG_STAGE = 77, MAX_MSG = 1 << 28 };

/* The canonical ranges of the linear layers' tensors stage s holds: wte on
 * the first (and, for a scatter, on the last: its tied copy), then each
 * per-block tensor's rows of its blocks. */
enum { MAX_RANGES = 13 };

static int stage_ranges(const ff_gpt *g, int s, int gather, size_t off[MAX_RANGES],
                        size_t len[MAX_RANGES])
{
    static const int per_block[12] = {4, 5, 6, 7, 10, 11, 12, 13, 17, 18, 19, 20};
    const int l0 = g->stage_l0[s], l1 = g->stage_l0[s + 1];
    int n = 0;
    if (s == 0 || (!gather && s == g->P - 1))
        off[n] = tensor_offset(g, 0), len[n++] = ff_gpt_tensor_size(g, 0);
    for (int i = 0; i < 12; i++) {
        const int t = per_block[i];
        size_t per = entry_size(g, t), e0 = tensor_entry_of(g, t, l0);
        size_t e1 = l1 < g->cfg.L ? tensor_entry_of(g, t, l1) : tensor_entries(g, t);
        off[n] = tensor_offset(g, t) + e0 * per, len[n++] = (e1 - e0) * per;
    }
    return n;
}

/* Stage s's ranges between its stage root and root (PIPE rank rs). */
static int move_ranges(ff_gpt *g, float *buf, int s, int rs, int send, int gather)
{
    MPI_Comm comm = ff_group_comm(g->grp_pipe);
    size_t off[MAX_RANGES], len[MAX_RANGES];
    int n = stage_ranges(g, s, gather, off, len);
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < len[i]; k += MAX_MSG) {
            int c = (int)(len[i] - k < MAX_MSG ? len[i] - k : MAX_MSG);
            int mrc = send ? MPI_Send(buf + off[i] + k, c, MPI_FLOAT, s == g->stage ? rs : s,
                                      TAG_STAGE, comm)
                           : MPI_Recv(buf + off[i] + k, c, MPI_FLOAT, s == g->stage ? rs : s,
                                      TAG_STAGE, comm, MPI_STATUS_IGNORE);
            if (mrc != MPI_SUCCESS)
                return ff_set_error(g->ctx, FF_EMPI, "moving stage %d's tensors failed", s);
        }
    return FF_OK;
}

/* The stage root's buffer: root's own canonical buffer, or a fresh one. */
static int stage_root_buffer(ff_gpt *g, int root, float *canon, float **buf, int *is_sroot)
{
    const int G = ff_group_size(ff_grid_group(g->grid, FF_GROUP_STAGE));
    const int me = ff_ctx_rank(g->ctx);
    *is_sroot = me % G == root % G;
    *buf = me == root ? canon : NULL;
    if (me == root && !canon)
        return ff_set_error(g->ctx, FF_EINVAL, "no canonical buffer on the root rank %d", root);
    if (*is_sroot && me != root && !(*buf = calloc(ff_gpt_canonical_size(g), sizeof(float))))
        return ff_set_error(g->ctx, FF_ENOMEM, "out of memory for a canonical copy of the model");
    return FF_OK;
}

/* The start of a gather or scatter, agreed over the world: the flat buffer
 * of `which`, root a rank, the stage root's buffer. */
static int begin_transfer(ff_gpt *g, ff_gpt_buffer which, int root, float *canon, float **flat,
                          float **sbuf, int *is_sroot)
{
    int rc = *flat ? FF_OK : buffer_ready(g, which, flat);
    if (rc == FF_OK && (root < 0 || root >= ff_ctx_size(g->ctx)))
        rc = ff_set_error(g->ctx, FF_EINVAL, "root %d is not a rank", root);
    if (rc == FF_OK)
        rc = stage_root_buffer(g, root, canon, sbuf, is_sroot);
    if ((rc = ff_ctx_agree(g->ctx, rc)) && *sbuf != canon) {
        free(*sbuf);
        *sbuf = NULL;
    }
    return rc;
}

/* Gather: every other stage root sends its ranges to root; scatter: root
 * sends each its ranges. Collective over the world; the outcome is agreed. */
static int move_stages(ff_gpt *g, float *buf, int root, int is_sroot, int gather)
{
    const int G = ff_group_size(ff_grid_group(g->grid, FF_GROUP_STAGE)), rs = root / G;
    int rc = FF_OK;
    if (g->P > 1 && is_sroot) {
        if (g->stage != rs)
            rc = move_ranges(g, buf, g->stage, rs, gather, gather);
        for (int s = 0; s < g->P && rc == FF_OK && g->stage == rs; s++)
            if (s != rs)
                rc = move_ranges(g, buf, s, rs, !gather, gather);
    }
    return ff_ctx_agree(g->ctx, rc);
}

/* flat: the flat buffer to gather (NULL: which's) */
static int gather_flat(ff_gpt *g, ff_gpt_buffer which, float *flat, float *canon, int root)
{
    float *sbuf = NULL;
    int is_sroot = 0, rc = begin_transfer(g, which, root, canon, &flat, &sbuf, &is_sroot);
    const int G = ff_group_size(ff_grid_group(g->grid, FF_GROUP_STAGE));
    if (rc)
        return rc;
    int is_root = ff_ctx_rank(g->ctx) == root;
    /* (a stage's failure is agreed over the world before any message
     * between stages) */
    rc = ff_ctx_agree(g->ctx, for_each_linear(g, flat, is_sroot ? sbuf : NULL, root % G, 1));
    if (rc == FF_OK)
        rc = move_stages(g, sbuf, root, is_sroot, 1);
    if (sbuf != canon)
        free(sbuf);
    if (rc)
        return rc;
    /* layout-Y parameters: the owners' slices summed into one packed vector
     * (others contribute zeros, so the sum is exact) */
    size_t n = ysize(g);
    float *part = calloc(n, sizeof(float)), *sum = is_root ? calloc(n, sizeof(float)) : NULL;
    rc = part && (!is_root || sum) ? FF_OK
                                   : ff_set_error(g->ctx, FF_ENOMEM, "out of memory for a gather");
    if ((rc = ff_ctx_agree(g->ctx, rc)) == FF_OK) {
        if (g->me.x == 0 && g->me.z == 0 && g->me.d == 0)
            ycopy(g, flat, part, 1);
        int mrc = MPI_Reduce(part, sum, (int)n, MPI_FLOAT, MPI_SUM, root, ff_ctx_comm(g->ctx));
        if (mrc != MPI_SUCCESS)
            rc = ff_set_error(g->ctx, FF_EMPI, "MPI_Reduce of the layout-Y parameters failed");
        else if (is_root)
            ypack(g, sum, canon, 1);
    }
    free(part);
    free(sum);
    return rc;
}

static int scatter_flat(ff_gpt *g, ff_gpt_buffer which, float *flat, const float *canon, int root)
{
    float *sbuf = NULL;
    int is_sroot = 0, rc = begin_transfer(g, which, root, (float *)canon, &flat, &sbuf, &is_sroot);
    const int G = ff_group_size(ff_grid_group(g->grid, FF_GROUP_STAGE));
    if (rc)
        return rc;
    int is_root = ff_ctx_rank(g->ctx) == root;
    rc = move_stages(g, sbuf, root, is_sroot, 0);
    if (rc == FF_OK)
        rc = ff_ctx_agree(g->ctx, for_each_linear(g, flat, is_sroot ? sbuf : NULL, root % G, 0));
    if (sbuf != canon)
        free(sbuf);
    if (rc)
        return rc;
    size_t n = ysize(g);
    float *all = calloc(n, sizeof(float));
    rc = ff_ctx_agree(g->ctx,
                      all ? FF_OK : ff_set_error(g->ctx, FF_ENOMEM, "out of memory for a scatter"));
    if (rc == FF_OK) {
        if (is_root)
            ypack(g, all, (float *)canon, 0);
        if (MPI_Bcast(all, (int)n, MPI_FLOAT, root, ff_ctx_comm(g->ctx)) != MPI_SUCCESS)
            rc = ff_set_error(g->ctx, FF_EMPI, "MPI_Bcast of the layout-Y parameters failed");
        else
            ycopy(g, flat, all, 0);
    }
    free(all);
    return rc;
}

/* Under SAMO the gradients and moments (and the mask) travel through a
 * dense copy made for the transfer (docs/samo.md: a checkpoint's moment),
 * and in bf16-mixed the master too: every transfer then runs on the dense
 * master's views, whose offsets are the dense buffers'. So does ZeRO's
 * sliced master in bf16-mixed (gpt_zero.c): gathered whole over D for a
 * transfer of the parameters, sliced again after it; for the others only
 * its views' offsets are needed, bound without the values. */
static int gather_any(ff_gpt *g, ff_gpt_buffer which, float *canon, int root);
static int scatter_any(ff_gpt *g, ff_gpt_buffer which, const float *canon, int root);

int ff_gpt_gather(ff_gpt *g, ff_gpt_buffer which, float *canon, int root)
{
    int rc = ff_gpt_zero_params_settle(g); /* (ZeRO's gathers after AdamW) */
    if (rc == FF_OK)
        rc = ff_gpt_samo_master_dense(g);
    if (rc == FF_OK) /* (bf16-mixed ZeRO: the master's slices; the views are its) */
        rc = which == FF_GPT_PARAMS ? ff_gpt_zero_master_whole(g) : ff_gpt_zero_master_views(g);
    if (rc == FF_OK)
        rc = gather_any(g, which, canon, root);
    ff_gpt_zero_master_slice(g, 0);
    ff_gpt_samo_master_compress(g, 0);
    return rc;
}

int ff_gpt_scatter(ff_gpt *g, ff_gpt_buffer which, const float *canon, int root)
{
    int rc = ff_gpt_zero_params_settle(g); /* (ZeRO's gathers after AdamW) */
    if (rc == FF_OK)
        rc = ff_gpt_samo_master_dense(g);
    if (rc == FF_OK) /* (bf16-mixed ZeRO: the master's slices; the views are its) */
        rc = which == FF_GPT_PARAMS ? ff_gpt_zero_master_whole(g) : ff_gpt_zero_master_views(g);
    if (rc == FF_OK)
        rc = scatter_any(g, which, canon, root);
    ff_gpt_zero_master_slice(g, rc == FF_OK && which == FF_GPT_PARAMS);
    ff_gpt_samo_master_compress(g, rc == FF_OK && which == FF_GPT_PARAMS);
    return rc;
}

static int gather_any(ff_gpt *g, ff_gpt_buffer which, float *canon, int root)
{
    if (g->zr && !g->samo && which != FF_GPT_PARAMS &&
        which != FF_GPT_MASK) { /* ZeRO: the slices gathered (SAMO's: samo.c) */
        float *flat = NULL, *full = NULL;
        int rc = ff_ctx_agree(g->ctx, buffer_ready(g, which, &flat));
        if (rc == FF_OK && (rc = ff_gpt_zero_transfer_begin(g, which, 1, &full)) == FF_OK)
            rc = gather_flat(g, which, full, canon, root);
        if (full)
            ff_gpt_zero_transfer_end(g, which, full, 0);
        return rc;
    }
    if (!g->samo || which == FF_GPT_PARAMS)
        return gather_flat(g, which, NULL, canon, root);
    float *dense = ff_gpt_samo_expand(g, which);
    int rc = ff_ctx_agree(g->ctx, dense ? FF_OK : FF_ENOMEM);
    if (rc == FF_OK)
        rc = gather_flat(g, which, dense, canon, root);
    ff_fbuf_free(dense);
    return rc;
}

static int scatter_any(ff_gpt *g, ff_gpt_buffer which, const float *canon, int root)
{
    if (g->zr && !g->samo && which != FF_GPT_PARAMS &&
        which != FF_GPT_MASK) { /* ZeRO: the slices kept (SAMO's: samo.c) */
        float *flat = NULL, *full = NULL;
        int rc = ff_ctx_agree(g->ctx, buffer_ready(g, which, &flat));
        if (rc == FF_OK && (rc = ff_gpt_zero_transfer_begin(g, which, 0, &full)) == FF_OK)
            rc = scatter_flat(g, which, full, canon, root);
        if (full)
            ff_gpt_zero_transfer_end(g, which, full, rc == FF_OK);
        return rc;
    }
    if (!g->samo || which == FF_GPT_PARAMS) {
        int rc = scatter_flat(g, which, NULL, canon, root);
        if (g->samo_dense) /* (compressed by the caller: pruned weights stay pruned, the copy made)
                            */
            return rc;
        if (rc == FF_OK && g->samo) /* pruned weights stay pruned */
            ff_gpt_samo_zero_pruned(g);
        if (rc == FF_OK && which == FF_GPT_PARAMS)
            ff_gpt_bf16_weights(g);
        return rc;
    }
    if (which == FF_GPT_MASK)
        return ff_ctx_agree(g->ctx, ff_set_error(g->ctx, FF_EUNSUPPORTED,
                                                 "a SAMO run's mask is fixed: it cannot change"));
    float *dense = ff_gpt_samo_expand(g, which); /* (zeros where the scatter writes nothing) */
    int rc = ff_ctx_agree(g->ctx, dense ? FF_OK : FF_ENOMEM);
    if (rc == FF_OK && (rc = scatter_flat(g, which, dense, canon, root)) == FF_OK)
        ff_gpt_samo_compress(g, which, dense);
    ff_fbuf_free(dense);
    return rc;
}

/* ---- files ------------------------------------------------------------------------- */

void ff_gpt_header(const ff_gpt *g, int32_t h[256])
{
    memset(h, 0, HEADER_INTS * sizeof(int32_t));
    h[0] = MAGIC;
    h[1] = VERSION_FP32;
    h[2] = g->cfg.maxT;
    h[3] = g->cfg.V;
    h[4] = g->cfg.L;
    h[5] = g->cfg.NH;
    h[6] = g->cfg.C;
    h[7] = g->cfg.Vp;
    if (g->cfg.experts > 0) {
        h[0] = MAGIC_MOE;
        h[1] = VERSION_MOE;
        h[8] = g->cfg.experts;
        h[9] = g->cfg.expert_every;
        h[10] = g->cfg.top_k;
        memcpy(&h[11], &g->cfg.capacity_factor, sizeof(float));
        memcpy(&h[12], &g->cfg.aux_coef, sizeof(float));
    }
}

/* Checks a header's magic and version: FF_OK for a v3 or MoE v1 file. */
static int check_kind(ff_ctx *ctx, const char *path, const int32_t *h)
{
    if (h[0] == MAGIC_MOE && h[1] != VERSION_MOE)
        return ff_set_error(ctx, FF_EUNSUPPORTED,
                            "MoE checkpoint '%s' has version %d; fourfold reads version %d", path,
                            h[1], VERSION_MOE);
    if (h[0] == MAGIC_MOE)
        return h[8] > 0 && h[9] > 0
                   ? FF_OK
                   : ff_set_error(ctx, FF_ECORRUPT,
                                  "MoE checkpoint '%s' has %d experts in one block of every %d",
                                  path, h[8], h[9]);
    if (h[0] != MAGIC)
        return ff_set_error(ctx, FF_ECORRUPT,
                            "'%s' is not a GPT-2 checkpoint (magic %d, expected %d, or %d for "
                            "fourfold's MoE format)",
                            path, h[0], MAGIC, MAGIC_MOE);
    if (h[1] != VERSION_FP32)
        return ff_set_error(ctx, FF_EUNSUPPORTED,
                            "checkpoint '%s' has version %d%s; fourfold reads version 3 (fp32)",
                            path, h[1], h[1] == VERSION_BF16 ? " (bf16)" : "");
    return FF_OK;
}

static int write_file(ff_gpt *g, const char *path, const float *canon)
{
    int32_t h[HEADER_INTS];
    ff_gpt_header(g, h);
    size_t n = ff_gpt_canonical_size(g);
    h[SLOT_CRC_TAG] = CRC_TAG;
    uint32_t crc = file_crc(h, canon, n);
    memcpy(&h[SLOT_CRC], &crc, sizeof crc);
    char tmp[FF_TMP_PATH_MAX];
    FILE *f = ff_atomic_open(path, tmp);
    int ok = f && fwrite(h, sizeof h, 1, f) == 1 && fwrite(canon, sizeof(float), n, f) == n;
    if (f && !ok)
        ff_atomic_abort(f, tmp);
    if (f && ok && ff_atomic_commit(f, tmp, path) != 0)
        ok = 0;
    return ok ? FF_OK
              : ff_set_error(g->ctx, FF_EIO, "cannot write the checkpoint '%s': %s", path,
                             strerror(errno));
}

int ff_gpt_save(ff_gpt *g, ff_gpt_buffer which, const char *path)
{
    int is_root = ff_ctx_rank(g->ctx) == 0;
    float *canon = is_root ? malloc(ff_gpt_canonical_size(g) * sizeof(float)) : NULL;
    int rc = ff_ctx_agree(g->ctx,
                          !is_root || canon
                              ? FF_OK
                              : ff_set_error(g->ctx, FF_ENOMEM, "out of memory for a checkpoint"));
    if (rc == FF_OK)
        rc = ff_gpt_gather(g, which, canon, 0);
    if (rc == FF_OK)
        rc = ff_ctx_agree(g->ctx, is_root ? write_file(g, path, canon) : FF_OK);
    free(canon);
    return rc;
}

/* A checkpoint's header (read from f) against the model: its kind (dense or
 * a mixture of experts) and every shape field. */
static int header_fits(const ff_gpt *g, const char *path, FILE *f, int32_t *h)
{
    int32_t want[HEADER_INTS];
    int rc = FF_OK;
    if (fread(h, sizeof(int32_t), HEADER_INTS, f) != HEADER_INTS)
        rc = ff_set_error(g->ctx, FF_ECORRUPT, "checkpoint '%s': shorter than its header", path);
    else
        rc = check_kind(g->ctx, path, h);
    ff_gpt_header(g, want);
    if (rc == FF_OK && (h[0] == MAGIC_MOE) != (want[0] == MAGIC_MOE))
        rc = h[0] == MAGIC_MOE
                 ? ff_set_error(g->ctx, FF_EINVAL,
                                "checkpoint '%s' is a mixture of experts (%d experts), the model "
                                "is dense",
                                path, h[8])
                 : ff_set_error(g->ctx, FF_EINVAL,
                                "checkpoint '%s' is a dense model (llm.c v3), the model has %d "
                                "experts",
                                path, g->cfg.experts);
    if (rc == FF_OK) {
        static const char *const fields[10] = {"",   "",  "maxT", "V",       "L",
                                               "NH", "C", "Vp",   "experts", "expert_every"};
        for (int i = 2; i < (h[0] == MAGIC_MOE ? 10 : 8) && rc == FF_OK; i++)
            if (h[i] != want[i])
                rc = ff_set_error(g->ctx, FF_EINVAL,
                                  "checkpoint '%s' has %s=%d, the model has %s=%d", path, fields[i],
                                  h[i], fields[i], want[i]);
    }
    return rc;
}

int ff_gpt_check_header(const ff_gpt *g, const char *path)
{
    FILE *f = ff_fopen_regular(path);
    if (!f)
        return ff_set_error(g->ctx, FF_EIO, "cannot open the checkpoint '%s': %s", path,
                            ff_open_error(errno));
    int32_t h[HEADER_INTS];
    int rc = header_fits(g, path, f, h);
    fclose(f);
    return rc;
}

static int read_file(ff_gpt *g, const char *path, float **out)
{
    *out = NULL;
    FILE *f = ff_fopen_regular(path);
    if (!f)
        return ff_set_error(g->ctx, FF_EIO, "cannot open the checkpoint '%s': %s", path,
                            ff_open_error(errno));
    int32_t h[HEADER_INTS];
    int rc = header_fits(g, path, f, h);
    size_t n = ff_gpt_canonical_size(g);
    float *canon = NULL;
    if (rc == FF_OK && !(canon = malloc(n * sizeof(float))))
        rc = ff_set_error(g->ctx, FF_ENOMEM, "out of memory for a checkpoint");
    if (rc == FF_OK) {
        size_t got = fread(canon, sizeof(float), n, f);
        char extra;
        if (got != n)
            rc = ff_set_error(g->ctx, FF_ECORRUPT,
                              "checkpoint '%s' is truncated: %zu of %zu parameters", path, got, n);
        else if (fread(&extra, 1, 1, f) == 1)
            rc = ff_set_error(g->ctx, FF_ECORRUPT,
                              "checkpoint '%s' is longer than its header says (%zu parameters)",
                              path, n);
    }
    if (rc == FF_OK && h[SLOT_CRC_TAG] == CRC_TAG) {
        uint32_t want_crc, got_crc = file_crc(h, canon, n);
        memcpy(&want_crc, &h[SLOT_CRC], sizeof want_crc);
        if (got_crc != want_crc)
            rc = ff_set_error(g->ctx, FF_ECORRUPT,
                              "checkpoint '%s' fails its checksum (CRC-32 %08x, header says %08x)",
                              path, got_crc, want_crc);
    }
    fclose(f);
    if (rc)
        free(canon);
    else
        *out = canon;
    return rc;
}

int ff_gpt_load(ff_gpt *g, const char *path)
{
    int is_root = ff_ctx_rank(g->ctx) == 0;
    float *canon = NULL;
    int rc = ff_ctx_agree(g->ctx, is_root ? read_file(g, path, &canon) : FF_OK);
    if (rc == FF_OK)
        rc = ff_gpt_scatter(g, FF_GPT_PARAMS, canon, 0);
    free(canon);
    return rc;
}

/* The header's shape against itself and against the file, before a model
 * of that shape is built: every size positive, the padded vocabulary not
 * below the vocabulary, heads that divide the width, the file exactly the
 * header and the floats that shape has, and its CRC-32 where it carries one
 * (read through a small buffer: nothing of the header's size is allocated
 * before the file is known to match it). */
static int check_against_file(ff_ctx *ctx, const char *path, FILE *f, const int32_t *h)
{
    const ff_gpt_config c = {.maxT = h[2],
                             .V = h[3],
                             .L = h[4],
                             .NH = h[5],
                             .C = h[6],
                             .Vp = h[7],
                             .experts = h[0] == MAGIC_MOE ? h[8] : 0,
                             .expert_every = h[0] == MAGIC_MOE ? h[9] : 1};
    const int top_k = h[0] == MAGIC_MOE ? h[10] : 1;
    if (c.maxT < 1 || c.V < 1 || c.L < 1 || c.NH < 1 || c.C < 1 || c.Vp < c.V || c.C % c.NH != 0 ||
        top_k < 1 || (c.experts > 0 && top_k > c.experts))
        return ff_set_error(ctx, FF_ECORRUPT,
                            "checkpoint '%s' has an impossible shape in its header (maxT=%d V=%d "
                            "L=%d NH=%d C=%d Vp=%d%s)",
                            path, c.maxT, c.V, c.L, c.NH, c.C, c.Vp,
                            c.experts ? ", experts and top-k as stored" : "");
    struct stat st;
    const double floats = cfg_canonical_floats(&c),
                 bytes = (double)HEADER_INTS * sizeof(int32_t) + floats * sizeof(float);
    if (fstat(fileno(f), &st) != 0)
        return ff_set_error(ctx, FF_EIO, "cannot stat the checkpoint '%s'", path);
    if ((double)st.st_size != bytes)
        return ff_set_error(ctx, FF_ECORRUPT,
                            "checkpoint '%s' has %lld bytes, but its header (maxT=%d V=%d L=%d "
                            "NH=%d C=%d Vp=%d) describes %.0f: %s",
                            path, (long long)st.st_size, c.maxT, c.V, c.L, c.NH, c.C, c.Vp, bytes,
                            (double)st.st_size < bytes ? "truncated, or a corrupt header"
                                                       : "a corrupt header, or extra bytes");
    if (h[SLOT_CRC_TAG] != CRC_TAG)
        return FF_OK; /* llm.c's files carry no CRC */
    int32_t zeroed[HEADER_INTS];
    memcpy(zeroed, h, sizeof zeroed);
    zeroed[SLOT_CRC] = 0;
    uint32_t crc = ff_crc32(0, zeroed, sizeof zeroed), want;
    memcpy(&want, &h[SLOT_CRC], sizeof want);
    enum { CHUNK = 1 << 18 };
    float *buf = malloc(CHUNK * sizeof(float));
    if (!buf)
        return ff_set_error(ctx, FF_ENOMEM, "out of memory reading '%s'", path);
    size_t r;
    while ((r = fread(buf, sizeof(float), CHUNK, f)) > 0)
        crc = ff_crc32(crc, buf, r * sizeof(float));
    free(buf);
    if (ferror(f))
        return ff_set_error(ctx, FF_EIO, "cannot read the checkpoint '%s'", path);
    return crc == want ? FF_OK
                       : ff_set_error(ctx, FF_ECORRUPT,
                                      "checkpoint '%s' fails its checksum (CRC-32 %08x, header "
                                      "says %08x)",
                                      path, crc, want);
}

int ff_gpt_read_config(ff_ctx *ctx, const char *path, ff_gpt_config *cfg)
{
    int rc = FF_OK;
    int32_t h[HEADER_INTS] = {0}; /* rank 0 reads it; slots 0-12 are broadcast */
    if (ff_ctx_rank(ctx) == 0) {
        FILE *f = ff_fopen_regular(path);
        if (!f)
            rc = ff_set_error(ctx, FF_EIO, "cannot open the checkpoint '%s': %s", path,
                              ff_open_error(errno));
        else if (fread(h, sizeof h, 1, f) != 1)
            rc = ff_set_error(ctx, FF_ECORRUPT, "checkpoint '%s': shorter than its header", path);
        else
            rc = check_kind(ctx, path, h);
        if (rc == FF_OK)
            rc = check_against_file(ctx, path, f, h);
        if (f)
            fclose(f);
    }
    if ((rc = ff_ctx_agree(ctx, rc)))
        return rc;
    if (MPI_Bcast(h, 13, MPI_INT32_T, 0, ff_ctx_comm(ctx)) != MPI_SUCCESS)
        return ff_ctx_agree(ctx, ff_set_error(ctx, FF_EMPI, "MPI_Bcast of a header failed"));
    *cfg = (ff_gpt_config){.maxT = h[2], .V = h[3], .L = h[4], .NH = h[5], .C = h[6], .Vp = h[7]};
    if (h[0] == MAGIC_MOE) {
        cfg->experts = h[8];
        cfg->expert_every = h[9];
        cfg->top_k = h[10];
        memcpy(&cfg->capacity_factor, &h[11], sizeof(float));
        memcpy(&cfg->aux_coef, &h[12], sizeof(float));
    }
    return FF_OK;
}
