/* Atomic file writing (src/util/file.h). */
#include "file.h"

#include <errno.h>
#include <unistd.h>

FILE *ff_atomic_open(const char *path, char *tmp, size_t tmplen)
{
    if ((size_t)snprintf(tmp, tmplen, "%s.tmp.%ld", path, (long)getpid()) >= tmplen) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    return fopen(tmp, "w");
}

int ff_atomic_commit(FILE *f, const char *tmp, const char *path)
{
    int ok = !ferror(f) && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (ok && rename(tmp, path) == 0)
        return 0;
    int e = errno;
    unlink(tmp);
    errno = e;
    return -1;
}

int ff_write_file_atomic(const char *path, const char *text)
{
    char tmp[4200];
    FILE *f = ff_atomic_open(path, tmp, sizeof tmp);
    if (!f)
        return -1;
    if (fputs(text, f) < 0) {
        int e = errno;
        fclose(f);
        unlink(tmp);
        errno = e;
        return -1;
    }
    return ff_atomic_commit(f, tmp, path);
}
