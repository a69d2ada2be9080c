/* Machine profiles: the presets, and the JSON file that `fourfold bench
 * profile` writes (schema in docs/planner.md).
 *
 * The parser is strict: one JSON object, known keys type-checked and range-
 * checked, each at most once; unknown keys (such as a "fit" object with the
 * residuals of the bench's least-squares fit) are parsed and skipped; nothing
 * may follow the object. Every message names the file and the line. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/plan_internal.h"

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
 * per GPU, advertised and measured bf16 GEMM rates, 4 Slingshot-11 NICs of
 * 25 GB/s per node. Intra-node bandwidths are the ones AxoNN's tool uses
 * (GB/s by stride and group size); the rest are assumptions stated in
 * docs/planner.md. */
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
    p->gemm_half_dim = 128;
    p->intra_overlap = 1;
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
    p->intra_overlap = 1;
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
    p->gemm_half_dim = 128;
    p->intra_overlap = 1;
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

/* ---- a small strict JSON reader ---- */

typedef struct {
    const char *begin, *p, *end;
    const char *source;
    char *err;
    size_t err_len;
    int rc;
} reader;

enum { MAX_DEPTH = 32, MAX_TEXT = 1 << 20 };

static int line_of(const reader *r)
{
    int line = 1;
    for (const char *q = r->begin; q < r->p && q < r->end; q++)
        line += *q == '\n';
    return line;
}

static int fail(reader *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(reader *r, int code, const char *fmt, ...)
{
    if (r->rc != FF_OK)
        return r->rc;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    r->rc = code;
    return ff_format_error(r->err, r->err_len, code, "profile %s: line %d: %s", r->source,
                           line_of(r), what);
}

static void skip_ws(reader *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static int expect(reader *r, char c)
{
    skip_ws(r);
    if (r->p >= r->end)
        return fail(r, FF_ECORRUPT, "expected '%c', found the end of the file", c);
    if (*r->p != c)
        return fail(r, FF_ECORRUPT, "expected '%c', found '%c'", c, *r->p);
    r->p++;
    return FF_OK;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A string into out (truncated to cap-1; non-ASCII escapes become '?'). */
static int read_string(reader *r, char *out, size_t cap)
{
    skip_ws(r);
    if (r->p >= r->end)
        return fail(r, FF_ECORRUPT, "expected a string, found the end of the file");
    if (*r->p != '"')
        return fail(r, FF_ECORRUPT, "expected a string");
    r->p++;
    size_t n = 0;
    while (r->p < r->end && *r->p != '"') {
        unsigned char c = (unsigned char)*r->p++;
        if (c < 0x20)
            return fail(r, FF_ECORRUPT, "control character in a string");
        if (c == '\\') {
            if (r->p >= r->end)
                break;
            char e = *r->p++;
            switch (e) {
            case '"': c = '"'; break;
            case '\\': c = '\\'; break;
            case '/': c = '/'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'u': {
                int v = 0;
                for (int i = 0; i < 4; i++) {
                    int h = r->p < r->end ? hexval(*r->p) : -1;
                    if (h < 0)
                        return fail(r, FF_ECORRUPT, "bad \\u escape in a string");
                    v = v * 16 + h;
                    r->p++;
                }
                c = v < 0x80 ? (unsigned char)v : '?';
                break;
            }
            default: return fail(r, FF_ECORRUPT, "bad escape '\\%c' in a string", e);
            }
        }
        if (out && n + 1 < cap)
            out[n++] = (char)c;
    }
    if (r->p >= r->end)
        return fail(r, FF_ECORRUPT, "unterminated string");
    r->p++;
    if (out && cap)
        out[n] = '\0';
    return FF_OK;
}

/* A number by JSON's grammar (no leading '+', no leading zeros, no hex, no
 * NaN or Infinity), converted with strtod. */
static int read_number(reader *r, double *out)
{
    skip_ws(r);
    const char *s = r->p;
    const char *q = s;
    if (q < r->end && *q == '-')
        q++;
    if (q >= r->end || *q < '0' || *q > '9')
        return fail(r, FF_ECORRUPT, "expected a number");
    if (*q == '0')
        q++;
    else
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    if (q < r->end && *q == '.') {
        q++;
        if (q >= r->end || *q < '0' || *q > '9')
            return fail(r, FF_ECORRUPT, "malformed number");
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < r->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < r->end && (*q == '+' || *q == '-'))
            q++;
        if (q >= r->end || *q < '0' || *q > '9')
            return fail(r, FF_ECORRUPT, "malformed number");
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    }
    char buf[64];
    size_t len = (size_t)(q - s);
    if (len >= sizeof buf)
        return fail(r, FF_ECORRUPT, "number too long");
    memcpy(buf, s, len);
    buf[len] = '\0';
    errno = 0;
    double v = strtod(buf, NULL);
    if (errno == ERANGE && fabs(v) > 1.0)
        return fail(r, FF_EINVAL, "number %s out of range", buf);
    r->p = q;
    *out = v;
    return FF_OK;
}

static int skip_value(reader *r, int depth);

static int skip_literal(reader *r, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || strncmp(r->p, word, n) != 0)
        return fail(r, FF_ECORRUPT, "expected a value");
    r->p += n;
    return FF_OK;
}

/* Parses and discards any JSON value (an unknown key's). */
static int skip_value(reader *r, int depth)
{
    if (depth > MAX_DEPTH)
        return fail(r, FF_ECORRUPT, "nested more than %d levels deep", MAX_DEPTH);
    skip_ws(r);
    if (r->p >= r->end)
        return fail(r, FF_ECORRUPT, "expected a value, found the end of the file");
    char c = *r->p;
    if (c == '"')
        return read_string(r, NULL, 0);
    if (c == 't')
        return skip_literal(r, "true");
    if (c == 'f')
        return skip_literal(r, "false");
    if (c == 'n')
        return skip_literal(r, "null");
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        r->p++;
        skip_ws(r);
        if (r->p < r->end && *r->p == close) {
            r->p++;
            return FF_OK;
        }
        for (;;) {
            if (c == '{' && (read_string(r, NULL, 0) || expect(r, ':')))
                return r->rc;
            if (skip_value(r, depth + 1))
                return r->rc;
            skip_ws(r);
            if (r->p < r->end && *r->p == ',') {
                r->p++;
                continue;
            }
            return expect(r, close);
        }
    }
    double ignored;
    return read_number(r, &ignored);
}

/* ---- the profile schema ---- */

typedef enum { K_STRING, K_NUMBER, K_INT, K_BW } key_type;

typedef struct {
    const char *name;
    key_type type;
    int required;
    double lo, hi; /* numbers: inclusive range; lo_open: lo excluded */
    int lo_open;
} key_spec;

enum {
    KEY_FORMAT,
    KEY_VERSION,
    KEY_NAME,
    KEY_RPN,
    KEY_MEMORY,
    KEY_GEMM,
    KEY_PEAK,
    KEY_ALPHA_INTRA,
    KEY_BETA_INTRA,
    KEY_ALPHA_INTER,
    KEY_BETA_INTER,
    KEY_INTRA_BW,
    KEY_MEM_BPS,
    KEY_HALF_DIM,
    KEY_CORES,
    KEY_INTRA_OVERLAP,
    NKEYS
};

static const key_spec keys[NKEYS] = {
    [KEY_FORMAT] = {"format", K_STRING, 1, 0, 0, 0},
    [KEY_VERSION] = {"version", K_INT, 1, 1, 1e9, 0},
    [KEY_NAME] = {"name", K_STRING, 0, 0, 0, 0},
    [KEY_RPN] = {"ranks_per_node", K_INT, 1, 1, 1e6, 0},
    [KEY_MEMORY] = {"memory_bytes", K_NUMBER, 1, 0, 1e18, 1},
    [KEY_GEMM] = {"gemm_flops", K_NUMBER, 1, 0, 1e18, 1},
    [KEY_PEAK] = {"peak_flops", K_NUMBER, 0, 0, 1e18, 1},
    [KEY_ALPHA_INTRA] = {"alpha_intra_s", K_NUMBER, 1, 0, 10, 0},
    [KEY_BETA_INTRA] = {"beta_intra_Bps", K_NUMBER, 1, 0, 1e15, 1},
    [KEY_ALPHA_INTER] = {"alpha_inter_s", K_NUMBER, 1, 0, 10, 0},
    [KEY_BETA_INTER] = {"beta_inter_Bps", K_NUMBER, 1, 0, 1e15, 1},
    [KEY_INTRA_BW] = {"intra_bw", K_BW, 0, 0, 0, 0},
    [KEY_MEM_BPS] = {"mem_Bps", K_NUMBER, 0, 0, 1e16, 1},
    [KEY_HALF_DIM] = {"gemm_half_dim", K_NUMBER, 0, 0, 1e6, 0},
    [KEY_CORES] = {"cores_per_node", K_INT, 0, 0, 1e6, 0},
    [KEY_INTRA_OVERLAP] = {"intra_overlap", K_NUMBER, 0, 0, 1, 0},
};

static int check_range(reader *r, const char *key, double v, double lo, double hi, int lo_open,
                       int integer)
{
    if (integer && v != floor(v))
        return fail(r, FF_EINVAL, "\"%s\" is %g, expected an integer", key, v);
    if ((lo_open ? !(v > lo) : !(v >= lo)) || !(v <= hi))
        return fail(r, FF_EINVAL, "\"%s\" is %g, expected a number %s %g and <= %g", key, v,
                    lo_open ? ">" : ">=", lo, hi);
    return FF_OK;
}

/* "intra_bw": [{"inner": 1, "size": 2, "Bps": 7.6e10}, ...] */
static int read_intra_bw(reader *r, ff_profile *out)
{
    if (expect(r, '['))
        return r->rc;
    skip_ws(r);
    if (r->p < r->end && *r->p == ']') {
        r->p++;
        return FF_OK;
    }
    for (;;) {
        if (out->n_intra_bw >= FF_PROFILE_MAX_BW)
            return fail(r, FF_EINVAL, "\"intra_bw\" has more than %d entries", FF_PROFILE_MAX_BW);
        if (expect(r, '{'))
            return r->rc;
        double v[3] = {0, 0, 0};
        int seen[3] = {0, 0, 0};
        static const char *const names[3] = {"inner", "size", "Bps"};
        skip_ws(r);
        if (r->p < r->end && *r->p == '}') {
            r->p++;
        } else {
            for (;;) {
                char key[64];
                if (read_string(r, key, sizeof key) || expect(r, ':'))
                    return r->rc;
                int which = -1;
                for (int i = 0; i < 3; i++)
                    if (!strcmp(key, names[i]))
                        which = i;
                if (which < 0) {
                    if (skip_value(r, 2))
                        return r->rc;
                } else {
                    if (seen[which])
                        return fail(r, FF_EINVAL, "\"intra_bw\" entry repeats \"%s\"", key);
                    seen[which] = 1;
                    if (read_number(r, &v[which]))
                        return r->rc;
                }
                skip_ws(r);
                if (r->p < r->end && *r->p == ',') {
                    r->p++;
                    continue;
                }
                if (expect(r, '}'))
                    return r->rc;
                break;
            }
        }
        for (int i = 0; i < 3; i++)
            if (!seen[i])
                return fail(r, FF_EINVAL, "an \"intra_bw\" entry lacks \"%s\"", names[i]);
        if (check_range(r, "inner", v[0], 1, 1e6, 0, 1) ||
            check_range(r, "size", v[1], 2, 1e6, 0, 1) ||
            check_range(r, "Bps", v[2], 0, 1e15, 1, 0))
            return r->rc;
        out->intra_bw[out->n_intra_bw++] = (ff_intra_bw){(int)v[0], (int)v[1], v[2]};
        skip_ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        return expect(r, ']');
    }
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int ff_profile_parse(const char *text, size_t len, const char *source, ff_profile *out, char *err,
                     size_t err_len)
{
    reader rd = {text, text, text + len, source ? source : "(text)", err, err_len, FF_OK};
    reader *r = &rd;
    ff_profile p;
    memset(&p, 0, sizeof p);
    int seen[NKEYS] = {0};
    double num[NKEYS] = {0};
    char format[64] = "";

    if (!text)
        return fail(r, FF_EINVAL, "no text");
    if (memchr(text, '\0', len))
        return fail(r, FF_ECORRUPT, "contains a NUL byte (not a text file)");
    if (expect(r, '{'))
        return r->rc;
    skip_ws(r);
    if (r->p < r->end && *r->p == '}') {
        r->p++;
    } else {
        for (;;) {
            char key[128];
            if (read_string(r, key, sizeof key) || expect(r, ':'))
                return r->rc;
            int which = -1;
            for (int i = 0; i < NKEYS; i++)
                if (!strcmp(key, keys[i].name))
                    which = i;
            if (which < 0) {
                if (skip_value(r, 1)) /* an unknown key: ignored */
                    return r->rc;
            } else {
                if (seen[which])
                    return fail(r, FF_EINVAL, "key \"%s\" appears twice", key);
                seen[which] = 1;
                const key_spec *k = &keys[which];
                skip_ws(r);
                if (k->type == K_STRING) {
                    if (r->p >= r->end || *r->p != '"')
                        return fail(r, FF_EINVAL, "\"%s\" must be a string", key);
                    if (which == KEY_FORMAT ? read_string(r, format, sizeof format)
                                            : read_string(r, p.name, sizeof p.name))
                        return r->rc;
                } else if (k->type == K_BW) {
                    if (read_intra_bw(r, &p))
                        return r->rc;
                } else {
                    if (r->p >= r->end || !(*r->p == '-' || (*r->p >= '0' && *r->p <= '9')))
                        return fail(r, FF_EINVAL, "\"%s\" must be a number", key);
                    if (read_number(r, &num[which]))
                        return r->rc;
                    if (which == KEY_VERSION && num[which] != 1)
                        return fail(r, FF_EINVAL,
                                    "version %g is not supported (this fourfold reads version 1)",
                                    num[which]);
                    if (check_range(r, key, num[which], k->lo, k->hi, k->lo_open, k->type == K_INT))
                        return r->rc;
                }
            }
            skip_ws(r);
            if (r->p < r->end && *r->p == ',') {
                r->p++;
                continue;
            }
            if (expect(r, '}'))
                return r->rc;
            break;
        }
    }
    skip_ws(r);
    if (r->p != r->end)
        return fail(r, FF_ECORRUPT, "unexpected text after the profile object");
    if (seen[KEY_FORMAT] && strcmp(format, "fourfold-profile") != 0)
        return fail(r, FF_EINVAL, "\"format\" is \"%s\", expected \"fourfold-profile\"", format);
    for (int i = 0; i < NKEYS; i++)
        if (keys[i].required && !seen[i])
            return fail(r, FF_EINVAL, "required key \"%s\" is missing", keys[i].name);

    if (!seen[KEY_NAME])
        snprintf(p.name, sizeof p.name, "%s", base_name(r->source));
    p.ranks_per_node = (int)num[KEY_RPN];
    p.memory_bytes = num[KEY_MEMORY];
    p.gemm_flops = num[KEY_GEMM];
    p.peak_flops = seen[KEY_PEAK] ? num[KEY_PEAK] : p.gemm_flops;
    p.alpha_intra_s = num[KEY_ALPHA_INTRA];
    p.beta_intra_Bps = num[KEY_BETA_INTRA];
    p.alpha_inter_s = num[KEY_ALPHA_INTER];
    p.beta_inter_Bps = num[KEY_BETA_INTER];
    /* defaults for a measured profile, which `fourfold bench` takes on a CPU
     * machine: elementwise work at a sixteenth of the GEMM rate in bytes,
     * OpenBLAS-like efficiency, intra-node transfers are CPU copies */
    p.mem_Bps = seen[KEY_MEM_BPS] ? num[KEY_MEM_BPS] : p.gemm_flops / 16;
    p.gemm_half_dim = seen[KEY_HALF_DIM] ? num[KEY_HALF_DIM] : 32;
    p.cores_per_node = (int)num[KEY_CORES];
    p.intra_overlap = seen[KEY_INTRA_OVERLAP] ? num[KEY_INTRA_OVERLAP] : 0;
    p.axonn_table = FF_AXONN_TABLE_NONE;
    *out = p;
    return FF_OK;
}

int ff_profile_load(const char *path, ff_profile *out, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return ff_format_error(err, err_len, FF_EIO, "profile %s: cannot open: %s", path,
                               strerror(errno));
    char *text = malloc(MAX_TEXT + 1);
    if (!text) {
        fclose(f);
        return ff_format_error(err, err_len, FF_ENOMEM, "profile %s: out of memory", path);
    }
    size_t n = fread(text, 1, MAX_TEXT + 1, f);
    int bad = ferror(f);
    fclose(f);
    int rc;
    if (bad)
        rc = ff_format_error(err, err_len, FF_EIO, "profile %s: read error", path);
    else if (n > MAX_TEXT)
        rc = ff_format_error(err, err_len, FF_ECORRUPT, "profile %s: larger than %d bytes", path,
                             MAX_TEXT);
    else if (n == 0)
        rc = ff_format_error(err, err_len, FF_ECORRUPT, "profile %s: the file is empty", path);
    else
        rc = ff_profile_parse(text, n, path, out, err, err_len);
    free(text);
    return rc;
}

size_t ff_profile_to_json(const ff_profile *p, char *buf, size_t len)
{
    char tmp[8192];
    size_t n = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(tmp + n, sizeof tmp - n, __VA_ARGS__);                                   \
        if (w_ > 0)                                                                                \
            n = n + (size_t)w_ < sizeof tmp ? n + (size_t)w_ : sizeof tmp - 1;                     \
    } while (0)
    char name[2 * sizeof p->name];
    size_t j = 0;
    for (size_t i = 0; p->name[i] && j + 2 < sizeof name; i++) {
        char c = p->name[i];
        if (c == '"' || c == '\\')
            name[j++] = '\\';
        name[j++] = (c >= 0x20 && c < 0x7f) ? c : '?';
    }
    name[j] = '\0';
    PUT("{\"format\": \"fourfold-profile\", \"version\": 1, \"name\": \"%s\",\n", name);
    PUT(" \"ranks_per_node\": %d, \"memory_bytes\": %.17g,\n", p->ranks_per_node, p->memory_bytes);
    PUT(" \"gemm_flops\": %.17g, \"peak_flops\": %.17g,\n", p->gemm_flops, p->peak_flops);
    PUT(" \"alpha_intra_s\": %.17g, \"beta_intra_Bps\": %.17g,\n", p->alpha_intra_s,
        p->beta_intra_Bps);
    PUT(" \"alpha_inter_s\": %.17g, \"beta_inter_Bps\": %.17g,\n", p->alpha_inter_s,
        p->beta_inter_Bps);
    PUT(" \"intra_bw\": [");
    for (int i = 0; i < p->n_intra_bw; i++)
        PUT("%s{\"inner\": %d, \"size\": %d, \"Bps\": %.17g}", i ? ", " : "", p->intra_bw[i].inner,
            p->intra_bw[i].size, p->intra_bw[i].Bps);
    PUT("],\n \"mem_Bps\": %.17g, \"gemm_half_dim\": %.17g, \"cores_per_node\": %d, "
        "\"intra_overlap\": %.17g}\n",
        p->mem_Bps, p->gemm_half_dim, p->cores_per_node, p->intra_overlap);
#undef PUT
    if (buf && len) {
        size_t c = n < len - 1 ? n : len - 1;
        memcpy(buf, tmp, c);
        buf[c] = '\0';
    }
    return n;
}
