/* A small strict JSON reader (src/util/json.h). */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/ctx.h" /* FF_E* */
#include "util/file.h"    /* ff_format_error */

void ff_json_init(ff_json *r, const char *text, size_t len, const char *kind, const char *source,
                  char *err, size_t err_len)
{
    memset(r, 0, sizeof *r);
    r->begin = r->p = text;
    r->end = text ? text + len : text;
    r->kind = kind;
    r->source = source ? source : "(text)";
    r->err = err;
    r->err_len = err_len;
    r->rc = FF_OK;
}

static int line_of(const ff_json *r)
{
    int line = 1;
    for (const char *q = r->begin; q < r->p && q < r->end; q++)
        line += *q == '\n';
    return line;
}

int ff_json_fail(ff_json *r, int code, const char *fmt, ...)
{
    if (r->rc != FF_OK)
        return r->rc;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    r->rc = code;
    return ff_format_error(r->err, r->err_len, code, "%s %s: line %d: %s%s", r->kind, r->source,
                           line_of(r), r->where, what);
}

void ff_json_skip_ws(ff_json *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

int ff_json_at(ff_json *r, char c)
{
    ff_json_skip_ws(r);
    return r->p < r->end && *r->p == c;
}

int ff_json_at_number(ff_json *r)
{
    ff_json_skip_ws(r);
    return r->p < r->end && (*r->p == '-' || (*r->p >= '0' && *r->p <= '9'));
}

int ff_json_at_string(ff_json *r) { return ff_json_at(r, '"'); }

int ff_json_expect(ff_json *r, char c)
{
    ff_json_skip_ws(r);
    if (r->p >= r->end)
        return ff_json_fail(r, FF_ECORRUPT, "expected '%c', found the end of the file", c);
    if (*r->p != c)
        return ff_json_fail(r, FF_ECORRUPT, "expected '%c', found '%c'", c, *r->p);
    r->p++;
    return FF_OK;
}

int ff_json_open(ff_json *r, char open)
{
    if (ff_json_expect(r, open))
        return r->rc;
    if (ff_json_at(r, open == '{' ? '}' : ']')) {
        r->p++;
        return 0;
    }
    return 1;
}

int ff_json_next_member(ff_json *r, char close)
{
    if (ff_json_at(r, ',')) {
        r->p++;
        return 1;
    }
    return ff_json_expect(r, close) ? -1 : 0;
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

/* Four hex digits of a \u escape, or -1. */
static long hex4(ff_json *r)
{
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int h = r->p < r->end ? hexval(*r->p) : -1;
        if (h < 0)
            return -1;
        v = v * 16 + h;
        r->p++;
    }
    return v;
}

/* A string into out. utf8 0: truncated to cap-1 bytes, non-ASCII escapes as
 * '?' (ff_json_string); utf8 1: escapes as UTF-8, a lone surrogate refused,
 * a string of cap bytes or more refused (ff_json_string_utf8). */
static int read_string(ff_json *r, char *out, size_t cap, int utf8, size_t *len)
{
    ff_json_skip_ws(r);
    if (r->p >= r->end)
        return ff_json_fail(r, FF_ECORRUPT, "expected a string, found the end of the file");
    if (*r->p != '"')
        return ff_json_fail(r, FF_ECORRUPT, "expected a string");
    r->p++;
    size_t n = 0;
    while (r->p < r->end && *r->p != '"') {
        unsigned char c = (unsigned char)*r->p++, bytes[4];
        size_t nbytes = 1;
        if (c < 0x20)
            return ff_json_fail(r, FF_ECORRUPT, "control character in a string");
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
                long v = hex4(r);
                if (v < 0)
                    return ff_json_fail(r, FF_ECORRUPT, "bad \\u escape in a string");
                if (!utf8) {
                    c = v < 0x80 ? (unsigned char)v : '?';
                    break;
                }
                if (v >= 0xdc00 && v < 0xe000)
                    return ff_json_fail(r, FF_ECORRUPT, "a lone surrogate \\u%04lx in a string", v);
                if (v >= 0xd800 && v < 0xdc00) { /* a pair: \ud83d\ude00 */
                    long lo = r->end - r->p >= 2 && r->p[0] == '\\' && r->p[1] == 'u'
                                  ? (r->p += 2, hex4(r))
                                  : -1;
                    if (lo < 0xdc00 || lo >= 0xe000)
                        return ff_json_fail(r, FF_ECORRUPT, "a lone surrogate \\u%04lx in a string",
                                            v);
                    v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
                }
                if (v < 0x80) {
                    bytes[0] = (unsigned char)v;
                } else if (v < 0x800) {
                    bytes[0] = (unsigned char)(0xc0 | v >> 6);
                    bytes[1] = (unsigned char)(0x80 | (v & 0x3f));
                    nbytes = 2;
                } else if (v < 0x10000) {
                    bytes[0] = (unsigned char)(0xe0 | v >> 12);
                    bytes[1] = (unsigned char)(0x80 | (v >> 6 & 0x3f));
                    bytes[2] = (unsigned char)(0x80 | (v & 0x3f));
                    nbytes = 3;
                } else {
                    bytes[0] = (unsigned char)(0xf0 | v >> 18);
                    bytes[1] = (unsigned char)(0x80 | (v >> 12 & 0x3f));
                    bytes[2] = (unsigned char)(0x80 | (v >> 6 & 0x3f));
                    bytes[3] = (unsigned char)(0x80 | (v & 0x3f));
                    nbytes = 4;
                }
                c = bytes[0];
                break;
            }
            default: return ff_json_fail(r, FF_ECORRUPT, "bad escape '\\%c' in a string", e);
            }
        }
        bytes[0] = c;
        if (utf8 && out && n + nbytes >= cap)
            return ff_json_fail(r, FF_ECORRUPT, "a string longer than %zu bytes", cap - 1);
        for (size_t i = 0; i < nbytes; i++)
            if (out && n + 1 < cap)
                out[n++] = (char)bytes[i];
    }
    if (r->p >= r->end)
        return ff_json_fail(r, FF_ECORRUPT, "unterminated string");
    r->p++;
    if (out && cap)
        out[n] = '\0';
    if (len)
        *len = n;
    return FF_OK;
}

int ff_json_string(ff_json *r, char *out, size_t cap) { return read_string(r, out, cap, 0, NULL); }

int ff_json_string_utf8(ff_json *r, char *out, size_t cap, size_t *len)
{
    return read_string(r, out, cap, 1, len);
}

int ff_json_number(ff_json *r, double *out)
{
    ff_json_skip_ws(r);
    const char *s = r->p;
    const char *q = s;
    if (q < r->end && *q == '-')
        q++;
    if (q >= r->end || *q < '0' || *q > '9')
        return ff_json_fail(r, FF_ECORRUPT, "expected a number");
    if (*q == '0')
        q++;
    else
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    if (q < r->end && *q == '.') {
        q++;
        if (q >= r->end || *q < '0' || *q > '9')
            return ff_json_fail(r, FF_ECORRUPT, "malformed number");
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < r->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < r->end && (*q == '+' || *q == '-'))
            q++;
        if (q >= r->end || *q < '0' || *q > '9')
            return ff_json_fail(r, FF_ECORRUPT, "malformed number");
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    }
    char buf[64];
    size_t len = (size_t)(q - s);
    if (len >= sizeof buf)
        return ff_json_fail(r, FF_ECORRUPT, "number too long");
    memcpy(buf, s, len);
    buf[len] = '\0';
    errno = 0;
    double v = strtod(buf, NULL);
    if (errno == ERANGE && fabs(v) > 1.0)
        return ff_json_fail(r, FF_EINVAL, "number %s out of range", buf);
    r->p = q;
    *out = v;
    return FF_OK;
}

static int skip_literal(ff_json *r, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || strncmp(r->p, word, n) != 0)
        return ff_json_fail(r, FF_ECORRUPT, "expected a value");
    r->p += n;
    return FF_OK;
}

int ff_json_skip_value(ff_json *r, int depth)
{
    if (depth > FF_JSON_MAX_DEPTH)
        return ff_json_fail(r, FF_ECORRUPT, "nested more than %d levels deep", FF_JSON_MAX_DEPTH);
    ff_json_skip_ws(r);
    if (r->p >= r->end)
        return ff_json_fail(r, FF_ECORRUPT, "expected a value, found the end of the file");
    char c = *r->p;
    if (c == '"')
        return ff_json_string(r, NULL, 0);
    if (c == 't')
        return skip_literal(r, "true");
    if (c == 'f')
        return skip_literal(r, "false");
    if (c == 'n')
        return skip_literal(r, "null");
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        if (ff_json_open(r, c) <= 0)
            return r->rc;
        for (;;) {
            if (c == '{' && (ff_json_string(r, NULL, 0) || ff_json_expect(r, ':')))
                return r->rc;
            if (ff_json_skip_value(r, depth + 1))
                return r->rc;
            int more = ff_json_next_member(r, close);
            if (more <= 0)
                return r->rc;
        }
    }
    double ignored;
    return ff_json_number(r, &ignored);
}

int ff_json_check_range(ff_json *r, const char *key, double v, double lo, double hi, int lo_open,
                        int integer)
{
    if (integer && v != floor(v))
        return ff_json_fail(r, FF_EINVAL, "\"%s\" is %g, expected an integer", key, v);
    if ((lo_open ? !(v > lo) : !(v >= lo)) || !(v <= hi))
        return ff_json_fail(r, FF_EINVAL, "\"%s\" is %g, expected a number %s %g and <= %g", key, v,
                            lo_open ? ">" : ">=", lo, hi);
    return FF_OK;
}

int ff_json_read_file(const char *path, const char *kind, size_t max, char **text, size_t *len,
                      char *err, size_t err_len)
{
    *text = NULL;
    *len = 0;
    FILE *f = ff_fopen_regular(path); /* (a FIFO would block) */
    if (!f)
        return ff_format_error(err, err_len, FF_EIO, "cannot open %s %s: %s", kind, path,
                               ff_open_error(errno));
    /* grown as it fills, up to max + 1 bytes (one more tells a larger file) */
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = FF_OK;
    for (;;) {
        if (n == cap) {
            size_t want = cap ? 2 * cap : 65536;
            if (want > max + 1)
                want = max + 1;
            char *grown = want > cap ? realloc(buf, want + 1) : NULL;
            if (!grown) {
                if (want > cap)
                    rc = ff_format_error(err, err_len, FF_ENOMEM, "%s %s: out of memory", kind,
                                         path);
                break;
            }
            buf = grown, cap = want;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0 || n > max)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (rc == FF_OK && bad)
        rc = ff_format_error(err, err_len, FF_EIO, "%s %s: read error", kind, path);
    else if (rc == FF_OK && n > max)
        rc = ff_format_error(err, err_len, FF_ECORRUPT, "%s %s: larger than %zu bytes", kind, path,
                             max);
    else if (rc == FF_OK && n == 0)
        rc = ff_format_error(err, err_len, FF_ECORRUPT, "%s %s: the file is empty", kind, path);
    if (rc != FF_OK) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return FF_OK;
}
