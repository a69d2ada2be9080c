/* Magnitude pruning, mask files and masked training (fourfold/prune.h,
 * docs/samo.md). */
#include "fourfold/prune.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device.h"
#include "gpt_internal.h"
#include "gpt_ops.h"
#include "util/crc32.h"
#include "util/file.h"

void ff_prune_opts_default(ff_prune_opts *o) { memset(o, 0, sizeof *o); }

/* ---- which entries are candidates --------------------------------------------
 * The weight matrices in canonical order: wte (its V real rows, with
 * `embedding`), then per block or expert qkvw, attprojw, fcw, fcprojw, efcw,
 * efcprojw. A matrix is one entry of its tensor. */

enum {
    T_WTE = 0,
    T_QKVW = 4,
    T_ATTPROJW = 6,
    T_FCW = 10,
    T_FCPROJW = 12,
    T_EFCW = 17,
    T_EFCPROJW = 19
};

typedef struct {
    size_t off, len; /* a matrix's candidates: canonical [off, off + len) */
} span;

/* The candidate matrices of g (spans in canonical order) into out (NULL:
 * count only); returns their number. */
static size_t candidate_spans(const ff_gpt *g, int embedding, span *out)
{
    size_t n = 0, off = 0;
    for (int i = 0; i < FF_GPT_NTENSORS; i++) {
        const size_t size = ff_gpt_tensor_size(g, i);
        const size_t entries = ff_gpt_tensor_entries(g, i);
        const int weight = i == T_QKVW || i == T_ATTPROJW || i == T_FCW || i == T_FCPROJW ||
                           i == T_EFCW || i == T_EFCPROJW;
        if (i == T_WTE && embedding) {
            if (out)
                out[n] = (span){off, (size_t)g->cfg.V * (size_t)g->cfg.C};
            n++;
        } else if (weight && entries > 0) {
            for (size_t e = 0; e < entries; e++, n++)
                if (out)
                    out[n] = (span){off + e * (size / entries), size / entries};
        }
        off += size;
    }
    return n;
}

/* ---- selection -------------------------------------------------------------------- */

static void swapf(float *a, float *b)
{
    float t = *a;
    *a = *b;
    *b = t;
}

/* The k-th smallest (0-based) of v[0..n), n > k: quickselect with a median
 * of three and a three-way partition (many equal values are common: zeros);
 * v is reordered. */
static float select_kth(float *v, int64_t n, int64_t k)
{
    int64_t lo = 0, hi = n - 1;
    for (;;) {
        if (lo >= hi)
            return v[lo];
        int64_t mid = lo + (hi - lo) / 2;
        if (v[mid] < v[lo])
            swapf(&v[mid], &v[lo]);
        if (v[hi] < v[lo])
            swapf(&v[hi], &v[lo]);
        if (v[hi] < v[mid])
            swapf(&v[hi], &v[mid]);
        const float pivot = v[mid];
        /* [lo, lt) < pivot, [lt, i) == pivot, (gt, hi] > pivot */
        int64_t lt = lo, i = lo, gt = hi;
        while (i <= gt) {
            if (v[i] < pivot)
                swapf(&v[lt++], &v[i++]);
            else if (v[i] > pivot)
                swapf(&v[i], &v[gt--]);
            else
                i++;
        }
        if (k < lt)
            hi = lt - 1;
        else if (k > gt)
            lo = gt + 1;
        else
            return pivot;
    }
}

/* Prunes `more` of the kept entries of the spans s[0..ns) (the smallest |w|,
 * ties in canonical order). work: room for their kept entries. */
static void prune_smallest(const float *canon, unsigned char *keep, const span *s, size_t ns,
                           int64_t more, float *work)
{
    if (more <= 0)
        return;
    int64_t n = 0;
    for (size_t a = 0; a < ns; a++)
        for (size_t i = s[a].off; i < s[a].off + s[a].len; i++)
            if (keep[i])
                work[n++] = fabsf(canon[i]);
    if (more > n)
        more = n;
    if (more <= 0)
        return;
    const float t = select_kth(work, n, more - 1);
    int64_t below = 0; /* kept entries under the threshold: all pruned */
    for (size_t a = 0; a < ns; a++)
        for (size_t i = s[a].off; i < s[a].off + s[a].len; i++)
            if (keep[i] && fabsf(canon[i]) < t)
                keep[i] = 0, below++;
    for (size_t a = 0; a < ns && below < more; a++) /* then ties, in order */
        for (size_t i = s[a].off; i < s[a].off + s[a].len && below < more; i++)
            if (keep[i] && fabsf(canon[i]) == t)
                keep[i] = 0, below++;
}

/* A group of spans' target, round(p n) of its n entries pruned, and the
 * entries `keep` already prunes (*done). */
static int64_t group_target(const span *s, size_t group, const unsigned char *keep, double p,
                            int64_t *done)
{
    int64_t n = 0;
    *done = 0;
    for (size_t b = 0; b < group; b++) {
        n += (int64_t)s[b].len;
        for (size_t i = s[b].off; i < s[b].off + s[b].len; i++)
            *done += !keep[i];
    }
    return (int64_t)llround(p * (double)n);
}

int ff_prune(const ff_gpt *g, const float *canon, const ff_prune_opts *o, unsigned char *keep,
             int64_t *candidates, int64_t *pruned, char *err, size_t err_len)
{
    if (!(o->sparsity >= 0.0 && o->sparsity < 1.0))
        return ff_format_error(err, err_len, FF_EINVAL, "sparsity %g: expected 0 <= p < 1",
                               o->sparsity);
    const size_t ns = candidate_spans(g, o->embedding, NULL);
    span *s = malloc((ns ? ns : 1) * sizeof *s);
    if (!s)
        return ff_format_error(err, err_len, FF_ENOMEM, "out of memory pruning");
    candidate_spans(g, o->embedding, s);
    size_t total = 0, widest = 0;
    for (size_t a = 0; a < ns; a++) {
        total += s[a].len;
        widest = s[a].len > widest ? s[a].len : widest;
        for (size_t i = s[a].off; i < s[a].off + s[a].len; i++)
            if (!isfinite(canon[i])) {
                free(s);
                return ff_format_error(err, err_len, FF_EINVAL,
                                       "parameter %zu is not finite: cannot prune by magnitude", i);
            }
    }
    float *work = malloc(((o->per_layer ? widest : total) + 1) * sizeof(float));
    if (!work) {
        free(s);
        return ff_format_error(err, err_len, FF_ENOMEM, "out of memory pruning");
    }
    /* the target of a set of spans: round(p n) pruned, those already counted */
    for (size_t a = 0; a < ns; a += o->per_layer ? 1 : ns) {
        const size_t group = o->per_layer ? 1 : ns;
        int64_t done;
        const int64_t target = group_target(s + a, group, keep, o->sparsity, &done);
        prune_smallest(canon, keep, s + a, group, target - done, work);
    }
    int64_t gone = 0;
    for (size_t a = 0; a < ns; a++)
        for (size_t i = s[a].off; i < s[a].off + s[a].len; i++)
            gone += !keep[i];
    if (candidates)
        *candidates = (int64_t)total;
    if (pruned)
        *pruned = gone;
    free(work);
    free(s);
    return FF_OK;
}

int64_t ff_prune_excess(const ff_gpt *g, const ff_prune_opts *o, const unsigned char *keep)
{
    const size_t ns = candidate_spans(g, o->embedding, NULL);
    span *s = malloc((ns ? ns : 1) * sizeof *s);
    if (!s)
        return -1;
    candidate_spans(g, o->embedding, s);
    int64_t excess = 0;
    for (size_t a = 0; a < ns; a += o->per_layer ? 1 : ns) { /* ff_prune's groups */
        int64_t done;
        const int64_t target = group_target(s + a, o->per_layer ? 1 : ns, keep, o->sparsity, &done);
        excess += done > target ? done - target : 0;
    }
    free(s);
    return excess;
}

/* ---- mask files ------------------------------------------------------------------
 * int32 header[64]: magic, version 1, entries (low, high 32 bits), kept
 * (low, high), per_layer, embedding, sparsity (float bits), then the
 * checkpoint header's slots 2-12 (the shape, ff_gpt_header) at 16-26, the
 * CRC-32 of header (with this slot 0) and bits at 63; then one bit per
 * entry, entry i at bit i % 8 of byte i / 8. */

enum { MASK_HDR = 64, MASK_VERSION = 1, MASK_SHAPE = 16, MASK_CRC = 63 };

static uint32_t mask_crc(const int32_t *header, const unsigned char *bits, size_t nbytes)
{
    int32_t h[MASK_HDR];
    memcpy(h, header, sizeof h);
    h[MASK_CRC] = 0;
    return ff_crc32(ff_crc32(0, h, sizeof h), bits, nbytes);
}

static void mask_header(const ff_gpt *g, int32_t h[MASK_HDR], uint64_t n, uint64_t kept)
{
    int32_t ck[256];
    ff_gpt_header(g, ck);
    memset(h, 0, MASK_HDR * sizeof *h);
    h[0] = FF_MASK_MAGIC;
    h[1] = MASK_VERSION;
    h[2] = (int32_t)(uint32_t)(n & 0xffffffffu);
    h[3] = (int32_t)(uint32_t)(n >> 32);
    h[4] = (int32_t)(uint32_t)(kept & 0xffffffffu);
    h[5] = (int32_t)(uint32_t)(kept >> 32);
    for (int i = 0; i < 11; i++)
        h[MASK_SHAPE + i] = ck[2 + i];
}

int ff_mask_path(const char *checkpoint, char *out, size_t len)
{
    int n = snprintf(out, len, "%s.mask", checkpoint);
    return n >= 0 && (size_t)n < len ? FF_OK : FF_EINVAL;
}

int ff_mask_write(const ff_gpt *g, const char *path, const unsigned char *keep,
                  const ff_prune_opts *o, char *err, size_t err_len)
{
    const size_t n = ff_gpt_canonical_size(g), nbytes = (n + 7) / 8;
    unsigned char *bits = calloc(nbytes + 1, 1);
    if (!bits)
        return ff_format_error(err, err_len, FF_ENOMEM, "out of memory writing '%s'", path);
    uint64_t kept = 0;
    for (size_t i = 0; i < n; i++)
        if (keep[i]) {
            bits[i / 8] |= (unsigned char)(1u << (i % 8));
            kept++;
        }
    int32_t h[MASK_HDR];
    mask_header(g, h, n, kept);
    h[6] = o ? o->per_layer : 0;
    h[7] = o ? o->embedding : 0;
    float p = o ? (float)o->sparsity : 0.0f;
    memcpy(&h[8], &p, sizeof p);
    h[MASK_CRC] = (int32_t)mask_crc(h, bits, nbytes);
    char tmp[FF_TMP_PATH_MAX];
    FILE *f = ff_atomic_open(path, tmp);
    int ok = f && fwrite(h, sizeof h, 1, f) == 1 && fwrite(bits, 1, nbytes, f) == nbytes;
    free(bits);
    if (!ok) {
        int e = errno;
        ff_atomic_abort(f, tmp);
        return ff_format_error(err, err_len, FF_EIO, "cannot write '%s': %s", path, strerror(e));
    }
    if (ff_atomic_commit(f, tmp, path) != 0)
        return ff_format_error(err, err_len, FF_EIO, "cannot write '%s': %s", path,
                               strerror(errno));
    return FF_OK;
}

int ff_mask_read(const ff_gpt *g, const char *path, unsigned char *keep, int64_t *kept_out,
                 char *err, size_t err_len)
{
    const size_t n = ff_gpt_canonical_size(g), nbytes = (n + 7) / 8;
    FILE *f = ff_fopen_regular(path);
    if (!f)
        return ff_format_error(err, err_len, FF_EIO, "cannot read the mask '%s': %s", path,
                               ff_open_error(errno));
    int32_t h[MASK_HDR];
    unsigned char *bits = malloc(nbytes + 1);
    int rc = FF_OK;
    if (!bits)
        rc = ff_format_error(err, err_len, FF_ENOMEM, "out of memory reading '%s'", path);
    else if (fread(h, sizeof h, 1, f) != 1 || h[0] != FF_MASK_MAGIC)
        rc = ff_format_error(err, err_len, FF_ECORRUPT, "'%s' is not a fourfold mask file", path);
    else if (h[1] != MASK_VERSION)
        rc = ff_format_error(err, err_len, FF_ECORRUPT, "'%s': mask version %d, expected %d", path,
                             h[1], MASK_VERSION);
    if (rc == FF_OK) {
        const uint64_t fn = (uint64_t)(uint32_t)h[2] | (uint64_t)(uint32_t)h[3] << 32;
        int32_t want[MASK_HDR];
        mask_header(g, want, n, 0);
        /* the layout: slots 2-9 of the checkpoint header (maxT, V, L, NH, C,
         * Vp, experts, expert_every), not the routing options after them */
        if (fn != n || memcmp(&h[MASK_SHAPE], &want[MASK_SHAPE], 8 * sizeof *h) != 0)
            rc = ff_format_error(err, err_len, FF_EINVAL,
                                 "'%s' is the mask of another model (%llu entries, shape L=%d "
                                 "C=%d V=%d; this model: %zu, L=%d C=%d V=%d)",
                                 path, (unsigned long long)fn, h[MASK_SHAPE + 2], h[MASK_SHAPE + 4],
                                 h[MASK_SHAPE + 1], n, g->cfg.L, g->cfg.C, g->cfg.V);
    }
    if (rc == FF_OK && (fread(bits, 1, nbytes, f) != nbytes || fgetc(f) != EOF))
        rc = ff_format_error(err, err_len, FF_ECORRUPT,
                             "'%s' is truncated or too long (expected %zu bytes)", path,
                             sizeof h + nbytes);
    if (rc == FF_OK && (uint32_t)h[MASK_CRC] != mask_crc(h, bits, nbytes))
        rc = ff_format_error(err, err_len, FF_ECORRUPT, "'%s' fails its checksum", path);
    fclose(f);
    int64_t kept = 0;
    for (size_t i = 0; rc == FF_OK && i < n; i++)
        kept += keep[i] = (bits[i / 8] >> (i % 8)) & 1u;
    if (rc == FF_OK) {
        const uint64_t fk = (uint64_t)(uint32_t)h[4] | (uint64_t)(uint32_t)h[5] << 32;
        if ((uint64_t)kept != fk)
            rc = ff_format_error(err, err_len, FF_ECORRUPT,
                                 "'%s' counts %llu kept entries, has %lld", path,
                                 (unsigned long long)fk, (long long)kept);
    }
    if (kept_out)
        *kept_out = kept;
    free(bits);
    return rc;
}

/* ---- masked training -------------------------------------------------------------- */

int ff_gpt_set_mask(ff_gpt *g, const unsigned char *keep, int root)
{
    int rc0 = ff_gpt_zero_params_settle(g); /* (ZeRO's gathers after AdamW) */
    if (rc0)
        return rc0;
    int me = ff_ctx_rank(g->ctx), any = keep != NULL; /* root's say */
    if (g->samo)                                      /* (the same on every rank) */
        return ff_ctx_agree(g->ctx, ff_set_error(g->ctx, FF_EUNSUPPORTED,
                                                 "a SAMO run's mask is fixed: it cannot change"));
    if (MPI_Bcast(&any, 1, MPI_INT, root, ff_ctx_comm(g->ctx)) != MPI_SUCCESS)
        return ff_ctx_agree(g->ctx, ff_set_error(g->ctx, FF_EMPI, "MPI_Bcast failed"));
    if (!any) {
        ff_fbuf_free(g->mask);
        g->mask = NULL;
        return ff_gpt_pack_build(g); /* (frees the packing) */
    }
    /* ZeRO over D: the mask is set on the whole state, and ZeRO comes back
     * with SAMO (ff_gpt_samo); a masked step before that is refused
     * (ff_gpt_zero_masked_check; docs/samo.md "SAMO with ZeRO") */
    int rc = ff_gpt_zero_unset(g);
    if (rc)
        return rc;
    const size_t n = ff_gpt_canonical_size(g);
    float *canon = NULL;
    if (me == root && !(canon = malloc((n ? n : 1) * sizeof(float))))
        rc = ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the mask");
    for (size_t i = 0; canon && i < n; i++)
        canon[i] = keep[i] ? 1.0f : 0.0f;
    if (!g->mask && !(g->mask = ff_fbuf_alloc(g->ctx, g->n_params)))
        rc = ff_set_error(g->ctx, FF_ENOMEM, "out of memory for the mask");
    rc = ff_ctx_agree(g->ctx, rc);
    if (rc == FF_OK)
        rc = ff_gpt_scatter(g, FF_GPT_MASK, canon, root);
    free(canon);
    /* the data-parallel all-reduces' kept entries (docs/samo.md) */
    if (rc == FF_OK)
        rc = ff_ctx_agree(g->ctx, ff_gpt_pack_build(g));
    if (rc) { /* no half-made mask left to train with */
        ff_fbuf_free(g->mask);
        g->mask = NULL;
        ff_gpt_pack_build(g);
        return rc;
    }
    /* the pruned weights and (resuming with a new mask) their moments: +0
     * (not x times 0, -0 for a negative x), as SAMO's dense copies have it */
    float *bufs[3] = {g->params, g->adam_m, g->adam_v};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; bufs[k] && i < g->n_params; i++)
            if (g->mask[i] == 0.0f)
                bufs[k][i] = 0.0f;
    ff_gpt_bf16_weights(g); /* bf16-mixed: the products see them zero too */
    return FF_OK;
}

int ff_gpt_has_mask(const ff_gpt *g) { return g->mask != NULL || g->samo; }

int ff_gpt_load_mask(ff_gpt *g, const char *path, int optional)
{
    ff_ctx *ctx = g->ctx;
    const size_t n = ff_gpt_canonical_size(g);
    unsigned char *keep = NULL;
    int local = FF_OK, present = 1;
    char err[512] = "";
    if (ff_ctx_rank(ctx) == 0) {
        present = !optional || access(path, F_OK) == 0;
        if (present && !(keep = malloc(n ? n : 1)))
            local = ff_set_error(ctx, FF_ENOMEM, "out of memory for the mask");
        else if (present && (local = ff_mask_read(g, path, keep, NULL, err, sizeof err)))
            ff_set_error(ctx, local, "%s", err);
    }
    int rc = ff_ctx_agree(ctx, local);
    if (rc == FF_OK)
        rc = MPI_Bcast(&present, 1, MPI_INT, 0, ff_ctx_comm(ctx)) == MPI_SUCCESS
                 ? FF_OK
                 : ff_ctx_agree(ctx, ff_set_error(ctx, FF_EMPI, "MPI_Bcast failed"));
    if (rc == FF_OK && present)
        rc = ff_gpt_set_mask(g, ff_ctx_rank(ctx) == 0 ? keep : NULL, 0);
    free(keep);
    return rc;
}

int ff_gpt_save_mask(ff_gpt *g, const char *path)
{
    ff_ctx *ctx = g->ctx;
    const int root = ff_ctx_rank(ctx) == 0;
    int has = ff_gpt_has_mask(g), any = 0;
    MPI_Allreduce(&has, &any, 1, MPI_INT, MPI_MAX, ff_ctx_comm(ctx));
    if (!any) { /* no mask: none may be left beside the checkpoint */
        int local = FF_OK;
        if (root && remove(path) != 0 && errno != ENOENT)
            local = ff_set_error(ctx, FF_EIO, "cannot remove '%s': %s", path, strerror(errno));
        return ff_ctx_agree(ctx, local);
    }
    const size_t n = ff_gpt_canonical_size(g);
    float *canon = NULL;
    unsigned char *keep = NULL;
    int local = FF_OK;
    if (root && (!(canon = malloc((n ? n : 1) * sizeof *canon)) || !(keep = malloc(n ? n : 1))))
        local = ff_set_error(ctx, FF_ENOMEM, "out of memory for the mask");
    int rc = ff_ctx_agree(ctx, local);
    if (rc == FF_OK)
        rc = ff_gpt_gather(g, FF_GPT_MASK, canon, 0);
    if (rc == FF_OK) {
        char err[512] = "";
        if (root) {
            for (size_t i = 0; i < n; i++)
                keep[i] = canon[i] != 0.0f;
            /* the header's options, as far as the mask tells them: the
             * embedding is a candidate if any of it is pruned, the sparsity
             * is the pruned fraction of the candidates (per_layer unknown) */
            ff_prune_opts o;
            ff_prune_opts_default(&o);
            for (size_t i = 0; i < (size_t)g->cfg.V * (size_t)g->cfg.C && !o.embedding; i++)
                o.embedding = !keep[i]; /* (wte is the first tensor) */
            const size_t ns = candidate_spans(g, o.embedding, NULL);
            span *sp = malloc((ns ? ns : 1) * sizeof *sp);
            size_t cand = 0, pruned = 0;
            if (sp) {
                candidate_spans(g, o.embedding, sp);
                for (size_t k = 0; k < ns; k++)
                    for (size_t i = sp[k].off; i < sp[k].off + sp[k].len; i++)
                        cand++, pruned += !keep[i];
            }
            free(sp);
            o.sparsity = cand ? (double)pruned / (double)cand : 0.0;
            if ((local = ff_mask_write(g, path, keep, &o, err, sizeof err)))
                ff_set_error(ctx, local, "%s", err);
        }
        rc = ff_ctx_agree(ctx, local);
    }
    free(canon);
    free(keep);
    return rc;
}
