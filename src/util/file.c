/* Atomic file writing and error messages into a buffer (src/util/file.h). */
#include "file.h"

#include <errno.h>
#include <stdarg.h>
#include <unistd.h>

FILE *ff_atomic_open(const char *path, char *tmp)
{
    if (snprintf(tmp, FF_TMP_PATH_MAX, "%s.tmp.%ld", path, (long)getpid()) >= FF_TMP_PATH_MAX) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    return fopen(tmp, "wb");
}

int ff_atomic_commit(FILE *f, const char *tmp, const char *path)
{
    int ok = !ferror(f) && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (ok && rename(tmp, path) == 0)
        return 0;
    ff_atomic_abort(NULL, tmp);
    return -1;
}

void ff_atomic_abort(FILE *f, const char *tmp)
{
    int e = errno;
    if (f)
        fclose(f);
    unlink(tmp);
    errno = e;
}

int ff_write_file_atomic(const char *path, const void *data, size_t len)
{
    char tmp[FF_TMP_PATH_MAX];
    FILE *f = ff_atomic_open(path, tmp);
    if (!f)
        return -1;
    if (len && fwrite(data, 1, len, f) != len) {
        ff_atomic_abort(f, tmp);
        return -1;
    }
    return ff_atomic_commit(f, tmp, path);
}

int ff_file_writable(const char *path)
{
    char tmp[FF_TMP_PATH_MAX];
    FILE *f = ff_atomic_open(path, tmp);
    if (!f)
        return -1;
    ff_atomic_abort(f, tmp);
    return 0;
}

int ff_format_error(char *err, size_t len, int code, const char *fmt, ...)
{
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return code;
}
