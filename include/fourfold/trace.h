/* A per-rank timeline in the Chrome trace format (open it in Perfetto or
 * chrome://tracing).
 *
 * Each rank is a process; track 0 holds compute regions (ff_trace_begin/end,
 * nestable) and the intervals spent blocked in ff_wait; tracks 1.. hold each
 * collective from its post to its observed completion, one track per
 * collective in flight, so overlapping collectives are visible side by side.
 * Recording is off until ff_trace_enable(); events are kept in memory
 * (bounded) and written by ff_trace_write(). */
#ifndef FOURFOLD_TRACE_H
#define FOURFOLD_TRACE_H

#include "fourfold/ctx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Starts recording. Timestamps count from this call; collective over the
 * context's communicator (a barrier aligns the ranks' zero). */
int ff_trace_enable(ff_ctx *ctx);
int ff_trace_enabled(const ff_ctx *ctx);

/* Names this rank's process in the viewer (default "rank N"). */
void ff_trace_set_label(ff_ctx *ctx, const char *label);

/* A compute region on track 0; regions nest. `name` is copied. */
void ff_trace_begin(ff_ctx *ctx, const char *name);
void ff_trace_end(ff_ctx *ctx);

/* Gathers every rank's events to rank 0, which writes `path` atomically
 * (temporary file, fsync, rename). Collective; every rank gets the result. */
int ff_trace_write(ff_ctx *ctx, const char *path);

#ifdef __cplusplus
}
#endif
#endif
