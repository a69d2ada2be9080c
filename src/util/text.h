/* A growable text buffer and JSON strings, for the writers of JSON files
 * (machine profiles, traces, the planner's output). Not installed. */
#ifndef FF_TEXT_H
#define FF_TEXT_H

#include <stddef.h>

/* Zero-initialise; s is NUL-terminated whenever n > 0. After an allocation
 * fails, `failed` is 1 and later calls do nothing. */
typedef struct {
    char *s;
    size_t n, cap;
    int failed;
} ff_text;

void ff_text_put(ff_text *b, const char *t, size_t len);
void ff_text_puts(ff_text *b, const char *t);
void ff_text_printf(ff_text *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A JSON string literal: quotes and backslashes escaped, control characters
 * as \u00XX; other bytes as they are, or as '?' beyond ASCII if ascii. */
void ff_text_json_string(ff_text *b, const char *s, int ascii);
/* A JSON number that reads back as v: the shortest of %.1g .. %.17g
 * (2e-06, 6.18516e+09, 1e+15), but integers below a million as integers
 * (100, not 1e+02). */
void ff_text_number(ff_text *b, double v);
void ff_text_free(ff_text *b);

#endif
