/* The timeline: in-memory events per rank, written as one Chrome trace JSON
 * file by rank 0 (each rank a process, each track a thread). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "util/file.h"
#include "util/text.h"

enum { FF_TRACE_MAX_EVENTS = 1 << 18 };

int ff_trace_enable(ff_ctx *ctx)
{
    int rc = MPI_Barrier(ctx->comm);
    if (rc != MPI_SUCCESS)
        return ff_mpi_error(ctx, rc, "MPI_Barrier (aligning the trace clocks)");
    ctx->trace.zero = ff_now();
    ctx->trace.enabled = 1;
    return FF_OK;
}

int ff_trace_enabled(const ff_ctx *ctx) { return ctx->trace.enabled; }

void ff_trace_free(ff_trace *t)
{
    free(t->events);
    memset(t, 0, sizeof *t);
}

void ff_trace_record(ff_ctx *ctx, const char *name, char cat, int track, double t0, double t1)
{
    ff_trace *t = &ctx->trace;
    if (!t->enabled)
        return;
    if (t->count == t->cap) {
        if (t->cap >= FF_TRACE_MAX_EVENTS) {
            t->dropped++;
            return;
        }
        size_t cap = t->cap ? 2 * t->cap : 1024;
        ff_trace_event *e = realloc(t->events, cap * sizeof *e);
        if (!e) {
            t->dropped++;
            return;
        }
        t->events = e;
        t->cap = cap;
    }
    ff_trace_event *e = &t->events[t->count++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->cat = cat;
    e->track = (uint8_t)track;
    e->t0 = t0 - t->zero;
    e->t1 = t1 - t->zero;
}

int ff_trace_track_acquire(ff_ctx *ctx)
{
    ff_trace *t = &ctx->trace;
    if (!t->enabled)
        return 0;
    for (int i = 1; i < FF_TRACE_TRACKS; i++)
        if (!t->track_busy[i]) {
            t->track_busy[i] = 1;
            return i;
        }
    t->dropped++;
    return 0;
}

void ff_trace_track_release(ff_ctx *ctx, int track)
{
    if (track > 0 && track < FF_TRACE_TRACKS)
        ctx->trace.track_busy[track] = 0;
}

void ff_trace_begin(ff_ctx *ctx, const char *name)
{
    ff_trace *t = &ctx->trace;
    if (!t->enabled)
        return;
    if (t->depth < FF_TRACE_DEPTH) {
        snprintf(t->open_name[t->depth], FF_TRACE_NAME_LEN, "%s", name);
        t->open_t0[t->depth] = ff_now();
    }
    t->depth++;
}

void ff_trace_end(ff_ctx *ctx)
{
    ff_trace *t = &ctx->trace;
    if (!t->enabled || t->depth == 0)
        return;
    t->depth--;
    if (t->depth < FF_TRACE_DEPTH) {
        /* the engine records from inside its lock; take it for the buffer */
        pthread_mutex_lock(&ctx->lock);
        ff_trace_record(ctx, t->open_name[t->depth], 'c', 0, t->open_t0[t->depth], ff_now());
        pthread_mutex_unlock(&ctx->lock);
    }
}

/* ---- writing ---- */

static const char *track_name(int track) { return track == 0 ? "compute / wait" : "collective"; }

/* This rank's events as JSON objects, each preceded by ",\n". */
static void serialize(ff_ctx *ctx, ff_text *b)
{
    ff_trace *t = &ctx->trace;
    int pid = ctx->rank;
    uint8_t used[FF_TRACE_TRACKS] = {0};
    used[0] = 1;
    for (size_t i = 0; i < t->count; i++)
        used[t->events[i].track] = 1;
    ff_text_printf(
        b, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":", pid);
    char label[64];
    snprintf(label, sizeof label, "rank %d", pid);
    ff_text_json_string(b, t->label[0] ? t->label : label, 0);
    ff_text_printf(b,
                   "}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,"
                   "\"args\":{\"sort_index\":%d}}",
                   pid, pid);
    for (int k = 0; k < FF_TRACE_TRACKS; k++)
        if (used[k])
            ff_text_printf(b,
                           ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                           "\"args\":{\"name\":\"%s %d\"}}",
                           pid, k, track_name(k), k);
    for (size_t i = 0; i < t->count; i++) {
        const ff_trace_event *e = &t->events[i];
        const char *cat = e->cat == 'c' ? "compute" : e->cat == 'w' ? "wait" : "comm";
        ff_text_put(b, ",\n{\"name\":", 10);
        ff_text_json_string(b, e->name, 0);
        ff_text_printf(
            b, ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", cat,
            pid, e->track, e->t0 * 1e6, (e->t1 - e->t0) * 1e6);
    }
    if (t->dropped)
        ff_text_printf(
            b,
            ",\n{\"name\":\"dropped events\",\"ph\":\"i\",\"s\":\"p\",\"pid\":%d,\"tid\":0,"
            "\"ts\":0,\"args\":{\"count\":%zu}}",
            pid, t->dropped);
}

void ff_trace_set_label(ff_ctx *ctx, const char *label)
{
    snprintf(ctx->trace.label, sizeof ctx->trace.label, "%s", label);
}

int ff_trace_write(ff_ctx *ctx, const char *path)
{
    ff_text b = {0};
    pthread_mutex_lock(&ctx->lock);
    serialize(ctx, &b);
    pthread_mutex_unlock(&ctx->lock);
    int rc = FF_OK;
    if (b.failed)
        rc = ff_set_error(ctx, FF_ENOMEM, "out of memory serialising the trace");
    /* Rank 0 asks each rank in turn for its part and streams it to the file.
     * A rank first sends its length (-1 if it could not serialise); rank 0
     * answers "go" only if it can take the data, so no message is ever sent
     * that rank 0 does not receive in full, and nobody is left blocked. */
    const int tag = 7301;
    const long long piece = 1 << 30;
    if (ctx->rank != 0) {
        long long len = b.failed ? -1 : (long long)b.n;
        int go = 0;
        int mrc = MPI_Send(&len, 1, MPI_LONG_LONG, 0, tag, ctx->comm);
        if (mrc == MPI_SUCCESS)
            mrc = MPI_Recv(&go, 1, MPI_INT, 0, tag, ctx->comm, MPI_STATUS_IGNORE);
        for (long long off = 0; go && mrc == MPI_SUCCESS && off < len; off += piece) {
            long long n = len - off < piece ? len - off : piece;
            mrc = MPI_Send(b.s + off, (int)n, MPI_CHAR, 0, tag, ctx->comm);
        }
        if (mrc != MPI_SUCCESS && rc == FF_OK)
            rc = ff_mpi_error(ctx, mrc, "MPI_Send (trace)");
    } else {
        char tmp[FF_TMP_PATH_MAX];
        FILE *f = ff_atomic_open(path, tmp);
        if (!f && rc == FF_OK)
            rc = ff_set_error(ctx, FF_EIO, "cannot write trace %s: %s", path, strerror(errno));
        if (f)
            fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
                  "{\"name\":\"fourfold\",\"ph\":\"M\",\"pid\":0,\"args\":{}}",
                  f);
        if (f && b.n)
            fwrite(b.s, 1, b.n, f);
        char *part = NULL;
        for (int src = 1; src < ctx->size; src++) {
            long long len = 0;
            int mrc = MPI_Recv(&len, 1, MPI_LONG_LONG, src, tag, ctx->comm, MPI_STATUS_IGNORE);
            char *p = mrc == MPI_SUCCESS && len > 0 ? realloc(part, (size_t)len) : part;
            int go = mrc == MPI_SUCCESS && len > 0 && p != NULL;
            if (mrc == MPI_SUCCESS && len < 0 && rc == FF_OK)
                rc = ff_set_error(ctx, FF_ENOMEM, "rank %d could not serialise its trace", src);
            if (mrc == MPI_SUCCESS && len > 0 && !p && rc == FF_OK)
                rc = ff_set_error(ctx, FF_ENOMEM, "out of memory receiving rank %d's trace", src);
            if (mrc == MPI_SUCCESS)
                mrc = MPI_Send(&go, 1, MPI_INT, src, tag, ctx->comm);
            if (p)
                part = p;
            for (long long off = 0; go && mrc == MPI_SUCCESS && off < len; off += piece) {
                long long n = len - off < piece ? len - off : piece;
                mrc =
                    MPI_Recv(part + off, (int)n, MPI_CHAR, src, tag, ctx->comm, MPI_STATUS_IGNORE);
            }
            if (mrc != MPI_SUCCESS && rc == FF_OK)
                rc = ff_mpi_error(ctx, mrc, "receiving the trace");
            if (f && go)
                fwrite(part, 1, (size_t)len, f);
        }
        free(part);
        if (f && rc != FF_OK) {
            ff_atomic_abort(f, tmp);
        } else if (f) {
            fputs("\n]}\n", f);
            if (ff_atomic_commit(f, tmp, path) != 0)
                rc = ff_set_error(ctx, FF_EIO, "cannot write trace %s: %s", path, strerror(errno));
        }
    }
    free(b.s);
    return ff_ctx_agree(ctx, rc);
}
