/* Per-layer plans (include/fourfold/layerplan.h): defaults, the check, the
 * JSON file and the match against a run (docs/planner.md, "Per-layer
 * plans").
 *
 * The file is one JSON object, format "fourfold-layer-plan", version 2:
 *   {"format": "fourfold-layer-plan", "version": 2,
 *    "model": {"layers": L, "heads": NH, "hidden": C, "vocab": V},
 *    "grid": [Gx, Gy, Gz, Gd], "batch": B, "seq": T, "micro_batches": u,
 *    "predicted_step_s": s, "panel_rows": P,
 *    "progress": "wait"|"poll"|"thread",
 *    "head": OPTS,
 *    "blocks": [{"checkpoint": 0|1, "qkv": OPTS, "attproj": OPTS, "fc": OPTS,
 *                "fcproj": OPTS}, ... L of them]}
 * with OPTS = {"decompose": 0..64, "oar": 0|1, "ors": 0|1, "oag": 0|1,
 * "ag_cache": 0|1, "wire": "fp32"|"bf16"}. Version 1 is the same without
 * "progress" (the mode the plan was searched for, not recorded): it is read
 * (progress -1) and written for such a plan. Version 3 adds "rs_cmm": 0|1
 * (the reduce-scatter collective matmul) to every OPTS, with "progress"
 * optional; it is written only for a plan that turns rs_cmm on somewhere,
 * so plans without it stay the files they were.
 *
 * The reader is strict: every key required, type- and range-checked, at
 * most once, no other key, nothing after the object. It reads the text
 * twice: first only "format" and "version" (so that another format or a
 * later version is reported as such, FF_ECORRUPT, whatever its other keys),
 * then everything. Messages name the file and the line (util/json.h). */
#include "fourfold/layerplan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/ctx.h"    /* FF_E* */
#include "fourfold/linear.h" /* FF_DECOMPOSE_MAX */
#include "util/file.h"
#include "util/json.h"
#include "util/text.h"

#define FORMAT "fourfold-layer-plan"

enum {
    MAX_LAYERS = 100000,  /* as `fourfold plan --layers` */
    MAX_TEXT = 128 << 20, /* about 1.2 KB per block */
    MAX_RANKS = 1 << 24,  /* as the planner */
    MAX_DIM = 1 << 30     /* heads, hidden, vocab */
};

static const char *const layer_names[FF_BLOCK_LAYERS] = {"qkv", "attproj", "fc", "fcproj"};

/* the file's names of FF_PROGRESS_WAIT, _POLL, _THREAD, by their values */
enum { NPROGRESS = 3 };
static const char *const progress_names[NPROGRESS] = {"wait", "poll", "thread"};
_Static_assert(FF_PROGRESS_WAIT == 0 && FF_PROGRESS_POLL == 1 && FF_PROGRESS_THREAD == 2,
               "progress_names is indexed by the mode");

enum { OPT_DECOMPOSE, OPT_OAR, OPT_ORS, OPT_OAG, OPT_AG_CACHE, OPT_WIRE, OPT_RS_CMM, NOPTS };
static const char *const opt_names[NOPTS] = {"decompose", "oar",  "ors",   "oag",
                                             "ag_cache",  "wire", "rs_cmm"};

void ff_layer_opts_default(ff_layer_opts *o)
{
    *o = (ff_layer_opts){
        .decompose = 0, .oar = 1, .ors = 1, .oag = 1, .ag_cache = 1, .wire_bytes = 4};
}

int ff_layer_plan_uniform(ff_layer_plan *p, int layers, const ff_layer_opts *opts, int checkpoint,
                          char *err, size_t err_len)
{
    memset(p, 0, sizeof *p);
    p->progress = -1;
    if (layers < 1 || layers > MAX_LAYERS)
        return ff_format_error(err, err_len, FF_EINVAL, "a plan of %d blocks: expected 1 to %d",
                               layers, MAX_LAYERS);
    p->blocks = calloc((size_t)layers, sizeof *p->blocks);
    if (!p->blocks)
        return ff_format_error(err, err_len, FF_ENOMEM, "out of memory for a plan of %d blocks",
                               layers);
    p->layers = layers;
    p->head = *opts;
    for (int l = 0; l < layers; l++) {
        p->blocks[l].checkpoint = checkpoint;
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            p->blocks[l].layer[i] = *opts;
    }
    return FF_OK;
}

void ff_layer_plan_free(ff_layer_plan *p)
{
    if (!p)
        return;
    free(p->blocks);
    memset(p, 0, sizeof *p);
}

/* ---- the check ---- */

/* The first option of o out of range, as a sentence into why; 0 if none. */
static int opts_bad(const ff_layer_opts *o, char *why, size_t len)
{
    if (o->decompose < 0 || o->decompose > FF_DECOMPOSE_MAX) {
        snprintf(why, len, "decompose %d is out of range (0 to %d)", o->decompose,
                 FF_DECOMPOSE_MAX);
        return 1;
    }
    const int sw[4] = {o->oar, o->ors, o->oag, o->ag_cache};
    for (int i = 0; i < 4; i++)
        if (sw[i] != 0 && sw[i] != 1) {
            snprintf(why, len, "%s is %d, expected 0 or 1", opt_names[OPT_OAR + i], sw[i]);
            return 1;
        }
    if (o->rs_cmm != 0 && o->rs_cmm != 1) {
        snprintf(why, len, "rs_cmm is %d, expected 0 or 1", o->rs_cmm);
        return 1;
    }
    if (o->wire_bytes != 4 && o->wire_bytes != 2) {
        snprintf(why, len, "wire is %d bytes, expected 4 (fp32) or 2 (bf16)", o->wire_bytes);
        return 1;
    }
    return 0;
}

int ff_layer_plan_check(const ff_layer_plan *p, char *err, size_t err_len)
{
    char why[160];
    if (p->layers < 1 || p->layers > MAX_LAYERS || !p->blocks)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "the plan has %d blocks, expected 1 to %d (with their options)",
                               p->layers, MAX_LAYERS);
    if (p->heads < 1 || p->hidden < 1 || p->vocab < 1 || p->heads > MAX_DIM ||
        p->hidden > MAX_DIM || p->vocab > MAX_DIM || p->hidden % p->heads)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "the plan's model (heads %d, hidden %lld, vocab %lld) is "
                               "impossible: sizes from 1 to 2^30, hidden divisible by heads",
                               p->heads, (long long)p->hidden, (long long)p->vocab);
    const ff_dims g = p->grid;
    if (g.x < 1 || g.y < 1 || g.z < 1 || g.d < 1 || (double)g.x * g.y * g.z * g.d > MAX_RANKS)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "the plan's grid %dx%dx%dx%d is impossible (sizes >= 1, at most "
                               "%d ranks)",
                               g.x, g.y, g.z, g.d, MAX_RANKS);
    if (p->batch < 0 || p->seq < 0 || p->micro_batches < 0 || p->panel_rows < 0 ||
        !(p->predicted_step_s >= 0) || !isfinite(p->predicted_step_s))
        return ff_format_error(err, err_len, FF_EINVAL,
                               "the plan's batch, seq, micro-batches and predicted step time "
                               "must be >= 0 (0: not given)");
    if (p->progress < -1 || p->progress > FF_PROGRESS_THREAD)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "the plan's progress mode %d is not one of wait, poll, thread",
                               p->progress);
    if (opts_bad(&p->head, why, sizeof why))
        return ff_format_error(err, err_len, FF_EINVAL, "the plan's head (wte): %s", why);
    for (int l = 0; l < p->layers; l++) {
        const ff_block_opts *b = &p->blocks[l];
        if (b->checkpoint != 0 && b->checkpoint != 1)
            return ff_format_error(err, err_len, FF_EINVAL,
                                   "the plan's block %d: checkpoint is %d, expected 0 or 1", l,
                                   b->checkpoint);
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            if (opts_bad(&b->layer[i], why, sizeof why))
                return ff_format_error(err, err_len, FF_EINVAL, "the plan's block %d %s: %s", l,
                                       layer_names[i], why);
    }
    return FF_OK;
}

/* ---- the writer ---- */

static void put_opts(ff_text *b, const ff_layer_opts *o, int version)
{
    ff_text_printf(b,
                   "{\"decompose\": %d, \"oar\": %d, \"ors\": %d, \"oag\": %d, \"ag_cache\": %d, ",
                   o->decompose, o->oar, o->ors, o->oag, o->ag_cache);
    if (o->wire_bytes == 4 || o->wire_bytes == 2)
        ff_text_printf(b, "\"wire\": \"%s\"", o->wire_bytes == 4 ? "fp32" : "bf16");
    else
        ff_text_printf(b, "\"wire\": %d", o->wire_bytes); /* refused when read */
    if (version >= 3)
        ff_text_printf(b, ", \"rs_cmm\": %d", o->rs_cmm);
    ff_text_puts(b, "}");
}

/* The lowest version that holds p (FF_LAYER_PLAN_VERSION's comment). */
static int plan_version(const ff_layer_plan *p)
{
    int rs = p->head.rs_cmm != 0;
    for (int l = 0; p->blocks && l < p->layers; l++)
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            rs |= p->blocks[l].layer[i].rs_cmm != 0;
    return rs ? 3 : p->progress >= 0 ? 2 : 1;
}

char *ff_layer_plan_to_json(const ff_layer_plan *p)
{
    ff_text b = {0};
    const int version = plan_version(p);
    ff_text_printf(&b,
                   "{\"format\": \"" FORMAT "\", \"version\": %d,\n"
                   " \"model\": {\"layers\": %d, \"heads\": %d, \"hidden\": %lld, \"vocab\": "
                   "%lld},\n"
                   " \"grid\": [%d, %d, %d, %d], \"batch\": %lld, \"seq\": %lld, "
                   "\"micro_batches\": %d, \"panel_rows\": %lld, ",
                   version, p->layers, p->heads, (long long)p->hidden, (long long)p->vocab,
                   p->grid.x, p->grid.y, p->grid.z, p->grid.d, (long long)p->batch,
                   (long long)p->seq, p->micro_batches, (long long)p->panel_rows);
    if (p->progress >= 0 && p->progress < NPROGRESS)
        ff_text_printf(&b, "\"progress\": \"%s\", ", progress_names[p->progress]);
    ff_text_puts(&b, "\"predicted_step_s\": ");
    ff_text_number(&b, p->predicted_step_s);
    ff_text_puts(&b, ",\n \"head\": ");
    put_opts(&b, &p->head, version);
    ff_text_puts(&b, ",\n \"blocks\": [");
    for (int l = 0; p->blocks && l < p->layers; l++) {
        ff_text_printf(&b, "%s\n  {\"checkpoint\": %d", l ? "," : "", p->blocks[l].checkpoint);
        for (int i = 0; i < FF_BLOCK_LAYERS; i++) {
            ff_text_printf(&b, ",\n   \"%s\": ", layer_names[i]);
            put_opts(&b, &p->blocks[l].layer[i], version);
        }
        ff_text_puts(&b, "}");
    }
    ff_text_puts(&b, "\n ]}\n");
    if (b.failed) {
        ff_text_free(&b);
        return NULL;
    }
    return b.s;
}

int ff_layer_plan_write(const ff_layer_plan *p, const char *path, char *err, size_t err_len)
{
    char why[384];
    if (ff_layer_plan_check(p, why, sizeof why) != FF_OK)
        return ff_format_error(err, err_len, FF_EINVAL, "plan %s not written: %s", path, why);
    char *text = ff_layer_plan_to_json(p);
    if (!text)
        return ff_format_error(err, err_len, FF_ENOMEM, "plan %s: out of memory", path);
    int rc = FF_OK;
    if (ff_write_file_atomic(path, text, strlen(text)) != 0)
        rc = ff_format_error(err, err_len, FF_EIO, "cannot write plan %s: %s", path,
                             strerror(errno));
    free(text);
    return rc;
}

/* ---- the reader ---- */

/* A required member's value, checked to be a number, an integer in [lo, hi]. */
static int read_int(ff_json *r, const char *key, double lo, double hi, int64_t *out)
{
    double v;
    *out = 0;
    if (!ff_json_at_number(r))
        return ff_json_fail(r, FF_EINVAL, "\"%s\" must be a number", key);
    if (ff_json_number(r, &v) || ff_json_check_range(r, key, v, lo, hi, 0, 1))
        return r->rc;
    *out = (int64_t)v;
    return FF_OK;
}

/* Reads `"key": ` of an object's next member into key; the index of key in
 * names[0..n), or fails (an unknown key, or one already seen). */
static int member_key(ff_json *r, const char *const *names, int n, int *seen, int *which)
{
    char key[64];
    *which = 0;
    if (ff_json_string(r, key, sizeof key) || ff_json_expect(r, ':'))
        return r->rc;
    for (int i = 0; i < n; i++)
        if (!strcmp(key, names[i])) {
            if (seen[i])
                return ff_json_fail(r, FF_EINVAL, "key \"%s\" appears twice", key);
            seen[i] = 1;
            *which = i;
            return FF_OK;
        }
    return ff_json_fail(r, FF_EINVAL, "unknown key \"%s\"", key);
}

/* After an object: each of names[0..n) was present. */
static int all_seen(ff_json *r, const char *what, const char *const *names, int n, const int *seen)
{
    for (int i = 0; i < n; i++)
        if (!seen[i])
            return ff_json_fail(r, FF_EINVAL, "%s lacks \"%s\"", what, names[i]);
    return FF_OK;
}

/* {"decompose": .., "oar": .., "ors": .., "oag": .., "ag_cache": .., "wire": ..} */
static int read_opts(ff_json *r, const char *what, int version, ff_layer_opts *o)
{
    if (!ff_json_at(r, '{'))
        return ff_json_fail(r, FF_EINVAL, "%s must be an object {...}", what);
    int seen[NOPTS] = {0};
    int more = ff_json_open(r, '{');
    while (more > 0) {
        int k;
        if (member_key(r, opt_names, NOPTS, seen, &k))
            return r->rc;
        int64_t v;
        if (k == OPT_WIRE) {
            char wire[16];
            if (!ff_json_at_string(r))
                return ff_json_fail(r, FF_EINVAL, "\"wire\" must be \"fp32\" or \"bf16\"");
            if (ff_json_string(r, wire, sizeof wire))
                return r->rc;
            if (strcmp(wire, "fp32") && strcmp(wire, "bf16"))
                return ff_json_fail(r, FF_EINVAL, "\"wire\" is \"%s\", expected fp32 or bf16",
                                    wire);
            o->wire_bytes = wire[0] == 'f' ? 4 : 2;
        } else if (k == OPT_RS_CMM && version < 3) {
            return ff_json_fail(
                r, FF_EINVAL, "\"rs_cmm\" is not a key of version %d (version 3 has it)", version);
        } else if (k == OPT_RS_CMM) {
            if (read_int(r, "rs_cmm", 0, 1, &v))
                return r->rc;
            o->rs_cmm = (int)v;
        } else {
            if (read_int(r, opt_names[k], 0, k == OPT_DECOMPOSE ? FF_DECOMPOSE_MAX : 1, &v))
                return r->rc;
            int *dst[] = {&o->decompose, &o->oar, &o->ors, &o->oag, &o->ag_cache};
            *dst[k] = (int)v;
        }
        more = ff_json_next_member(r, '}');
    }
    if (r->rc)
        return r->rc;
    if (version < 3)
        seen[OPT_RS_CMM] = 1; /* (version 3's key) */
    return all_seen(r, what, opt_names, NOPTS, seen);
}

enum { B_CHECKPOINT, B_QKV, B_ATTPROJ, B_FC, B_FCPROJ, NBKEYS };
static const char *const block_keys[NBKEYS] = {"checkpoint", "qkv", "attproj", "fc", "fcproj"};

static int read_block(ff_json *r, int index, int version, ff_block_opts *b)
{
    if (!ff_json_at(r, '{'))
        return ff_json_fail(r, FF_EINVAL, "a block must be an object {...}");
    int seen[NBKEYS] = {0};
    int more = ff_json_open(r, '{');
    while (more > 0) {
        int k;
        if (member_key(r, block_keys, NBKEYS, seen, &k))
            return r->rc;
        if (k == B_CHECKPOINT) {
            int64_t v;
            if (read_int(r, "checkpoint", 0, 1, &v))
                return r->rc;
            b->checkpoint = (int)v;
        } else {
            snprintf(r->where, sizeof r->where, "block %d %s: ", index, block_keys[k]);
            if (read_opts(r, "the layer", version, &b->layer[k - B_QKV]))
                return r->rc;
            snprintf(r->where, sizeof r->where, "block %d: ", index);
        }
        more = ff_json_next_member(r, '}');
    }
    if (r->rc)
        return r->rc;
    return all_seen(r, "the block", block_keys, NBKEYS, seen);
}

/* "blocks": [block, ...]; *n blocks into p->blocks (grown here) */
static int read_blocks(ff_json *r, int version, ff_layer_plan *p, int *n)
{
    if (!ff_json_at(r, '['))
        return ff_json_fail(r, FF_EINVAL, "\"blocks\" must be a list [...]");
    int cap = 0;
    int more = ff_json_open(r, '[');
    while (more > 0) {
        if (*n == MAX_LAYERS)
            return ff_json_fail(r, FF_EINVAL, "\"blocks\" has more than %d entries", MAX_LAYERS);
        if (*n == cap) {
            cap = cap ? (cap > MAX_LAYERS / 2 ? MAX_LAYERS : 2 * cap) : 16;
            ff_block_opts *grown = realloc(p->blocks, (size_t)cap * sizeof *grown);
            if (!grown)
                return ff_json_fail(r, FF_ENOMEM, "out of memory");
            p->blocks = grown;
        }
        snprintf(r->where, sizeof r->where, "block %d: ", *n);
        memset(&p->blocks[*n], 0, sizeof p->blocks[*n]);
        if (read_block(r, *n, version, &p->blocks[*n]))
            return r->rc;
        (*n)++;
        r->where[0] = '\0';
        more = ff_json_next_member(r, ']');
    }
    r->where[0] = '\0';
    return r->rc;
}

enum { M_LAYERS, M_HEADS, M_HIDDEN, M_VOCAB, NMKEYS };
static const char *const model_keys[NMKEYS] = {"layers", "heads", "hidden", "vocab"};

static int read_model(ff_json *r, ff_layer_plan *p)
{
    if (!ff_json_at(r, '{'))
        return ff_json_fail(r, FF_EINVAL, "\"model\" must be an object {...}");
    int seen[NMKEYS] = {0};
    int more = ff_json_open(r, '{');
    while (more > 0) {
        int k;
        int64_t v;
        if (member_key(r, model_keys, NMKEYS, seen, &k) ||
            read_int(r, model_keys[k], 1, k == M_LAYERS ? MAX_LAYERS : MAX_DIM, &v))
            return r->rc;
        if (k == M_LAYERS)
            p->layers = (int)v;
        else if (k == M_HEADS)
            p->heads = (int)v;
        else if (k == M_HIDDEN)
            p->hidden = v;
        else
            p->vocab = v;
        more = ff_json_next_member(r, '}');
    }
    if (r->rc)
        return r->rc;
    return all_seen(r, "\"model\"", model_keys, NMKEYS, seen);
}

static int read_grid(ff_json *r, ff_dims *g)
{
    if (!ff_json_at(r, '['))
        return ff_json_fail(r, FF_EINVAL, "\"grid\" must be a list of four sizes [Gx, Gy, Gz, Gd]");
    int64_t v[4];
    int n = 0;
    int more = ff_json_open(r, '[');
    while (more > 0) {
        if (n == 4)
            return ff_json_fail(r, FF_EINVAL, "\"grid\" has more than four sizes");
        if (read_int(r, "grid", 1, MAX_RANKS, &v[n]))
            return r->rc;
        n++;
        more = ff_json_next_member(r, ']');
    }
    if (r->rc)
        return r->rc;
    if (n != 4)
        return ff_json_fail(r, FF_EINVAL, "\"grid\" has %d sizes, expected four", n);
    if ((double)v[0] * v[1] * v[2] * v[3] > MAX_RANKS)
        return ff_json_fail(r, FF_EINVAL, "\"grid\" has more than %d ranks", MAX_RANKS);
    *g = (ff_dims){(int)v[0], (int)v[1], (int)v[2], (int)v[3]};
    return FF_OK;
}

enum {
    K_FORMAT,
    K_VERSION,
    K_MODEL,
    K_GRID,
    K_BATCH,
    K_SEQ,
    K_MICRO,
    K_PANEL,
    K_PREDICTED,
    K_HEAD,
    K_BLOCKS,
    K_PROGRESS,
    NKEYS
};
static const char *const top_keys[NKEYS] = {
    "format",     "version",          "model", "grid",   "batch",   "seq", "micro_batches",
    "panel_rows", "predicted_step_s", "head",  "blocks", "progress"};

/* The first pass: "format" and "version" only, FF_ECORRUPT unless this
 * format and version 1, 2 or 3 (into *out; the rest is parsed only as JSON);
 * the messages name the file, not a line. */
static int read_identity(ff_json *r, int *out)
{
    char format[64] = "";
    double version = -1;
    int has_format = 0, has_version = 0, version_number = 0;
    int more = ff_json_open(r, '{');
    while (more > 0) {
        char key[64];
        if (ff_json_string(r, key, sizeof key) || ff_json_expect(r, ':'))
            return r->rc;
        if (!strcmp(key, "format") && ff_json_at_string(r)) {
            has_format = 1;
            if (ff_json_string(r, format, sizeof format))
                return r->rc;
        } else if (!strcmp(key, "version") && ff_json_at_number(r)) {
            has_version = version_number = 1;
            if (ff_json_number(r, &version))
                return r->rc;
        } else if (!strcmp(key, "version")) {
            has_version = 1;
            version_number = 0;
            if (ff_json_skip_value(r, 1))
                return r->rc;
        } else if (ff_json_skip_value(r, 1)) {
            return r->rc;
        }
        more = ff_json_next_member(r, '}');
    }
    if (r->rc)
        return r->rc;
    if (!has_format)
        r->rc = ff_format_error(r->err, r->err_len, FF_ECORRUPT,
                                "plan %s: not a per-layer plan (no \"format\": \"" FORMAT "\")",
                                r->source);
    else if (strcmp(format, FORMAT))
        r->rc = ff_format_error(r->err, r->err_len, FF_ECORRUPT,
                                "plan %s: not a per-layer plan (\"format\" is \"%s\", expected "
                                "\"" FORMAT "\")",
                                r->source, format);
    else if (!has_version || !version_number)
        r->rc = ff_format_error(r->err, r->err_len, FF_ECORRUPT,
                                "plan %s: %s (this fourfold reads versions 1 to %d)", r->source,
                                has_version ? "\"version\" is not a number" : "no \"version\"",
                                FF_LAYER_PLAN_VERSION);
    else if (version != 1 && version != 2 && version != FF_LAYER_PLAN_VERSION)
        r->rc = ff_format_error(r->err, r->err_len, FF_ECORRUPT,
                                "plan %s: version %g is not supported (this fourfold reads "
                                "versions 1 to %d)",
                                r->source, version, FF_LAYER_PLAN_VERSION);
    if (!r->rc)
        *out = (int)version;
    return r->rc;
}

static int read_plan(ff_json *r, int version, ff_layer_plan *p)
{
    int seen[NKEYS] = {0}, n_blocks = 0;
    p->progress = -1;
    int more = ff_json_open(r, '{');
    while (more > 0) {
        int k;
        int64_t v;
        double s;
        if (member_key(r, top_keys, NKEYS, seen, &k))
            return r->rc;
        switch (k) {
        case K_FORMAT: ff_json_string(r, NULL, 0); break; /* checked by read_identity */
        case K_VERSION: ff_json_number(r, &s); break;
        case K_MODEL: read_model(r, p); break;
        case K_GRID: read_grid(r, &p->grid); break;
        case K_BATCH:
            if (read_int(r, "batch", 0, (double)((int64_t)1 << 40), &v) == FF_OK)
                p->batch = v;
            break;
        case K_SEQ:
            if (read_int(r, "seq", 0, 1 << 24, &v) == FF_OK)
                p->seq = v;
            break;
        case K_MICRO:
            if (read_int(r, "micro_batches", 0, 1 << 20, &v) == FF_OK)
                p->micro_batches = (int)v;
            break;
        case K_PANEL:
            if (read_int(r, "panel_rows", 0, 1 << 30, &v) == FF_OK)
                p->panel_rows = v;
            break;
        case K_PREDICTED:
            if (!ff_json_at_number(r))
                return ff_json_fail(r, FF_EINVAL, "\"predicted_step_s\" must be a number");
            if (ff_json_number(r, &s) == FF_OK &&
                ff_json_check_range(r, "predicted_step_s", s, 0, 1e12, 0, 0) == FF_OK)
                p->predicted_step_s = s;
            break;
        case K_HEAD:
            snprintf(r->where, sizeof r->where, "head: ");
            if (read_opts(r, "the layer", version, &p->head) == FF_OK)
                r->where[0] = '\0';
            break;
        case K_BLOCKS: read_blocks(r, version, p, &n_blocks); break;
        case K_PROGRESS: {
            char name[16] = "";
            if (version == 1)
                return ff_json_fail(r, FF_EINVAL,
                                    "\"progress\" is not a key of version 1 (version 2 has it)");
            if (!ff_json_at_string(r))
                return ff_json_fail(r, FF_EINVAL, "\"progress\" must be a string");
            if (ff_json_string(r, name, sizeof name))
                return r->rc;
            for (int m = 0; m < NPROGRESS; m++)
                if (!strcmp(name, progress_names[m]))
                    p->progress = m;
            if (p->progress < 0)
                return ff_json_fail(r, FF_EINVAL,
                                    "\"progress\" is \"%s\", expected wait, poll or thread", name);
            break;
        }
        }
        if (r->rc)
            return r->rc;
        more = ff_json_next_member(r, '}');
    }
    if (r->rc)
        return r->rc;
    ff_json_skip_ws(r);
    if (r->p != r->end)
        return ff_json_fail(r, FF_ECORRUPT, "unexpected text after the plan object");
    if (version != 2)
        seen[K_PROGRESS] = 1; /* (version 2's key; optional in version 3) */
    if (all_seen(r, "the plan", top_keys, NKEYS, seen))
        return r->rc;
    if (n_blocks != p->layers)
        return ff_json_fail(r, FF_EINVAL,
                            "\"blocks\" has %d entries but the model has %d layers (one block "
                            "each)",
                            n_blocks, p->layers);
    return FF_OK;
}

int ff_layer_plan_parse(const char *text, size_t len, const char *source, ff_layer_plan *out,
                        char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    ff_json r;
    ff_json_init(&r, text, len, "plan", source, err, err_len);
    if (!text)
        return ff_json_fail(&r, FF_EINVAL, "no text");
    if (memchr(text, '\0', len))
        return ff_json_fail(&r, FF_ECORRUPT, "contains a NUL byte (not a text file)");
    int version = 0;
    if (read_identity(&r, &version))
        return r.rc;
    ff_json_init(&r, text, len, "plan", source, err, err_len);
    int rc = read_plan(&r, version, out);
    if (rc == FF_OK) {
        char why[384];
        if (ff_layer_plan_check(out, why, sizeof why) != FF_OK)
            rc = ff_format_error(err, err_len, FF_EINVAL, "plan %s: %s", r.source, why);
    }
    if (rc != FF_OK)
        ff_layer_plan_free(out);
    return rc;
}

int ff_layer_plan_read(const char *path, ff_layer_plan *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    char *text;
    size_t n;
    int rc = ff_json_read_file(path, "plan", MAX_TEXT, &text, &n, err, err_len);
    if (rc == FF_OK)
        rc = ff_layer_plan_parse(text, n, path, out, err, err_len);
    free(text);
    return rc;
}

/* ---- the match ---- */

int ff_layer_plan_match(const ff_layer_plan *p, int layers, int heads, int64_t hidden,
                        int64_t vocab, ff_dims grid, char *err, size_t err_len)
{
    const int64_t planned[4] = {p->layers, p->heads, p->hidden, p->vocab};
    const int64_t run[4] = {layers, heads, hidden, vocab};
    static const char *const names[4] = {"layers", "heads", "hidden", "vocab"};
    char was[256] = "", is[256] = "";
    size_t a = 0, b = 0;
    for (int i = 0; i < 4; i++)
        if (planned[i] != run[i]) {
            a += (size_t)snprintf(was + a, sizeof was - a, "%s%s=%lld", a ? " " : "", names[i],
                                  (long long)planned[i]);
            b += (size_t)snprintf(is + b, sizeof is - b, "%s%s=%lld", b ? " " : "", names[i],
                                  (long long)run[i]);
        }
    const ff_dims g = p->grid;
    if (g.x != grid.x || g.y != grid.y || g.z != grid.z || g.d != grid.d) {
        a += (size_t)snprintf(was + a, sizeof was - a, "%sgrid %dx%dx%dx%d", a ? " " : "", g.x, g.y,
                              g.z, g.d);
        b += (size_t)snprintf(is + b, sizeof is - b, "%sgrid %dx%dx%dx%d", b ? " " : "", grid.x,
                              grid.y, grid.z, grid.d);
    }
    if (!a)
        return FF_OK;
    return ff_format_error(err, err_len, FF_EINVAL, "the plan is for %s; this run has %s", was, is);
}
