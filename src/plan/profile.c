/* Machine profiles: the presets, and the profile module (plan/profile.h):
 * the one reader, checker, merger and writer of the JSON file that `fourfold
 * bench profile` writes, `bench tune` rewrites with its picks, the planner
 * reads (ff_profile_load) and the collective layer reads (FF_PROFILE,
 * ff_coll_model_read). Schema in docs/planner.md, "Machine profiles".
 *
 * The parser is strict: one JSON object, every known key type-checked and
 * range-checked, each at most once; unknown keys are parsed and kept
 * verbatim (so a rewrite keeps them), the "fit" object is kept as its text;
 * nothing may follow the object. Every message names the file and the line,
 * and inside the picks list the pick. */
#include "plan/profile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* ff_coll_model_ok */
#include "plan/plan_internal.h"
#include "util/json.h"
#include "util/text.h"

/* ---- presets ---- */

#define GiB (1024.0 * 1024.0 * 1024.0)

static void set_common(ff_profile *p, const char *name)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
}

static void add_bw(ff_profile *p, int inner, int size, double gbps)
{
    p->intra_bw[p->n_intra_bw++] = (ff_intra_bw){inner, size, gbps * 1e9};
}

/* The GPU machines of the paper (dissertation §5.2.2): GPUs per node, memory
 * per GPU, advertised bf16 peaks, 4 Slingshot-11 NICs of 25 GB/s per node;
 * they train in bf16-mixed precision, as the papers' runs. The sustained
 * GEMM rates are the dissertation's own (§5.2.2): the best bf16 square
 * GEMM measured on one A100 of Perlmutter (280 TFLOP/s, at 32768^3) and
 * one MI250X GCD of Frontier (125), and NVIDIA's GH200 guide for Alps
 * (813). An independent published measurement agrees: the "maximum
 * achievable matmul FLOPS" of S. Bekman's Machine Learning Engineering
 * book (github.com/stas00/ml-engineering, compute/accelerator/README.md,
 * the best mean rate over a search of bf16 shapes) is 271.2 for an A100
 * SXM, 828.6 for a GH200 and, with the later ROCm 6.2, 147.0 for an MI250X
 * GCD (docs/planner.md, "Presets").
 *
 * Below that rate, a product of (m x k)(k x n) takes gemm_call_s + its
 * flops / (rate / (1 + h/m + h/n + h/k)). h and gemm_call_s are fitted
 * (bench/gemm_shape_fit.py) to OpenXLA's published per-shape table of bf16
 * GEMM rates (github.com/openxla/xla,
 * xla/service/gpu/model/default_matmul_perf_table.txtpb, 125 shapes of 256
 * to 4096 per side, read at commit dc66032216): on an H100 ("sm_90", at its
 * MAMF of 794.5) h = 52 and 6 us per call leave a median error of 6.6 %.
 * Alps' GH200 is the same GPU; the A100 is its predecessor with the same
 * library and fewer SMs (it fills at smaller shapes, so h = 52 errs on the
 * slow side). The table has no MI250X: for MI300X ("gfx942", at its 668.4)
 * h = 204 and 6.5 us per call; an MI250X GCD has 110 compute units to the
 * MI300X's 304, so a product fills it with sqrt(110/304) = 0.6 of the sides
 * (h about 125): Frontier keeps 128. docs/planner.md, "Calibrating the GEMM
 * curve", has the fits and how far the predictions move with h.
 *
 * Intra-node bandwidths are the ones AxoNN's tool uses (GB/s by stride and
 * group size); the rest are assumptions stated in docs/planner.md. */
static void perlmutter(ff_profile *p)
{
    set_common(p, "perlmutter");
    p->ranks_per_node = 4;
    p->memory_bytes = 40 * GiB;
    p->gemm_flops = 280e12;
    p->peak_flops = 312e12;
    p->alpha_intra_s = 5e-6;
    p->beta_intra_Bps = 76e9;
    p->alpha_inter_s = 10e-6;
    p->beta_inter_Bps = 4 * 25e9;
    add_bw(p, 1, 2, 76);
    add_bw(p, 1, 4, 225);
    add_bw(p, 2, 2, 76);
    p->mem_Bps = 1.555e12;
    p->gemm_half_dim = 52;
    p->gemm_call_s = 6e-6;
    p->intra_overlap = 1;
    /* the paper's runs here used Megatron-LM's model code, whose default
     * softmax kernel writes the scores (FlashAttention only on request) */
    p->attention_fused = 0;
    p->precision = FF_PLAN_BF16_MIXED;
    p->axonn_table = FF_AXONN_TABLE_PERLMUTTER;
}

static void frontier(ff_profile *p)
{
    set_common(p, "frontier");
    p->ranks_per_node = 8;
    p->memory_bytes = 64 * GiB;
    p->gemm_flops = 125e12;
    p->peak_flops = 191.5e12;
    p->alpha_intra_s = 5e-6;
    p->beta_intra_Bps = 50e9;
    p->alpha_inter_s = 10e-6;
    p->beta_inter_Bps = 4 * 25e9;
    add_bw(p, 1, 2, 129);
    add_bw(p, 1, 4, 52);
    add_bw(p, 1, 8, 135);
    add_bw(p, 2, 2, 50);
    add_bw(p, 2, 4, 72);
    add_bw(p, 4, 2, 36);
    p->mem_Bps = 1.6e12;
    p->gemm_half_dim = 128;
    p->gemm_call_s = 6.5e-6;
    p->intra_overlap = 1;
    p->attention_fused = 1; /* LitGPT's runs: PyTorch's fused attention */
    p->precision = FF_PLAN_BF16_MIXED;
    p->axonn_table = FF_AXONN_TABLE_FRONTIER;
}

static void alps(ff_profile *p)
{
    set_common(p, "alps");
    p->ranks_per_node = 4;
    p->memory_bytes = 96 * GiB;
    p->gemm_flops = 813e12;
    p->peak_flops = 989e12;
    p->alpha_intra_s = 5e-6;
    p->beta_intra_Bps = 150e9; /* NVLink 4 between the GH200s of a node */
    p->alpha_inter_s = 10e-6;
    p->beta_inter_Bps = 4 * 25e9;
    p->mem_Bps = 4.0e12;
    p->gemm_half_dim = 52;
    p->gemm_call_s = 6e-6;
    p->intra_overlap = 1;
    p->attention_fused = 1;
    p->precision = FF_PLAN_BF16_MIXED;
}

/* This machine: 2 cores, 24 GiB shared by 2 ranks, Open MPI over shared
 * memory; the inter-node numbers are those of the emulated cluster
 * (an external cluster emulator, docs/design.md §8: 1 Gbit/s links). Sources in docs/planner.md. */
static void this_machine(ff_profile *p)
{
    set_common(p, "this");
    p->ranks_per_node = 2;
    p->memory_bytes = 12 * GiB;
    /* OpenBLAS 0.3.21 sgemm, one thread, core "Zen" (AVX2: this VM's CPU has
     * no AVX-512), 77-86 GFLOP/s on 512..4096-row shapes, measured
     * 2026-11-21 (docs/linear.md); the GPT issue's 267 was an AVX-512 VM */
    p->gemm_flops = 80e9;
    p->peak_flops = 80e9; /* the empirical peak (docs/design.md §8) */
    p->alpha_intra_s = 2e-6;
    p->beta_intra_Bps = 5e9;
    p->alpha_inter_s = 50e-6;
    p->beta_inter_Bps = 1.25e8;
    p->mem_Bps = 10e9;
    p->gemm_half_dim = 32;
    p->cores_per_node = 2;
    p->intra_overlap = 0;
}

static const struct {
    const char *name;
    void (*fill)(ff_profile *);
} machine_presets[] = {
    {"perlmutter", perlmutter},
    {"frontier", frontier},
    {"alps", alps},
    {"this", this_machine},
};
enum { NMACHINES = sizeof machine_presets / sizeof machine_presets[0] };

const char *ff_profile_preset_name(size_t i)
{
    return i < NMACHINES ? machine_presets[i].name : NULL;
}

int ff_profile_preset(const char *name, ff_profile *out, char *err, size_t err_len)
{
    for (size_t i = 0; name && i < NMACHINES; i++)
        if (!strcmp(name, machine_presets[i].name)) {
            machine_presets[i].fill(out);
            return FF_OK;
        }
    return ff_format_error(err, err_len, FF_EINVAL,
                           "unknown machine '%s' (known: perlmutter, frontier, alps, this, or a "
                           "profile file ending in .json)",
                           name ? name : "");
}

/* ---- reading: the strict JSON reader of util/json.h ---- */

enum { MAX_TEXT = 1 << 20 };

/* ---- the schema ---- */

typedef enum { K_STRING, K_NUMBER, K_INT, K_BW, K_OBJECT, K_PICKS } key_type;

typedef struct {
    const char *name;
    key_type type;
    unsigned char planner; /* required by the planner */
    unsigned char line;    /* the writer's line */
    double lo, hi;         /* numbers: inclusive range; lo_open: lo excluded */
    unsigned char lo_open;
} key_spec;

/* One table for reading, checking and writing every top-level key. */
static const key_spec keys[FF_PK_COUNT] = {
    [FF_PK_FORMAT] = {"format", K_STRING, 1, 0, 0, 0, 0},
    [FF_PK_VERSION] = {"version", K_INT, 1, 0, 1, 1e9, 0},
    [FF_PK_NAME] = {"name", K_STRING, 0, 0, 0, 0, 0},
    [FF_PK_RANKS_PER_NODE] = {"ranks_per_node", K_INT, 1, 0, 1, 1e6, 0},
    [FF_PK_CORES_PER_NODE] = {"cores_per_node", K_INT, 0, 0, 0, 1e6, 0},
    [FF_PK_MEMORY_BYTES] = {"memory_bytes", K_NUMBER, 1, 0, 0, 1e18, 1},
    [FF_PK_GEMM_FLOPS] = {"gemm_flops", K_NUMBER, 1, 0, 0, 1e18, 1},
    [FF_PK_PEAK_FLOPS] = {"peak_flops", K_NUMBER, 0, 0, 0, 1e18, 1},
    [FF_PK_ALPHA_INTRA] = {"alpha_intra_s", K_NUMBER, 1, 1, 0, 10, 0},
    [FF_PK_BETA_INTRA] = {"beta_intra_Bps", K_NUMBER, 1, 1, 0, 1e15, 1},
    [FF_PK_ALPHA_INTER] = {"alpha_inter_s", K_NUMBER, 1, 1, 0, 10, 0},
    [FF_PK_BETA_INTER] = {"beta_inter_Bps", K_NUMBER, 1, 1, 0, 1e15, 1},
    [FF_PK_INTRA_BW] = {"intra_bw", K_BW, 0, 1, 0, 0, 0},
    [FF_PK_MEM_BPS] = {"mem_Bps", K_NUMBER, 0, 2, 0, 1e16, 1},
    [FF_PK_GEMM_HALF_DIM] = {"gemm_half_dim", K_NUMBER, 0, 2, 0, 1e6, 0},
    [FF_PK_GEMM_CALL_S] = {"gemm_call_s", K_NUMBER, 0, 2, 0, 1, 0},
    [FF_PK_INTRA_OVERLAP] = {"intra_overlap", K_NUMBER, 0, 2, 0, 1, 0},
    [FF_PK_ATTENTION_FUSED] = {"attention_fused", K_INT, 0, 2, 0, 1, 0},
    [FF_PK_PRECISION] = {"precision", K_STRING, 0, 2, 0, 0, 0},
    [FF_PK_REDUCE_BPS] = {"reduce_Bps", K_NUMBER, 0, 3, 0, 1e16, 0},
    [FF_PK_SMALL_MAX_INTRA] = {"small_max_intra_B", K_NUMBER, 0, 4, 0, 1e15, 0},
    [FF_PK_ALPHA_INTRA_SMALL] = {"alpha_intra_small_s", K_NUMBER, 0, 4, 0, 10, 0},
    [FF_PK_BETA_INTRA_SMALL] = {"beta_intra_small_Bps", K_NUMBER, 0, 4, 0, 1e15, 0},
    [FF_PK_SMALL_MAX_INTER] = {"small_max_inter_B", K_NUMBER, 0, 5, 0, 1e15, 0},
    [FF_PK_ALPHA_INTER_SMALL] = {"alpha_inter_small_s", K_NUMBER, 0, 5, 0, 10, 0},
    [FF_PK_BETA_INTER_SMALL] = {"beta_inter_small_Bps", K_NUMBER, 0, 5, 0, 1e15, 0},
    [FF_PK_FIT] = {"fit", K_OBJECT, 0, 6, 0, 0, 0},
    [FF_PK_PICKS] = {"picks", K_PICKS, 0, 8, 0, 0, 0},
};
enum { LINE_EXTRA = 7 }; /* unknown keys: after "fit", before "picks" */

const char *ff_profile_key_name(ff_profile_key k)
{
    return k >= 0 && k < FF_PK_COUNT ? keys[k].name : NULL;
}

/* "intra_bw": [{"inner": 1, "size": 2, "Bps": 7.6e10}, ...] */
static int read_intra_bw(ff_json *r, ff_profile_doc *d)
{
    int open = ff_json_open(r, '[');
    if (open <= 0)
        return r->rc;
    for (;;) {
        if (d->n_intra_bw >= FF_PROFILE_MAX_BW)
            return ff_json_fail(r, FF_EINVAL, "\"intra_bw\" has more than %d entries",
                                FF_PROFILE_MAX_BW);
        if (ff_json_expect(r, '{'))
            return r->rc;
        double v[3] = {0, 0, 0};
        int seen[3] = {0, 0, 0};
        static const char *const names[3] = {"inner", "size", "Bps"};
        ff_json_skip_ws(r);
        if (r->p < r->end && *r->p == '}') {
            r->p++;
        } else {
            for (;;) {
                char key[64];
                if (ff_json_string(r, key, sizeof key) || ff_json_expect(r, ':'))
                    return r->rc;
                int which = -1;
                for (int i = 0; i < 3; i++)
                    if (!strcmp(key, names[i]))
                        which = i;
                if (which < 0) {
                    if (ff_json_skip_value(r, 2))
                        return r->rc;
                } else {
                    if (seen[which])
                        return ff_json_fail(r, FF_EINVAL, "\"intra_bw\" entry repeats \"%s\"", key);
                    seen[which] = 1;
                    if (ff_json_number(r, &v[which]))
                        return r->rc;
                }
                int more = ff_json_next_member(r, '}');
                if (more < 0)
                    return r->rc;
                if (!more)
                    break;
            }
        }
        for (int i = 0; i < 3; i++)
            if (!seen[i])
                return ff_json_fail(r, FF_EINVAL, "an \"intra_bw\" entry lacks \"%s\"", names[i]);
        if (ff_json_check_range(r, "inner", v[0], 1, 1e6, 0, 1) ||
            ff_json_check_range(r, "size", v[1], 2, 1e6, 0, 1) ||
            ff_json_check_range(r, "Bps", v[2], 0, 1e15, 1, 0))
            return r->rc;
        d->intra_bw[d->n_intra_bw++] = (ff_intra_bw){(int)v[0], (int)v[1], v[2]};
        int more = ff_json_next_member(r, ']');
        if (more <= 0)
            return r->rc;
    }
}

/* ---- picks ---- */

enum { P_COLL, P_NODES, P_PER_NODE, P_MIN, P_MAX, P_ALGO, P_MODEL, P_SIZES, NPICKKEYS };
static const char *const pick_keys[NPICKKEYS] = {"coll",  "nodes", "per_node",   "min_B",
                                                 "max_B", "algo",  "model_algo", "sizes"};
enum { MAX_RANKS = 1 << 24 };

static int coll_parse(const char *name)
{
    for (int c = 0; c < FF_NCOLL; c++)
        if (!strcmp(name, ff_coll_name((ff_coll)c)))
            return c;
    return -1;
}

/* One pick: {"coll":"allreduce","nodes":2,"per_node":2,"min_B":8192,
 * "max_B":32768,"algo":"rec-whole","model_algo":"hier-ring","sizes":1};
 * the first six required, other keys ignored; checked as ff_coll_model_ok
 * checks a pick (comm/select.c). */
static int read_pick(ff_json *r, ff_profile_pick *q)
{
    ff_json_skip_ws(r);
    if (ff_json_expect(r, '{'))
        return r->rc;
    int seen[NPICKKEYS] = {0};
    double v[NPICKKEYS] = {0};
    char str[NPICKKEYS][32] = {{0}};
    ff_json_skip_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
    } else {
        for (;;) {
            char key[64];
            if (ff_json_string(r, key, sizeof key) || ff_json_expect(r, ':'))
                return r->rc;
            int which = -1;
            for (int i = 0; i < NPICKKEYS; i++)
                if (!strcmp(key, pick_keys[i]))
                    which = i;
            if (which < 0) {
                if (ff_json_skip_value(r, 3))
                    return r->rc;
            } else {
                if (seen[which])
                    return ff_json_fail(r, FF_EINVAL, "\"%s\" appears twice", key);
                seen[which] = 1;
                if (which == P_COLL || which == P_ALGO || which == P_MODEL) {
                    if (!ff_json_at_string(r))
                        return ff_json_fail(r, FF_EINVAL, "\"%s\" must be a string", key);
                    if (ff_json_string(r, str[which], sizeof str[which]))
                        return r->rc;
                } else {
                    if (!ff_json_at_number(r))
                        return ff_json_fail(r, FF_EINVAL, "\"%s\" must be a number", key);
                    if (ff_json_number(r, &v[which]))
                        return r->rc;
                }
            }
            int more = ff_json_next_member(r, '}');
            if (more < 0)
                return r->rc;
            if (!more)
                break;
        }
    }
    for (int i = 0; i <= P_ALGO; i++)
        if (!seen[i])
            return ff_json_fail(r, FF_EINVAL, "lacks \"%s\"", pick_keys[i]);
    if (ff_json_check_range(r, "nodes", v[P_NODES], 1, MAX_RANKS, 0, 1) ||
        ff_json_check_range(r, "per_node", v[P_PER_NODE], 1, MAX_RANKS, 0, 1) ||
        ff_json_check_range(r, "min_B", v[P_MIN], 0, 1e300, 0, 0) ||
        ff_json_check_range(r, "max_B", v[P_MAX], 0, 1e300, 0, 0) ||
        (seen[P_SIZES] && ff_json_check_range(r, "sizes", v[P_SIZES], 0, 1e9, 0, 1)))
        return r->rc;
    int coll = coll_parse(str[P_COLL]), algo = ff_algo_parse(str[P_ALGO]);
    int model = seen[P_MODEL] ? ff_algo_parse(str[P_MODEL]) : -1;
    int nodes = (int)v[P_NODES], per_node = (int)v[P_PER_NODE];
    if (coll < 0)
        return ff_json_fail(r, FF_EINVAL,
                            "\"coll\" is \"%s\", expected allgather, reduce_scatter, allreduce or "
                            "alltoall",
                            str[P_COLL]);
    if (algo < 0 || algo == FF_ALGO_AUTO || algo == FF_ALGO_MPI)
        return ff_json_fail(r, FF_EINVAL,
                            "\"algo\" is \"%s\", expected one of fourfold's algorithms (ring, rec, "
                            "rec-whole, direct, hier-ring, hier-rec)",
                            str[P_ALGO]);
    if (!ff_algo_supports((ff_algo)algo, (ff_coll)coll))
        return ff_json_fail(r, FF_EINVAL, "\"algo\" %s does not implement %s", str[P_ALGO],
                            str[P_COLL]);
    if (seen[P_MODEL] && model < 0)
        return ff_json_fail(r, FF_EINVAL, "\"model_algo\" is \"%s\", not an algorithm",
                            str[P_MODEL]);
    if (nodes > MAX_RANKS / per_node || nodes * per_node < 2)
        return ff_json_fail(r, FF_EINVAL, "\"nodes\" x \"per_node\" = %g, expected 2 to %d ranks",
                            v[P_NODES] * v[P_PER_NODE], MAX_RANKS);
    if (!(v[P_MAX] > v[P_MIN]))
        return ff_json_fail(r, FF_EINVAL, "\"max_B\" %g is not above \"min_B\" %g", v[P_MAX],
                            v[P_MIN]);
    q->rule =
        (ff_coll_pick_rule){(ff_coll)coll, nodes, per_node, v[P_MIN], v[P_MAX], (ff_algo)algo};
    q->model_algo = model;
    q->sizes = seen[P_SIZES] ? (int)v[P_SIZES] : -1;
    return FF_OK;
}

/* "picks": [pick, ...], at most FF_COLL_MAX_PICKS */
static int read_picks(ff_json *r, ff_profile_doc *d)
{
    if (!ff_json_at(r, '['))
        return ff_json_fail(r, FF_EINVAL, "\"picks\" must be a list [...]");
    r->p++;
    ff_json_skip_ws(r);
    if (r->p < r->end && *r->p == ']') {
        r->p++;
        return FF_OK;
    }
    for (;;) {
        snprintf(r->where, sizeof r->where, "pick %d: ", d->n_picks + 1);
        if (d->n_picks == FF_COLL_MAX_PICKS)
            return ff_json_fail(r, FF_EINVAL, "more than %d picks in \"picks\"", FF_COLL_MAX_PICKS);
        if (read_pick(r, &d->picks[d->n_picks]))
            return r->rc;
        d->n_picks++;
        snprintf(r->where, sizeof r->where, "\"picks\" after pick %d: ", d->n_picks);
        int more = ff_json_next_member(r, ']');
        if (more < 0)
            return r->rc;
        if (!more)
            break;
    }
    r->where[0] = '\0';
    return FF_OK;
}

/* ---- the document ---- */

static void doc_clear(ff_profile_doc *d)
{
    memset(d, 0, sizeof *d);
    for (int i = 0; i < FF_COLL_MAX_PICKS; i++)
        d->picks[i].model_algo = d->picks[i].sizes = -1;
}

void ff_profile_doc_init(ff_profile_doc *d)
{
    doc_clear(d);
    d->has[FF_PK_FORMAT] = d->has[FF_PK_VERSION] = 1;
    d->num[FF_PK_VERSION] = 1;
}

void ff_profile_doc_free(ff_profile_doc *d)
{
    if (!d)
        return;
    free(d->fit);
    free(d->extra);
    d->fit = d->extra = NULL;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* text[from, to) as a new string; NULL if out of memory */
static char *copy_span(const char *from, const char *to)
{
    size_t n = (size_t)(to - from);
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, from, n);
        s[n] = '\0';
    }
    return s;
}

/* Keeps an unknown key's member, "key": value, verbatim. */
static int keep_extra(ff_json *r, ff_profile_doc *d, const char *from, const char *to)
{
    size_t old = d->extra ? strlen(d->extra) : 0, n = (size_t)(to - from);
    char *s = realloc(d->extra, old + 3 + n + 1);
    if (!s)
        return ff_json_fail(r, FF_ENOMEM, "out of memory");
    if (old) {
        memcpy(s + old, ",\n ", 3);
        old += 3;
    }
    memcpy(s + old, from, n);
    s[old + n] = '\0';
    d->extra = s;
    return FF_OK;
}

/* One known key's value into d; format into `format`. */
static int read_member(ff_json *r, int k, ff_profile_doc *d, char *format, size_t format_len)
{
    const key_spec *s = &keys[k];
    switch (s->type) {
    case K_STRING:
        if (!ff_json_at_string(r))
            return ff_json_fail(r, FF_EINVAL, "\"%s\" must be a string", s->name);
        if (k == FF_PK_PRECISION) { /* one of two words */
            char v[32];
            if (ff_json_string(r, v, sizeof v))
                return r->rc;
            if (strcmp(v, "fp32") && strcmp(v, "bf16-mixed"))
                return ff_json_fail(r, FF_EINVAL,
                                    "\"precision\" \"%s\": expected \"fp32\" or "
                                    "\"bf16-mixed\"",
                                    v);
            d->num[k] = v[0] == 'b' ? FF_PLAN_BF16_MIXED : FF_PLAN_FP32;
            return FF_OK;
        }
        return k == FF_PK_FORMAT ? ff_json_string(r, format, format_len)
                                 : ff_json_string(r, d->name, sizeof d->name);
    case K_BW: return read_intra_bw(r, d);
    case K_PICKS: return read_picks(r, d);
    case K_OBJECT: {
        if (!ff_json_at(r, '{'))
            return ff_json_fail(r, FF_EINVAL, "\"%s\" must be an object {...}", s->name);
        const char *from = r->p;
        if (ff_json_skip_value(r, 1))
            return r->rc;
        if (!(d->fit = copy_span(from, r->p)))
            return ff_json_fail(r, FF_ENOMEM, "out of memory");
        return FF_OK;
    }
    case K_NUMBER:
    case K_INT: break;
    }
    if (!ff_json_at_number(r))
        return ff_json_fail(r, FF_EINVAL, "\"%s\" must be a number", s->name);
    double v;
    if (ff_json_number(r, &v))
        return r->rc;
    if (k == FF_PK_VERSION && v != 1)
        return ff_json_fail(r, FF_EINVAL,
                            "version %g is not supported (this fourfold reads version 1)", v);
    if (ff_json_check_range(r, s->name, v, s->lo, s->hi, s->lo_open, s->type == K_INT))
        return r->rc;
    d->num[k] = v;
    return FF_OK;
}

/* A level's second regime: all three keys, a small beta > 0. */
static int check_regime(ff_json *r, const ff_profile_doc *d, int small_max)
{
    if (!d->has[small_max] || d->num[small_max] <= 0)
        return FF_OK;
    for (int k = small_max + 1; k <= small_max + 2; k++) {
        if (!d->has[k])
            return ff_json_fail(r, FF_EINVAL,
                                "\"%s\" is %g but \"%s\" is missing (a second regime needs "
                                "both its alpha and beta)",
                                keys[small_max].name, d->num[small_max], keys[k].name);
    }
    if (!(d->num[small_max + 2] > 0))
        return ff_json_fail(r, FF_EINVAL,
                            "\"%s\" is %g where \"%s\" is %g: a second regime needs a beta > 0",
                            keys[small_max + 2].name, d->num[small_max + 2], keys[small_max].name,
                            d->num[small_max]);
    return FF_OK;
}

static int parse_doc(ff_json *r, ff_profile_need need, ff_profile_doc *d)
{
    char format[64] = "";
    if (memchr(r->begin, '\0', (size_t)(r->end - r->begin)))
        return ff_json_fail(r, FF_ECORRUPT, "contains a NUL byte (not a text file)");
    if (ff_json_expect(r, '{'))
        return r->rc;
    ff_json_skip_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
    } else {
        for (;;) {
            ff_json_skip_ws(r);
            const char *member = r->p;
            char key[128];
            if (ff_json_string(r, key, sizeof key) || ff_json_expect(r, ':'))
                return r->rc;
            int k = -1;
            for (int i = 0; i < FF_PK_COUNT; i++)
                if (!strcmp(key, keys[i].name))
                    k = i;
            if (k < 0) { /* a key this version does not know: kept as it is */
                if (ff_json_skip_value(r, 1) || keep_extra(r, d, member, r->p))
                    return r->rc;
            } else {
                if (d->has[k])
                    return ff_json_fail(r, FF_EINVAL, "key \"%s\" appears twice", key);
                d->has[k] = 1;
                if (read_member(r, k, d, format, sizeof format))
                    return r->rc;
            }
            int more = ff_json_next_member(r, '}');
            if (more < 0)
                return r->rc;
            if (!more)
                break;
        }
    }
    ff_json_skip_ws(r);
    if (r->p != r->end)
        return ff_json_fail(r, FF_ECORRUPT, "unexpected text after the profile object");
    if (d->has[FF_PK_FORMAT] && strcmp(format, "fourfold-profile") != 0)
        return ff_json_fail(r, FF_EINVAL, "\"format\" is \"%s\", expected \"fourfold-profile\"",
                            format);
    for (int k = 0; k < FF_PK_COUNT; k++)
        if ((k == FF_PK_FORMAT || (need == FF_PROFILE_FOR_PLANNER && keys[k].planner)) &&
            !d->has[k])
            return ff_json_fail(r, FF_EINVAL, "required key \"%s\" is missing", keys[k].name);
    if (check_regime(r, d, FF_PK_SMALL_MAX_INTRA) || check_regime(r, d, FF_PK_SMALL_MAX_INTER))
        return r->rc;
    return FF_OK;
}

int ff_profile_doc_parse(const char *text, size_t len, const char *source, ff_profile_need need,
                         ff_profile_doc *d, char *err, size_t err_len)
{
    doc_clear(d);
    ff_json rd;
    ff_json_init(&rd, text, len, "profile", source, err, err_len);
    int rc = text ? parse_doc(&rd, need, d) : ff_json_fail(&rd, FF_EINVAL, "no text");
    if (rc != FF_OK) {
        ff_profile_doc_free(d);
        ff_profile_doc_init(d);
        return rc;
    }
    snprintf(d->source, sizeof d->source, "%s", rd.source);
    if (!d->has[FF_PK_NAME])
        snprintf(d->name, sizeof d->name, "%s", base_name(rd.source));
    return FF_OK;
}

int ff_profile_doc_load(const char *path, ff_profile_need need, ff_profile_doc *d, char *err,
                        size_t err_len)
{
    ff_profile_doc_init(d);
    char *text;
    size_t n;
    int rc = ff_json_read_file(path, "profile", MAX_TEXT, &text, &n, err, err_len);
    if (rc == FF_OK)
        rc = ff_profile_doc_parse(text, n, path, need, d, err, err_len);
    free(text);
    return rc;
}

/* ---- views: the planner's profile, the collective model ---- */

int ff_profile_doc_machine(const ff_profile_doc *d, ff_profile *out, char *err, size_t err_len)
{
    for (int k = 0; k < FF_PK_COUNT; k++)
        if (keys[k].planner && !d->has[k])
            return ff_format_error(err, err_len, FF_EINVAL,
                                   "profile %s: required key \"%s\" is missing", d->source,
                                   keys[k].name);
    const double *v = d->num;
    const unsigned char *has = d->has;
    ff_profile p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "%s", d->name);
    p.ranks_per_node = (int)v[FF_PK_RANKS_PER_NODE];
    p.memory_bytes = v[FF_PK_MEMORY_BYTES];
    p.gemm_flops = v[FF_PK_GEMM_FLOPS];
    p.peak_flops = has[FF_PK_PEAK_FLOPS] ? v[FF_PK_PEAK_FLOPS] : p.gemm_flops;
    p.alpha_intra_s = v[FF_PK_ALPHA_INTRA];
    p.beta_intra_Bps = v[FF_PK_BETA_INTRA];
    p.alpha_inter_s = v[FF_PK_ALPHA_INTER];
    p.beta_inter_Bps = v[FF_PK_BETA_INTER];
    p.n_intra_bw = d->n_intra_bw;
    memcpy(p.intra_bw, d->intra_bw, sizeof p.intra_bw);
    /* defaults for a measured profile, which `fourfold bench` takes on a CPU
     * machine: elementwise work at a sixteenth of the GEMM rate in bytes,
     * OpenBLAS-like efficiency, intra-node transfers are CPU copies */
    p.mem_Bps = has[FF_PK_MEM_BPS] ? v[FF_PK_MEM_BPS] : p.gemm_flops / 16;
    p.gemm_half_dim = has[FF_PK_GEMM_HALF_DIM] ? v[FF_PK_GEMM_HALF_DIM] : 32;
    p.gemm_call_s = v[FF_PK_GEMM_CALL_S]; /* (absent: 0) */
    p.cores_per_node = (int)v[FF_PK_CORES_PER_NODE];
    p.intra_overlap = has[FF_PK_INTRA_OVERLAP] ? v[FF_PK_INTRA_OVERLAP] : 0;
    p.attention_fused = (int)v[FF_PK_ATTENTION_FUSED]; /* (absent: 0) */
    p.precision = (int)v[FF_PK_PRECISION];             /* (absent: fp32) */
    p.axonn_table = FF_AXONN_TABLE_NONE;
    *out = p;
    return FF_OK;
}

void ff_profile_doc_from_machine(ff_profile_doc *d, const ff_profile *p)
{
    ff_profile_doc_init(d);
    ff_profile_doc_set_name(d, p->name);
    ff_profile_doc_set(d, FF_PK_RANKS_PER_NODE, p->ranks_per_node);
    ff_profile_doc_set(d, FF_PK_CORES_PER_NODE, p->cores_per_node);
    ff_profile_doc_set(d, FF_PK_MEMORY_BYTES, p->memory_bytes);
    ff_profile_doc_set(d, FF_PK_GEMM_FLOPS, p->gemm_flops);
    ff_profile_doc_set(d, FF_PK_PEAK_FLOPS, p->peak_flops);
    ff_profile_doc_set(d, FF_PK_ALPHA_INTRA, p->alpha_intra_s);
    ff_profile_doc_set(d, FF_PK_BETA_INTRA, p->beta_intra_Bps);
    ff_profile_doc_set(d, FF_PK_ALPHA_INTER, p->alpha_inter_s);
    ff_profile_doc_set(d, FF_PK_BETA_INTER, p->beta_inter_Bps);
    d->has[FF_PK_INTRA_BW] = 1;
    for (int i = 0; i < p->n_intra_bw && i < FF_PROFILE_MAX_BW; i++)
        d->intra_bw[d->n_intra_bw++] = p->intra_bw[i];
    ff_profile_doc_set(d, FF_PK_MEM_BPS, p->mem_Bps);
    ff_profile_doc_set(d, FF_PK_GEMM_HALF_DIM, p->gemm_half_dim);
    if (p->gemm_call_s > 0) /* (a CPU's profile stays as it was) */
        ff_profile_doc_set(d, FF_PK_GEMM_CALL_S, p->gemm_call_s);
    ff_profile_doc_set(d, FF_PK_INTRA_OVERLAP, p->intra_overlap);
    if (p->attention_fused)
        ff_profile_doc_set(d, FF_PK_ATTENTION_FUSED, p->attention_fused);
    ff_profile_doc_set(d, FF_PK_PRECISION, p->precision);
}

int ff_profile_doc_coll_model(const ff_profile_doc *d, ff_coll_model *m, char *err, size_t err_len)
{
    static const struct {
        ff_profile_key key;
        size_t offset;
    } fields[] = {
        {FF_PK_ALPHA_INTRA, offsetof(ff_coll_model, alpha_intra_s)},
        {FF_PK_BETA_INTRA, offsetof(ff_coll_model, beta_intra_Bps)},
        {FF_PK_ALPHA_INTER, offsetof(ff_coll_model, alpha_inter_s)},
        {FF_PK_BETA_INTER, offsetof(ff_coll_model, beta_inter_Bps)},
        {FF_PK_REDUCE_BPS, offsetof(ff_coll_model, reduce_Bps)},
        {FF_PK_SMALL_MAX_INTRA, offsetof(ff_coll_model, small_max_intra_B)},
        {FF_PK_ALPHA_INTRA_SMALL, offsetof(ff_coll_model, alpha_intra_small_s)},
        {FF_PK_BETA_INTRA_SMALL, offsetof(ff_coll_model, beta_intra_small_Bps)},
        {FF_PK_SMALL_MAX_INTER, offsetof(ff_coll_model, small_max_inter_B)},
        {FF_PK_ALPHA_INTER_SMALL, offsetof(ff_coll_model, alpha_inter_small_s)},
        {FF_PK_BETA_INTER_SMALL, offsetof(ff_coll_model, beta_inter_small_Bps)},
    };
    ff_coll_model t = *m;
    /* a level without small_max has one regime */
    t.small_max_intra_B = t.small_max_inter_B = 0;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (d->has[fields[i].key])
            *(double *)((char *)&t + fields[i].offset) = d->num[fields[i].key];
    /* `bench profile` wrote the fit's additions rate, 0 where the samples
     * could not resolve it, before it timed them: keep the model's */
    if (t.reduce_Bps == 0)
        t.reduce_Bps = m->reduce_Bps;
    t.n_picks = d->n_picks;
    for (int i = 0; i < d->n_picks; i++)
        t.picks[i] = d->picks[i].rule;
    if (!ff_coll_model_ok(&t))
        return ff_format_error(err, err_len, FF_EINVAL,
                               "profile %s: not a valid collective model (ff_coll_model_ok)",
                               d->source);
    *m = t;
    return FF_OK;
}

/* ---- setters ---- */

void ff_profile_doc_set(ff_profile_doc *d, ff_profile_key k, double v)
{
    if (k < 0 || k >= FF_PK_COUNT ||
        (keys[k].type != K_NUMBER && keys[k].type != K_INT && k != FF_PK_PRECISION))
        return;
    d->num[k] = v;
    d->has[k] = 1;
}

void ff_profile_doc_set_name(ff_profile_doc *d, const char *name)
{
    snprintf(d->name, sizeof d->name, "%s", name ? name : "");
    d->has[FF_PK_NAME] = 1;
}

int ff_profile_doc_add_intra_bw(ff_profile_doc *d, int inner, int size, double Bps)
{
    d->has[FF_PK_INTRA_BW] = 1;
    if (d->n_intra_bw >= FF_PROFILE_MAX_BW)
        return FF_EINVAL;
    d->intra_bw[d->n_intra_bw++] = (ff_intra_bw){inner, size, Bps};
    return FF_OK;
}

int ff_profile_doc_set_picks(ff_profile_doc *d, const ff_profile_pick *picks, int n)
{
    if (n < 0 || n > FF_COLL_MAX_PICKS || (n > 0 && !picks))
        return FF_EINVAL;
    if (n > 0)
        memcpy(d->picks, picks, (size_t)n * sizeof *picks);
    d->n_picks = n;
    d->has[FF_PK_PICKS] = 1;
    return FF_OK;
}

/* ---- the writer ---- */

static void put_pick(ff_text *b, const ff_profile_pick *q)
{
    ff_text_printf(b, "{\"coll\":\"%s\",\"nodes\":%d,\"per_node\":%d,\"min_B\":",
                   ff_coll_name(q->rule.coll), q->rule.nodes, q->rule.per_node);
    ff_text_number(b, q->rule.min_B);
    ff_text_puts(b, ",\"max_B\":");
    ff_text_number(b, q->rule.max_B);
    ff_text_printf(b, ",\"algo\":\"%s\"", ff_algo_name(q->rule.algo));
    if (q->model_algo >= 0)
        ff_text_printf(b, ",\"model_algo\":\"%s\"", ff_algo_name((ff_algo)q->model_algo));
    if (q->sizes >= 0)
        ff_text_printf(b, ",\"sizes\":%d", q->sizes);
    ff_text_puts(b, "}");
}

/* Before a member: a comma, and a new line where the writer's line changes. */
static void separate(ff_text *b, int *first, int *line, int this_line)
{
    if (!*first)
        ff_text_puts(b, this_line != *line ? ",\n " : ",");
    *first = 0;
    *line = this_line;
}

char *ff_profile_doc_to_json(const ff_profile_doc *d, size_t *len)
{
    ff_text b = {0};
    int first = 1, line = 0;
    ff_text_puts(&b, "{");
    for (int k = 0; k < FF_PK_COUNT; k++) {
        const key_spec *s = &keys[k];
        if (k == FF_PK_PICKS && d->extra) { /* unknown keys before the picks */
            separate(&b, &first, &line, LINE_EXTRA);
            ff_text_puts(&b, d->extra);
        }
        if (k != FF_PK_FORMAT && k != FF_PK_VERSION && !d->has[k])
            continue;
        separate(&b, &first, &line, s->line);
        ff_text_printf(&b, "\"%s\":", s->name);
        switch (k) {
        case FF_PK_FORMAT: ff_text_puts(&b, "\"fourfold-profile\""); break;
        case FF_PK_VERSION: ff_text_puts(&b, "1"); break;
        case FF_PK_NAME: ff_text_json_string(&b, d->name, 1); break;
        case FF_PK_PRECISION:
            ff_text_puts(&b, d->num[k] == FF_PLAN_BF16_MIXED ? "\"bf16-mixed\"" : "\"fp32\"");
            break;
        case FF_PK_FIT: ff_text_puts(&b, d->fit ? d->fit : "{}"); break;
        case FF_PK_INTRA_BW:
            ff_text_puts(&b, "[");
            for (int i = 0; i < d->n_intra_bw; i++) {
                ff_text_printf(&b, "%s{\"inner\":%d,\"size\":%d,\"Bps\":", i ? "," : "",
                               d->intra_bw[i].inner, d->intra_bw[i].size);
                ff_text_number(&b, d->intra_bw[i].Bps);
                ff_text_puts(&b, "}");
            }
            ff_text_puts(&b, "]");
            break;
        case FF_PK_PICKS:
            ff_text_puts(&b, "[");
            for (int i = 0; i < d->n_picks; i++) {
                ff_text_puts(&b, i ? ",\n  " : "\n  ");
                put_pick(&b, &d->picks[i]);
            }
            ff_text_puts(&b, "]");
            break;
        default:
            if (s->type == K_INT)
                ff_text_printf(&b, "%.0f", d->num[k]);
            else
                ff_text_number(&b, d->num[k]);
        }
    }
    ff_text_puts(&b, "}\n");
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    if (len)
        *len = b.n;
    return b.s;
}

int ff_profile_doc_save(const char *path, const ff_profile_doc *d, char *err, size_t err_len)
{
    size_t n = 0;
    char *text = ff_profile_doc_to_json(d, &n);
    if (!text)
        return ff_format_error(err, err_len, FF_ENOMEM, "profile %s: out of memory", path);
    /* what is written must read back: a value out of range stops here */
    ff_profile_doc *back = malloc(sizeof *back);
    char why[512] = "";
    int rc = back ? ff_profile_doc_parse(text, n, path, FF_PROFILE_FOR_COLL, back, why, sizeof why)
                  : FF_ENOMEM;
    if (back)
        ff_profile_doc_free(back);
    free(back);
    if (rc == FF_ENOMEM)
        rc = ff_format_error(err, err_len, FF_ENOMEM, "profile %s: out of memory", path);
    else if (rc != FF_OK)
        rc = ff_format_error(err, err_len, FF_EINVAL, "not written: %s", why);
    else if (ff_write_file_atomic(path, text, n) != 0)
        rc = ff_format_error(err, err_len, FF_EIO, "cannot write %s: %s", path, strerror(errno));
    free(text);
    return rc;
}

int ff_profile_doc_set_fit(ff_profile_doc *d, const ff_profile_fit *f)
{
    ff_text b = {0};
    ff_text_puts(&b, "{\"method\":");
    ff_text_json_string(&b, f->method, 1);
    ff_text_puts(&b, ",\"date\":");
    ff_text_json_string(&b, f->date, 1);
    ff_text_puts(&b, ",\"host\":");
    ff_text_json_string(&b, f->host, 1);
    ff_text_printf(&b, ",\"ranks\":%d,\"nodes\":%d,\"iters\":%d,\"gemm_shape\":", f->ranks,
                   f->nodes, f->iters);
    ff_text_json_string(&b, f->gemm_shape, 1);
    for (int l = 0; l < 2; l++) {
        const ff_profile_fit_level *v = &f->level[l];
        ff_text_printf(&b,
                       ",\"%s\":{\"measured\":%s,\"samples\":%d,\"rms_rel\":%.4f,\"max_rel\":%.4f}",
                       l ? "inter" : "intra", v->measured ? "true" : "false", v->samples,
                       v->rms_rel, v->max_rel);
    }
    if (f->curve_shapes > 0)
        ff_text_printf(&b, ",\"gemm\":{\"shapes\":%d,\"median_rel\":%.4f,\"max_rel\":%.4f}",
                       f->curve_shapes, f->curve_median_rel, f->curve_max_rel);
    ff_text_puts(&b, "}");
    if (b.failed) {
        free(b.s);
        return FF_ENOMEM;
    }
    free(d->fit);
    d->fit = b.s;
    d->has[FF_PK_FIT] = 1;
    return FF_OK;
}

/* ---- the public readers and writer (plan.h, comm.h): views of the document ---- */

int ff_profile_parse(const char *text, size_t len, const char *source, ff_profile *out, char *err,
                     size_t err_len)
{
    ff_profile_doc *d = malloc(sizeof *d);
    if (!d)
        return ff_format_error(err, err_len, FF_ENOMEM, "profile %s: out of memory",
                               source ? source : "(text)");
    int rc = ff_profile_doc_parse(text, len, source, FF_PROFILE_FOR_PLANNER, d, err, err_len);
    if (rc == FF_OK)
        rc = ff_profile_doc_machine(d, out, err, err_len);
    ff_profile_doc_free(d);
    free(d);
    return rc;
}

int ff_profile_load(const char *path, ff_profile *out, char *err, size_t err_len)
{
    ff_profile_doc *d = malloc(sizeof *d);
    if (!d)
        return ff_format_error(err, err_len, FF_ENOMEM, "profile %s: out of memory", path);
    int rc = ff_profile_doc_load(path, FF_PROFILE_FOR_PLANNER, d, err, err_len);
    if (rc == FF_OK)
        rc = ff_profile_doc_machine(d, out, err, err_len);
    ff_profile_doc_free(d);
    free(d);
    return rc;
}

size_t ff_profile_to_json(const ff_profile *p, char *buf, size_t len)
{
    ff_profile_doc *d = malloc(sizeof *d);
    char *text = NULL;
    size_t n = 0;
    if (d) {
        ff_profile_doc_from_machine(d, p);
        text = ff_profile_doc_to_json(d, &n);
        ff_profile_doc_free(d);
        free(d);
    }
    if (!text)
        n = 0;
    if (buf && len) {
        size_t c = n < len - 1 ? n : len - 1;
        if (c)
            memcpy(buf, text, c);
        buf[c] = '\0';
    }
    free(text);
    return n;
}

int ff_coll_model_read(const char *path, ff_coll_model *m, char *err, size_t err_len)
{
    ff_profile_doc *d = malloc(sizeof *d);
    if (!d)
        return ff_format_error(err, err_len, FF_ENOMEM, "profile %s: out of memory", path);
    int rc = ff_profile_doc_load(path, FF_PROFILE_FOR_COLL, d, err, err_len);
    if (rc == FF_OK)
        rc = ff_profile_doc_coll_model(d, m, err, err_len);
    ff_profile_doc_free(d);
    free(d);
    /* this reader's contract (comm.h): a bad value is a corrupt file */
    return rc == FF_EINVAL ? FF_ECORRUPT : rc;
}
