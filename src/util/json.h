/* A small strict JSON reader, for the readers of fourfold's JSON files
 * (machine profiles, per-layer plans); the writer is util/text.h. Not
 * installed.
 *
 * The reader walks the text; the caller knows the schema and asks for what
 * it expects next (a '{', a string, a number, ...). The first failure is
 * kept: its code in `rc`, one sentence in err naming the kind of file, the
 * file, the line, and what was being read ("profile p.json: line 3: pick 2:
 * ..."), and every later call returns that code. Grammar errors are
 * FF_ECORRUPT; a number out of double's range is FF_EINVAL. */
#ifndef FF_JSON_H
#define FF_JSON_H

#include <stddef.h>

enum { FF_JSON_MAX_DEPTH = 32 };

typedef struct {
    const char *begin, *p, *end;
    const char *kind;   /* "profile", "plan": the first word of messages */
    const char *source; /* the file's name */
    char *err;
    size_t err_len;
    int rc;         /* FF_OK, or the first failure's code */
    char where[48]; /* what is being read, for messages ("pick 3: "), or "" */
} ff_json;

void ff_json_init(ff_json *r, const char *text, size_t len, const char *kind, const char *source,
                  char *err, size_t err_len);
/* Records a failure at the current position (unless one is recorded) and
 * returns r->rc. */
int ff_json_fail(ff_json *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void ff_json_skip_ws(ff_json *r);
/* 1 if, after white space, the next character is c (not consumed). */
int ff_json_at(ff_json *r, char c);
int ff_json_at_number(ff_json *r);
int ff_json_at_string(ff_json *r);
/* Consumes c after white space, or fails. */
int ff_json_expect(ff_json *r, char c);
/* Opens an object or a list (`open` '{' or '['): 1 if members follow, 0 if
 * it was empty (closed too), negative on failure. */
int ff_json_open(ff_json *r, char open);
/* After a member: 1 if a ',' follows (consumed), 0 if `close` does
 * (consumed), negative on failure. */
int ff_json_next_member(ff_json *r, char close);
/* A string into out (truncated to cap-1; non-ASCII escapes become '?'; out
 * may be NULL to skip it). */
int ff_json_string(ff_json *r, char *out, size_t cap);
/* A string into out as UTF-8 (\u escapes and surrogate pairs decoded; a
 * lone surrogate refused); *len (if not NULL) gets its length in bytes,
 * which may include NULs from \u0000. A string of cap bytes or more is
 * refused rather than truncated. out may be NULL to skip it. */
int ff_json_string_utf8(ff_json *r, char *out, size_t cap, size_t *len);
/* A number by JSON's grammar (no leading '+' or zeros, no hex, NaN or
 * Infinity), converted with strtod. */
int ff_json_number(ff_json *r, double *out);
/* Parses and discards any value, nested at most FF_JSON_MAX_DEPTH - depth. */
int ff_json_skip_value(ff_json *r, int depth);
/* FF_EINVAL naming `key` unless v is in [lo, hi] (lo excluded if lo_open),
 * and an integer if `integer`. */
int ff_json_check_range(ff_json *r, const char *key, double v, double lo, double hi, int lo_open,
                        int integer);

/* Reads a whole file of at most `max` bytes into *text (malloc'd,
 * NUL-terminated; *len without the NUL). FF_EIO if it cannot be opened or
 * read, FF_ECORRUPT if empty or larger, FF_ENOMEM; the message names the
 * kind and the file ("cannot open plan p.json: ..."). */
int ff_json_read_file(const char *path, const char *kind, size_t max, char **text, size_t *len,
                      char *err, size_t err_len);

#endif
