/* A growable text buffer and JSON strings (src/util/text.h). */
#include "text.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ff_text_put(ff_text *b, const char *t, size_t len)
{
    if (b->failed)
        return;
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + len + 1)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->failed = 1;
            return;
        }
        b->s = s, b->cap = cap;
    }
    memcpy(b->s + b->n, t, len);
    b->n += len;
    b->s[b->n] = '\0';
}

void ff_text_puts(ff_text *b, const char *t) { ff_text_put(b, t, strlen(t)); }

void ff_text_printf(ff_text *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
    } else if ((size_t)n < sizeof small) {
        ff_text_put(b, small, (size_t)n);
    } else {
        char *big = malloc((size_t)n + 1);
        if (!big) {
            b->failed = 1;
            return;
        }
        va_start(ap, fmt);
        vsnprintf(big, (size_t)n + 1, fmt, ap);
        va_end(ap);
        ff_text_put(b, big, (size_t)n);
        free(big);
    }
}

void ff_text_json_string(ff_text *b, const char *s, int ascii)
{
    ff_text_put(b, "\"", 1);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            ff_text_printf(b, "\\%c", c);
        else if (c < 0x20)
            ff_text_printf(b, "\\u%04x", c);
        else if (ascii && c >= 0x7f)
            ff_text_put(b, "?", 1);
        else
            ff_text_put(b, s, 1);
    }
    ff_text_put(b, "\"", 1);
}

void ff_text_number(ff_text *b, double v)
{
    char t[40];
    if (v == floor(v) && fabs(v) < 1e6) {
        snprintf(t, sizeof t, "%.0f", v);
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(t, sizeof t, "%.*g", prec, v);
            if (strtod(t, NULL) == v)
                break;
        }
    }
    ff_text_puts(b, t);
}

void ff_text_free(ff_text *b)
{
    free(b->s);
    *b = (ff_text){0};
}
