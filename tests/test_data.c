/* Token shards and the batch reader (include/fourfold/data.h), under mpirun.
 *
 * Shard i's token at offset o is tok_of(i, o), unique over the whole data
 * set, so a token read names the exact place it came from. The expected
 * windows are computed here independently of the reader: the list of every
 * window of one epoch (shard by shard, offsets 0, S-1, 2(S-1), ... while the
 * window fits), step k reading window k mod L in epoch k / L.
 *
 * 1. reader: for several (n_micro, B, T), every rank (on its own, MPI_COMM_SELF)
 *    splits B over 1, 2, 4 and an uneven pair of readers; the union of their
 *    sequences equals the expected window for 2 epochs and more, shards too
 *    small for the window skipped; the position after each step is checked.
 *    Then all ranks on MPI_COMM_WORLD each read their part of B, gathered.
 * 2. tell/seek: read, save, read on, seek back (and resume on a fresh reader
 *    with another split): the same tokens.
 * 3. refusals, agreed on every rank with the code and the file's name.
 *
 * A temporary folder under /tmp (rank 0 creates, removes) holds the shards. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fourfold/fourfold.h"
#include "test_util.h"

enum { NSHARDS = 5, VOCAB = 65536 };
/* shards 1 and 3 are too small for most windows and must be skipped */
/* 601 = 600 + 1 and 321 = 320 + 1 = 5 * 64 + 1: windows of 601, 321 and 65
 * tokens end exactly at a shard's end */
static const int64_t shard_sizes[NSHARDS] = {601, 40, 1500, 10, 321};

static int rank, nranks;
static char dir[256];

static uint16_t tok_of(int shard, int64_t off) { return (uint16_t)((shard * 4096 + off) % 65521); }

static void path_of(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", dir, name);
}

/* Writes a shard whose token at o is tok_of(id, o) (rank 0 only). */
static void write_shard(const char *name, int id, int64_t n)
{
    char path[512], err[512];
    uint16_t *t = malloc((size_t)(n > 0 ? n : 1) * sizeof(uint16_t));
    for (int64_t o = 0; o < n; o++)
        t[o] = tok_of(id, o);
    path_of(path, sizeof path, name);
    int rc = ff_shard_write(path, t, n, err, sizeof err);
    CHECK(rc == FF_OK, "ff_shard_write %s: %s", path, err);
    free(t);
}

/* ---- the expected stream ------------------------------------------------------------ */

typedef struct {
    int shard;
    int64_t off;
} win_at;

/* Every window of one epoch, in order; returns their number L. */
static int epoch_windows(int64_t S, win_at *w, int max)
{
    int n = 0;
    for (int i = 0; i < NSHARDS; i++)
        for (int64_t off = 0; off + S <= shard_sizes[i]; off += S - 1)
            if (n < max)
                w[n++] = (win_at){i, off};
    return n;
}

/* The expected tokens of step k: (n_micro*B, T) tokens and targets. */
static void expected_step(const win_at *w, int L, int k, int nseq, int T, int32_t *tok,
                          int32_t *tgt)
{
    const win_at *x = &w[k % L];
    for (int s = 0; s < nseq; s++)
        for (int t = 0; t < T; t++) {
            tok[s * T + t] = tok_of(x->shard, x->off + (int64_t)s * T + t);
            tgt[s * T + t] = tok_of(x->shard, x->off + (int64_t)s * T + t + 1);
        }
}

/* Places a reader's rows (u, j) at their global sequence u*B + first + j. */
static void place(int n_micro, int B, int T, int first, int count, const int32_t *local,
                  int32_t *global, int *filled)
{
    for (int u = 0; u < n_micro; u++)
        for (int j = 0; j < count; j++) {
            int s = u * B + first + j;
            memcpy(global + (size_t)s * T, local + ((size_t)u * count + j) * T,
                   (size_t)T * sizeof(int32_t));
            if (filled)
                filled[s]++;
        }
}

typedef struct {
    int n_micro, B, T;
} shape;

static const shape shapes[] = {{1, 4, 8},  {2, 4, 16}, {3, 4, 5},  {4, 4, 4},
                               {1, 8, 40}, {2, 8, 20}, {1, 4, 150}};

/* ---- 1. the reader over splits of B ------------------------------------------------ */

static void test_splits(ff_ctx *self, const char *pattern, const shape *sh)
{
    const int n_micro = sh->n_micro, B = sh->B, T = sh->T, nseq = n_micro * B;
    const int64_t S = (int64_t)nseq * T + 1;
    win_at w[1024];
    const int L = epoch_windows(S, w, 1024);
    const int steps = 2 * L + 3;
    /* each split: the part boundaries over B */
    int splits[4][5] = {{0, B}, {0, B / 2, B}, {0, B / 4, B / 2, 3 * B / 4, B}, {0, 1, B}};
    const int nparts[4] = {1, 2, 4, 2};
    int32_t *exp_tok = malloc((size_t)nseq * T * sizeof(int32_t));
    int32_t *exp_tgt = malloc((size_t)nseq * T * sizeof(int32_t));
    int32_t *all_tok = malloc((size_t)nseq * T * sizeof(int32_t));
    int32_t *all_tgt = malloc((size_t)nseq * T * sizeof(int32_t));
    int32_t *tok = malloc((size_t)nseq * T * sizeof(int32_t));
    int32_t *tgt = malloc((size_t)nseq * T * sizeof(int32_t));
    int *filled = malloc((size_t)nseq * sizeof(int));
    int skipped = 0, wrong = 0, bad_pos = 0;
    for (int i = 0; i < NSHARDS; i++)
        skipped += shard_sizes[i] < S;
    for (int sp = 0; sp < 4; sp++) {
        ff_data *r[4] = {NULL, NULL, NULL, NULL};
        int ok = 1;
        for (int p = 0; p < nparts[sp]; p++) {
            int rc = ff_data_open(self, pattern, S, &r[p]);
            CHECK(rc == FF_OK, "ff_data_open(%s, %lld): %s", pattern, (long long)S,
                  ff_ctx_error(self));
            ok &= rc == FF_OK;
        }
        for (int k = 0; k < steps && ok; k++) {
            memset(filled, 0, (size_t)nseq * sizeof(int));
            for (int p = 0; p < nparts[sp]; p++) {
                int first = splits[sp][p], count = splits[sp][p + 1] - first;
                int rc = ff_data_next(r[p], n_micro, B, T, first, count, VOCAB, tok, tgt);
                CHECK(rc == FF_OK, "ff_data_next: %s", ff_ctx_error(self));
                place(n_micro, B, T, first, count, tok, all_tok, filled);
                place(n_micro, B, T, first, count, tgt, all_tgt, NULL);
                ff_data_pos pos = ff_data_tell(r[p]);
                const win_at *x = &w[k % L];
                if (pos.shard != x->shard || pos.offset != x->off + S - 1 || pos.epoch != k / L)
                    bad_pos++;
            }
            /* the parts cover every sequence of the step once */
            for (int s = 0; s < nseq; s++)
                if (filled[s] != 1)
                    wrong++;
            expected_step(w, L, k, nseq, T, exp_tok, exp_tgt);
            if (memcmp(all_tok, exp_tok, (size_t)nseq * T * sizeof(int32_t)) ||
                memcmp(all_tgt, exp_tgt, (size_t)nseq * T * sizeof(int32_t)))
                wrong++;
        }
        for (int p = 0; p < nparts[sp]; p++)
            ff_data_close(r[p]);
    }
    CHECK(wrong == 0, "n_micro=%d B=%d T=%d: %d steps differ from the expected windows", n_micro, B,
          T, wrong);
    CHECK(bad_pos == 0, "n_micro=%d B=%d T=%d: %d wrong positions after a step", n_micro, B, T,
          bad_pos);
    printf("[rank %d] reader n_micro=%d B=%d T=%d: window %4lld, %2d windows/epoch (%d shards "
           "skipped), %3d steps (epochs 0..%d) x splits 1,2,4,1+%d of B: %s\n",
           rank, n_micro, B, T, (long long)S, L, skipped, steps, (steps - 1) / L, B - 1,
           wrong || bad_pos ? "FAIL" : "PASS");
    fflush(stdout);
    free(exp_tok);
    free(exp_tgt);
    free(all_tok);
    free(all_tgt);
    free(tok);
    free(tgt);
    free(filled);
}

/* Every rank of the world reads its own B/nranks sequences, as the ranks of
 * the (z, d) pairs do; the gathered steps equal the expected windows. */
static void test_world(ff_ctx *world, const char *pattern, int n_micro, int T)
{
    const int B = 2 * nranks, per = B / nranks, nseq = n_micro * B, first = rank * per;
    const int64_t S = (int64_t)nseq * T + 1;
    win_at w[1024];
    const int L = epoch_windows(S, w, 1024), steps = L + 2;
    size_t local = (size_t)n_micro * per * T, global = (size_t)nseq * T;
    int32_t *tok = malloc(local * sizeof(int32_t)), *tgt = malloc(local * sizeof(int32_t));
    int32_t *g_tok = malloc(global * sizeof(int32_t)), *g_tgt = malloc(global * sizeof(int32_t));
    int32_t *a_tok = malloc(global * sizeof(int32_t)), *a_tgt = malloc(global * sizeof(int32_t));
    int32_t *e_tok = malloc(global * sizeof(int32_t)), *e_tgt = malloc(global * sizeof(int32_t));
    ff_data *d;
    int rc = ff_data_open(world, pattern, S, &d), wrong = 0;
    CHECK(rc == FF_OK, "ff_data_open on the world: %s", ff_ctx_error(world));
    for (int k = 0; k < steps && rc == FF_OK; k++) {
        rc = ff_data_next(d, n_micro, B, T, first, per, VOCAB, tok, tgt);
        CHECK(rc == FF_OK, "ff_data_next: %s", ff_ctx_error(world));
        MPI_Allgather(tok, (int)local, MPI_INT32_T, g_tok, (int)local, MPI_INT32_T, MPI_COMM_WORLD);
        MPI_Allgather(tgt, (int)local, MPI_INT32_T, g_tgt, (int)local, MPI_INT32_T, MPI_COMM_WORLD);
        for (int q = 0; q < nranks; q++) {
            place(n_micro, B, T, q * per, per, g_tok + q * local, a_tok, NULL);
            place(n_micro, B, T, q * per, per, g_tgt + q * local, a_tgt, NULL);
        }
        expected_step(w, L, k, nseq, T, e_tok, e_tgt);
        if (memcmp(a_tok, e_tok, global * sizeof(int32_t)) ||
            memcmp(a_tgt, e_tgt, global * sizeof(int32_t)))
            wrong++;
        /* positions equal on every rank */
        ff_data_pos p = ff_data_tell(d);
        int64_t mine[3] = {p.shard, p.offset, p.epoch}, lo[3], hi[3];
        MPI_Allreduce(mine, lo, 3, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(mine, hi, 3, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        if (memcmp(lo, hi, sizeof lo))
            wrong++;
    }
    ff_data_close(d);
    CHECK(wrong == 0, "world: %d steps differ", wrong);
    if (rank == 0)
        printf("world: %d ranks read %d sequences each of n_micro=%d B=%d T=%d, %d steps "
               "gathered = expected windows, positions equal: %s\n",
               nranks, per, n_micro, B, T, steps, wrong ? "FAIL" : "PASS");
    free(tok);
    free(tgt);
    free(g_tok);
    free(g_tgt);
    free(a_tok);
    free(a_tgt);
    free(e_tok);
    free(e_tgt);
}

/* ---- 2. tell and seek -------------------------------------------------------------- */

static void test_seek(ff_ctx *self, const char *pattern)
{
    const int n_micro = 3, B = 4, T = 5, nseq = n_micro * B, k0 = 7, m = 100;
    const int64_t S = (int64_t)nseq * T + 1;
    const size_t step = (size_t)nseq * T;
    int32_t *rec_tok = malloc((size_t)m * step * sizeof(int32_t));
    int32_t *rec_tgt = malloc((size_t)m * step * sizeof(int32_t));
    int32_t *tok = malloc(step * sizeof(int32_t)), *tgt = malloc(step * sizeof(int32_t));
    int32_t *a_tok = malloc(step * sizeof(int32_t)), *a_tgt = malloc(step * sizeof(int32_t));
    win_at w[1024];
    const int L = epoch_windows(S, w, 1024);
    ff_data *d, *r1, *r2;
    int rc = ff_data_open(self, pattern, S, &d);
    CHECK(rc == FF_OK, "open: %s", ff_ctx_error(self));
    if (rc != FF_OK)
        return;
    for (int k = 0; k < k0; k++)
        rc |= ff_data_next(d, n_micro, B, T, 0, B, VOCAB, tok, tgt);
    ff_data_pos saved = ff_data_tell(d);
    for (int k = 0; k < m; k++)
        rc |= ff_data_next(d, n_micro, B, T, 0, B, VOCAB, rec_tok + k * step, rec_tgt + k * step);
    ff_data_pos end = ff_data_tell(d);
    CHECK(rc == FF_OK, "reading: %s", ff_ctx_error(self));
    /* seek back on the same reader */
    int same = 0;
    CHECK(ff_data_seek(d, saved) == FF_OK, "seek: %s", ff_ctx_error(self));
    for (int k = 0; k < m; k++) {
        ff_data_next(d, n_micro, B, T, 0, B, VOCAB, tok, tgt);
        same += !memcmp(tok, rec_tok + k * step, step * sizeof(int32_t)) &&
                !memcmp(tgt, rec_tgt + k * step, step * sizeof(int32_t));
    }
    ff_data_pos end2 = ff_data_tell(d);
    CHECK(same == m, "seek back: %d of %d steps identical", same, m);
    CHECK(!memcmp(&end, &end2, sizeof end), "seek back: a different final position");
    /* resume on fresh readers, B split over two of them (another grid) */
    int resumed = 0;
    CHECK(ff_data_open(self, pattern, S, &r1) == FF_OK, "open: %s", ff_ctx_error(self));
    CHECK(ff_data_open(self, pattern, S, &r2) == FF_OK, "open: %s", ff_ctx_error(self));
    CHECK(ff_data_seek(r1, saved) == FF_OK && ff_data_seek(r2, saved) == FF_OK, "seek: %s",
          ff_ctx_error(self));
    for (int k = 0; k < m; k++) {
        ff_data_next(r1, n_micro, B, T, 0, 1, VOCAB, tok, tgt);
        place(n_micro, B, T, 0, 1, tok, a_tok, NULL);
        place(n_micro, B, T, 0, 1, tgt, a_tgt, NULL);
        ff_data_next(r2, n_micro, B, T, 1, B - 1, VOCAB, tok, tgt);
        place(n_micro, B, T, 1, B - 1, tok, a_tok, NULL);
        place(n_micro, B, T, 1, B - 1, tgt, a_tgt, NULL);
        resumed += !memcmp(a_tok, rec_tok + k * step, step * sizeof(int32_t)) &&
                   !memcmp(a_tgt, rec_tgt + k * step, step * sizeof(int32_t));
    }
    CHECK(resumed == m, "resume on a 1+3 split: %d of %d steps identical", resumed, m);
    /* a position at the very end of shard 0 reads on from shard 2 (1 is too small) */
    int32_t *e_tok = malloc(step * sizeof(int32_t)), *e_tgt = malloc(step * sizeof(int32_t));
    ff_data_pos at_end = {0, shard_sizes[0], 3};
    CHECK(ff_data_seek(r1, at_end) == FF_OK, "seek to the end of shard 0: %s", ff_ctx_error(self));
    ff_data_next(r1, n_micro, B, T, 0, B, VOCAB, tok, tgt);
    win_at first2[1] = {{2, 0}};
    expected_step(first2, 1, 0, nseq, T, e_tok, e_tgt);
    ff_data_pos p = ff_data_tell(r1);
    CHECK(!memcmp(tok, e_tok, step * sizeof(int32_t)) && p.shard == 2 && p.offset == S - 1 &&
              p.epoch == 3,
          "after the end of shard 0: not shard 2 offset 0 epoch 3 (%lld %lld %lld)",
          (long long)p.shard, (long long)p.offset, (long long)p.epoch);
    /* positions outside the shards, and a step of another window, are refused */
    const ff_data_pos bad[] = {{-1, 0, 0}, {NSHARDS, 0, 0}, {0, shard_sizes[0] + 1, 0}, {0, 0, -1}};
    int refused = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refused += ff_data_seek(r1, bad[i]) == FF_EINVAL &&
                   strstr(ff_ctx_error(self), "outside the 5 shards") != NULL;
    CHECK(refused == 4, "%d of 4 bad positions refused", refused);
    ff_data_pos still = ff_data_tell(r1);
    CHECK(!memcmp(&still, &p, sizeof p), "a refused seek moved the position");
    int rc2 = ff_data_next(r1, n_micro, B, T + 1, 0, B, VOCAB, tok, tgt);
    CHECK(rc2 == FF_EINVAL && strstr(ff_ctx_error(self), "reader was opened for"),
          "a step of another window: %s (%s)", ff_strerror(rc2), ff_ctx_error(self));
    rc2 = ff_data_next(r1, n_micro, B, T, 2, 3, VOCAB, tok, tgt);
    CHECK(rc2 == FF_EINVAL, "sequences [2, 5) of B=4 accepted: %s", ff_strerror(rc2));
    /* windows spread over the places a window of S = 61 tokens can start in
     * the five shards (601, 40, 1500, 10, 321 tokens: 541 + 0 + 1440 + 0 +
     * 261 = 2242 starts): start floor(i * 2242 / 4), worked out by hand;
     * shards 1 and 3 hold no window */
    const ff_data_pos want[4] = {{0, 0, 0}, {2, 19, 0}, {2, 580, 0}, {2, 1140, 0}};
    int spread_ok = 1;
    for (int i = 0; i < 4; i++) {
        ff_data_pos q = ff_data_spread(r1, i, 4);
        spread_ok &= q.shard == want[i].shard && q.offset == want[i].offset && q.epoch == 0;
    }
    ff_data_pos q = ff_data_spread(r1, 9, 10); /* start 2017 = shard 4, offset 36 */
    spread_ok &= q.shard == 4 && q.offset == 36;
    q = ff_data_spread(r1, 4, 4); /* outside 0..n-1: window 0 */
    spread_ok &= q.shard == 0 && q.offset == 0;
    ff_data *r3; /* windows of one token and its target */
    int rc3 = ff_data_open(self, pattern, 2, &r3);
    if (rc3 == FF_OK) {
        /* S = 2: 600 + 39 + 1499 + 9 + 320 = 2467 starts; start 1233 = shard 2, 594 */
        rc3 = ff_data_seek(r3, ff_data_spread(r3, 1, 2));
        rc3 |= ff_data_next(r3, 1, 1, 1, 0, 1, VOCAB, tok, tgt);
        ff_data_close(r3);
    }
    spread_ok &= rc3 == FF_OK && tok[0] == tok_of(2, 594) && tgt[0] == tok_of(2, 595);
    CHECK(spread_ok, "ff_data_spread: positions or the window read there differ from expected");
    if (rank == 0)
        printf("tell/seek: n_micro=%d B=%d T=%d, %d steps, saved (%lld, %lld, %lld), %d steps "
               "(%d windows/epoch) read again after seek: %d identical; resumed on a 1+3 split: "
               "%d identical; end of shard 0 -> shard 2; %d/4 bad positions refused; spread "
               "windows %s: %s\n",
               n_micro, B, T, k0, (long long)saved.shard, (long long)saved.offset,
               (long long)saved.epoch, m, L, same, resumed, refused, spread_ok ? "right" : "wrong",
               same == m && resumed == m && refused == 4 && spread_ok ? "PASS" : "FAIL");
    ff_data_close(d);
    ff_data_close(r1);
    ff_data_close(r2);
    free(rec_tok);
    free(rec_tgt);
    free(tok);
    free(tgt);
    free(a_tok);
    free(a_tgt);
    free(e_tok);
    free(e_tgt);
}

/* ---- 3. refusals, agreed on every rank ----------------------------------------------- */

static void patch_int(const char *name, int64_t at, int32_t v)
{
    char path[512];
    path_of(path, sizeof path, name);
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, &v, sizeof v, (off_t)at) == (ssize_t)sizeof v, "patch %s", path);
    if (fd >= 0)
        close(fd);
}

static void resize(const char *name, int64_t bytes)
{
    char path[512];
    path_of(path, sizeof path, name);
    CHECK(truncate(path, (off_t)bytes) == 0, "truncate %s", path);
}

/* Every rank opens `pattern` (relative to dir) and must get `want` with a
 * message holding `name` and `phrase`. */
static void refuse(ff_ctx *world, const char *what, const char *pattern, int64_t window, int want,
                   const char *name, const char *phrase)
{
    char path[512];
    path_of(path, sizeof path, pattern);
    ff_data *d = (ff_data *)&d;
    int rc = ff_data_open(world, path, window, &d);
    const char *msg = ff_ctx_error(world);
    int ok = rc == want && d == NULL && strstr(msg, name) && strstr(msg, phrase);
    CHECK(ok, "%s: rank %d got %s '%s', want %s with '%s' and '%s'", what, rank, ff_strerror(rc),
          msg, ff_strerror(want), name, phrase);
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0)
        printf("refuse %-22s %-15s on %d ranks: %s\n    %s\n", what, ff_strerror(want), nranks,
               all ? "PASS" : "FAIL", msg);
}

static void test_refusals(ff_ctx *world)
{
    if (rank == 0) {
        write_shard("magic.bin", 0, 100);
        patch_int("magic.bin", 0, 20240326); /* a GPT-2 checkpoint's magic */
        write_shard("version.bin", 0, 100);
        patch_int("version.bin", 4, 2);
        write_shard("negative.bin", 0, 0);
        patch_int("negative.bin", 8, -5);
        write_shard("trunc.bin", 0, 100);
        resize("trunc.bin", 1024 + 2 * 60);
        write_shard("long.bin", 0, 100);
        resize("long.bin", 1024 + 2 * 100 + 3);
        write_shard("stub.bin", 0, 100);
        resize("stub.bin", 500);
        write_shard("small_a.bin", 0, 100);
        write_shard("small_b.bin", 1, 50);
        write_shard("mix_a.bin", 0, 300);
        write_shard("mix_b.bin", 1, 300);
        resize("mix_b.bin", 1024 + 2 * 299);
        write_shard("mix_c.bin", 2, 300);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    refuse(world, "no file matches", "none_*.bin", 10, FF_EIO, "none_*.bin", "no file matches");
    refuse(world, "bad magic", "magic.bin", 10, FF_ECORRUPT, "magic.bin",
           "is not a token shard (magic 20240326");
    refuse(world, "version 2", "version.bin", 10, FF_EUNSUPPORTED, "version.bin", "version 2");
    refuse(world, "negative count", "negative.bin", 10, FF_ECORRUPT, "negative.bin",
           "negative token count");
    refuse(world, "truncated", "trunc.bin", 10, FF_ECORRUPT, "trunc.bin",
           "is truncated: header says 100 tokens, the file holds 60");
    refuse(world, "longer", "long.bin", 10, FF_ECORRUPT, "long.bin",
           "is longer than its header says");
    refuse(world, "shorter than header", "stub.bin", 10, FF_ECORRUPT, "stub.bin",
           "shorter than its 1024-byte header");
    refuse(world, "truncated among good", "mix_*.bin", 10, FF_ECORRUPT, "mix_b.bin",
           "header says 300 tokens, the file holds 299");
    refuse(world, "no shard big enough", "small_*.bin", 101, FF_EINVAL, "small_a.bin",
           "window of 101 tokens (n_micro*B*T + 1); the largest, ");
    refuse(world, "window of 1 token", "small_*.bin", 1, FF_EINVAL, "window of 1", "at least 2");

    /* ff_shard_read checks the same; ff_shard_write into a missing folder */
    char path[512], err[512];
    uint16_t *t = NULL;
    int64_t n = -1;
    path_of(path, sizeof path, "trunc.bin");
    int rc = ff_shard_read(path, &t, &n, err, sizeof err);
    CHECK(rc == FF_ECORRUPT && strstr(err, "trunc.bin") && t == NULL, "ff_shard_read: %s %s",
          ff_strerror(rc), err);
    path_of(path, sizeof path, "missing/x.bin");
    uint16_t one = 1;
    int rc2 = ff_shard_write(path, &one, 1, err, sizeof err);
    CHECK(rc2 == FF_EIO && strstr(err, "missing/x.bin"),
          "ff_shard_write into a missing folder: "
          "%s %s",
          ff_strerror(rc2), err);
    path_of(path, sizeof path, "small_b.bin");
    int rc3 = ff_shard_read(path, &t, &n, err, sizeof err), same = rc3 == FF_OK && n == 50;
    for (int64_t o = 0; same && o < n; o++)
        same = t[o] == tok_of(1, o);
    CHECK(same, "ff_shard_read of a good shard: %s, %lld tokens", ff_strerror(rc3), (long long)n);
    free(t);
    if (rank == 0)
        printf("ff_shard_read: truncated refused (%s), 50 tokens read back %s; ff_shard_write "
               "into a missing folder: %s\n",
               ff_strerror(rc), same ? "equal" : "DIFFERENT", ff_strerror(rc2));
}

/* A token outside the vocabulary in one rank's sequences: that rank fails
 * alone in ff_data_next (local), ff_ctx_agree makes it everyone's error.
 * bad_seq: the sequence whose token `at` (0..T, T: its last target) is bad. */
static void test_vocab(ff_ctx *world, const char *name, int bad_seq, int at)
{
    const int B = 2 * nranks, T = 10, per = 2, bad_rank = bad_seq / per;
    const int64_t bad_at = (int64_t)bad_seq * T + at;
    const int64_t n = 200;
    char path[512], offset[64];
    path_of(path, sizeof path, name);
    if (rank == 0) {
        char err[512];
        uint16_t *t = malloc((size_t)n * sizeof(uint16_t));
        for (int64_t o = 0; o < n; o++)
            t[o] = (uint16_t)(o % FF_BYTE_VOCAB);
        t[bad_at] = 300;
        CHECK(ff_shard_write(path, t, n, err, sizeof err) == FF_OK, "%s", err);
        free(t);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(offset, sizeof offset, "token 300 at offset %lld", (long long)bad_at);
    ff_data *d;
    int rc = ff_data_open(world, path, (int64_t)B * T + 1, &d);
    CHECK(rc == FF_OK, "open %s: %s", name, ff_ctx_error(world));
    if (rc != FF_OK)
        return;
    int32_t tok[2 * 10], tgt[2 * 10];
    int local = ff_data_next(d, 1, B, T, rank * per, per, FF_BYTE_VOCAB, tok, tgt);
    CHECK(local == (rank == bad_rank ? FF_ECORRUPT : FF_OK), "rank %d: local %s (%s)", rank,
          ff_strerror(local), ff_ctx_error(world));
    int agreed = ff_ctx_agree(world, local);
    const char *msg = ff_ctx_error(world);
    int ok = agreed == FF_ECORRUPT && strstr(msg, name) && strstr(msg, offset);
    CHECK(ok, "rank %d: agreed %s '%s'", rank, ff_strerror(agreed), msg);
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0)
        printf("refuse token >= vocab 257 (%s of sequence %d, rank %d's only) FF_ECORRUPT "
               "agreed on %d ranks: %s\n    %s\n",
               at == T ? "the last target" : "a token", bad_seq, bad_rank, nranks,
               all ? "PASS" : "FAIL", msg);
    ff_data_close(d);
}

/* ff_tokenize_files refuses a validation fraction outside [0, 1) itself
 * (the CLI checks its option too): FF_EINVAL naming the range, nothing
 * written; 0.5 of the same 10 documents, the control, writes 5 and 5
 * (rank 0 only, no MPI). */
static void test_tokenize_fraction(void)
{
    char text[512], prefix[512], shard[600], err[512];
    path_of(text, sizeof text, "ten_docs.txt");
    path_of(prefix, sizeof prefix, "fraction");
    FILE *f = fopen(text, "w");
    for (int i = 0; f && i < 10; i++)
        fprintf(f, "document %d\n%%\n", i);
    CHECK(f && fclose(f) == 0, "cannot write %s", text);
    const char *inputs[1] = {text};
    const double bad[] = {-0.1, 1, 1.5, NAN, INFINITY};
    int refused = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        int rc = ff_tokenize_files(inputs, 1, "%", bad[i], prefix, NULL, err, sizeof err);
        snprintf(shard, sizeof shard, "%s_train.bin", prefix);
        int written = access(shard, F_OK) == 0;
        remove(shard);
        snprintf(shard, sizeof shard, "%s_val.bin", prefix);
        written |= access(shard, F_OK) == 0;
        remove(shard);
        int ok = rc == FF_EINVAL && strstr(err, "[0, 1)") && !written;
        refused += ok;
        CHECK(ok, "validation fraction %g: code %d, %s written, message '%s'", bad[i], rc,
              written ? "a shard" : "nothing", err);
    }
    ff_tokenize_report rep;
    int rc = ff_tokenize_files(inputs, 1, "%", 0.5, prefix, &rep, err, sizeof err);
    CHECK(rc == FF_OK && rep.train.docs == 5 && rep.val.docs == 5,
          "validation fraction 0.5 of 10 documents: code %d, %lld + %lld documents: %s", rc,
          (long long)rep.train.docs, (long long)rep.val.docs, err);
    remove(rep.train.path), remove(rep.val.path), remove(text);
    printf("tokenize: validation fractions -0.1, 1, 1.5, NaN, inf refused (FF_EINVAL, nothing "
           "written): %d of 5; 0.5 of 10 documents gives %lld + %lld: %s\n",
           refused, (long long)rep.train.docs, (long long)rep.val.docs,
           refused == 5 && rc == FF_OK ? "PASS" : "FAIL");
}

static void remove_dir(void)
{
    DIR *dp = opendir(dir);
    struct dirent *e;
    char path[600];
    while (dp && (e = readdir(dp)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            remove(path);
        }
    if (dp)
        closedir(dp);
    CHECK(rmdir(dir) == 0, "cannot remove %s (a file left behind?)", dir);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    ff_ctx *world, *self;
    if (ff_ctx_create(&world, MPI_COMM_WORLD, NULL) != FF_OK ||
        ff_ctx_create(&self, MPI_COMM_SELF, NULL) != FF_OK) {
        fprintf(stderr, "cannot create the contexts\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) {
        snprintf(dir, sizeof dir, "/tmp/ff_test_data_XXXXXX");
        if (!mkdtemp(dir))
            dir[0] = '\0';
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (!dir[0]) {
        if (rank == 0)
            fprintf(stderr, "cannot create a folder under /tmp\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) {
        printf("data: %d ranks, folder %s; shards good_0..4 of", nranks, dir);
        for (int i = 0; i < NSHARDS; i++) {
            char name[32];
            snprintf(name, sizeof name, "good_%d.bin", i);
            write_shard(name, i, shard_sizes[i]);
            printf(" %lld", (long long)shard_sizes[i]);
        }
        printf(" tokens, token (shard*4096 + offset) %% 65521\n");
        fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    char pattern[512];
    path_of(pattern, sizeof pattern, "good_*.bin");

    /* what the reader reports */
    ff_data *d;
    int rc = ff_data_open(world, pattern, 33, &d);
    CHECK(rc == FF_OK, "open: %s", ff_ctx_error(world));
    if (rc == FF_OK) {
        int64_t total = 0;
        for (int i = 0; i < NSHARDS; i++)
            total += shard_sizes[i];
        CHECK(ff_data_num_shards(d) == NSHARDS, "%d shards", ff_data_num_shards(d));
        CHECK(ff_data_total_tokens(d) == total, "%lld tokens", (long long)ff_data_total_tokens(d));
        CHECK(strstr(ff_data_shard_name(d, 2), "good_2.bin") && !ff_data_shard_name(d, NSHARDS),
              "shard names");
        ff_data_pos p = ff_data_tell(d);
        CHECK(p.shard == 0 && p.offset == 0 && p.epoch == 0, "start position");
        ff_data_close(d);
    }

    /* 1. the shapes are spread over the ranks, each rank tests its own */
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    for (int i = rank; i < nshapes; i += nranks)
        test_splits(self, pattern, &shapes[i]);
    MPI_Barrier(MPI_COMM_WORLD);
    test_world(world, pattern, 2, 16);
    test_world(world, pattern, 1, 60);
    /* 2. */
    test_seek(self, pattern);
    /* 3. */
    test_refusals(world);
    test_vocab(world, "vocab_mid.bin", nranks / 2 * 2, 3);
    test_vocab(world, "vocab_end.bin", 2 * nranks - 1, 10); /* only the last rank reads it */

    if (rank == 0)
        test_tokenize_fraction();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        remove_dir();
    ff_ctx_destroy(self);
    ff_ctx_destroy(world);
    int code = test_finish("data");
    MPI_Finalize();
    return code;
}
