/* Atomic file writing and error messages into a buffer (src/util/file.h). */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
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

int ff_open_regular(const char *path)
{
    /* non-blocking: opening a FIFO for reading would wait for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    const int stat_ok = fstat(fd, &st) == 0, stat_errno = errno;
    if (!stat_ok || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = stat_ok ? EINVAL : stat_errno;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

FILE *ff_fopen_regular(const char *path)
{
    int fd = ff_open_regular(path);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (fd >= 0 && !f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

const char *ff_open_error(int err)
{
    return err == EINVAL ? "not a regular file" : strerror(err);
}
