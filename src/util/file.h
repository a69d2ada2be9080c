/* Atomic file writing: a temporary file beside the target, fsync, rename,
 * so a reader sees the old file or the whole new one. Not installed; every
 * writer of a whole file in the library and the program uses it (the only
 * rename in src/). */
#ifndef FF_FILE_H
#define FF_FILE_H

#include <stddef.h>
#include <stdio.h>

/* Room for a temporary file's name: the target's (PATH_MAX) and a suffix. */
enum { FF_TMP_PATH_MAX = 4096 + 32 };

/* Opens PATH.tmp.PID for writing; tmp (FF_TMP_PATH_MAX) gets its name. NULL
 * on failure (errno set). */
FILE *ff_atomic_open(const char *path, char *tmp);
/* Flushes, fsyncs and closes f, then renames tmp over path. 0, or -1 with
 * errno (the temporary file removed, path untouched). */
int ff_atomic_commit(FILE *f, const char *tmp, const char *path);
/* Gives up: closes f (if any) and removes tmp; errno kept. */
void ff_atomic_abort(FILE *f, const char *tmp);
/* len bytes of data to path through the three above. 0 or -1 with errno. */
int ff_write_file_atomic(const char *path, const void *data, size_t len);
/* 0 if ff_atomic_open(path) can create its temporary file (made and removed
 * here), else -1 with errno: checked before long work whose result goes there. */
int ff_file_writable(const char *path);

/* Inputs that must be regular files (checkpoints, shards, masks, plans):
 * opened without blocking on a FIFO, refused unless a regular file. A
 * descriptor (or a FILE* for reading) or -1/NULL with errno: EINVAL for
 * "not a regular file" (ff_open_error names it). */
int ff_open_regular(const char *path);
FILE *ff_fopen_regular(const char *path);
const char *ff_open_error(int err);

/* Formats a message into err (if any; len bytes) and returns code: the
 * library's pure functions report errors this way (one sentence naming the
 * problem), the context-bound ones through ff_ctx_set_error. */
int ff_format_error(char *err, size_t len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
