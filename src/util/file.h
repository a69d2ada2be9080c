/* Atomic file writing: a temporary file beside the target, fsync, rename,
 * so a reader sees the old file or the whole new one. Not installed; the
 * library's and the program's writers of whole files share it. */
#ifndef FF_FILE_H
#define FF_FILE_H

#include <stddef.h>
#include <stdio.h>

/* Opens PATH.tmp.PID for writing; tmp gets its name. NULL on failure (errno set). */
FILE *ff_atomic_open(const char *path, char *tmp, size_t tmplen);
/* Flushes, fsyncs and closes f, then renames tmp over path. 0, or -1 with
 * errno (the temporary file removed, path untouched). */
int ff_atomic_commit(FILE *f, const char *tmp, const char *path);
/* The whole of text to path through the two above. 0 or -1 with errno. */
int ff_write_file_atomic(const char *path, const char *text);

#endif
