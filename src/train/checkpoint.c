/* Checkpoints of a training run: the canonical model file, the training
 * state (AdamW moments in canonical layout), and the DONE marker that makes
 * the pair complete (include/fourfold/train.h, docs/train.md). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fourfold/model.h"
#include "fourfold/prune.h"
#include "fourfold/train.h"
#include "fourfold/unet.h"
#include "nn/gpt_internal.h"
#include "train/ckpt.h"
#include "util/crc32.h"
#include "util/file.h"

enum { HEADER_INTS = 256, SLOT_CRC = 255 };

/* State header slots (int32; 64-bit values take two, low word first). */
enum {
    S_MAGIC = 0,
    S_VERSION = 1,
    S_SHAPE = 2, /* 2..7: maxT, V, L, NH, C, Vp as in the model header */
    S_STEP = 8,
    S_SEED = 10,
    S_SHARD = 12,
    S_OFFSET = 14,
    S_EPOCH = 16,
    S_BATCH = 18,
    S_MICRO = 19,
    S_SEQ = 20,
    S_MODEL_CRC = 21,
    S_COUNT = 22, /* floats per moment array */
    S_LR = 24,    /* 24..32: lr, min_lr_frac, warmup, steps, beta1, beta2, eps, wd, clip */
    S_MOE = 34,   /* 34..35: experts, expert_every as in an MoE model's header; 0 dense */
};

void ff_ckpt_put_adamw(int32_t *h, int slot, const ff_adamw *a)
{
    ff_slot_putf(h, slot + 0, a->lr);
    ff_slot_putf(h, slot + 1, a->min_lr_frac);
    h[slot + 2] = a->warmup;
    h[slot + 3] = a->steps;
    ff_slot_putf(h, slot + 4, a->beta1);
    ff_slot_putf(h, slot + 5, a->beta2);
    ff_slot_putf(h, slot + 6, a->eps);
    ff_slot_putf(h, slot + 7, a->weight_decay);
    ff_slot_putf(h, slot + 8, a->clip);
}

void ff_ckpt_get_adamw(const int32_t *h, int slot, ff_adamw *a)
{
    a->lr = ff_slot_getf(h, slot + 0);
    a->min_lr_frac = ff_slot_getf(h, slot + 1);
    a->warmup = h[slot + 2];
    a->steps = h[slot + 3];
    a->beta1 = ff_slot_getf(h, slot + 4);
    a->beta2 = ff_slot_getf(h, slot + 5);
    a->eps = ff_slot_getf(h, slot + 6);
    a->weight_decay = ff_slot_getf(h, slot + 7);
    a->clip = ff_slot_getf(h, slot + 8);
}

void ff_ckpt_path(char *buf, size_t len, const char *dir, const char *kind, int64_t step)
{
    if (!strcmp(kind, "done"))
        snprintf(buf, len, "%s/DONE_%08lld", dir, (long long)step);
    else if (!strcmp(kind, "mask")) /* the model file's mask (fourfold/prune.h) */
        snprintf(buf, len, "%s/model_%08lld.bin.mask", dir, (long long)step);
    else
        snprintf(buf, len, "%s/%s_%08lld.bin", dir, kind, (long long)step);
}

/* Makes a rename durable: fsync of the folder that holds the entry. */
static int sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* For the test of a run killed mid-save (tests/train_check.sh): with
 * FF_FAULT_KILL_IN_SAVE=N in the environment, the process kills itself
 * (SIGKILL, as the machine's OOM killer or a scheduler would) halfway
 * through writing its N-th state file. Only in test builds (FF_TEST_HOOKS). */
static void fault_point(void)
{
#ifdef FF_TEST_HOOKS
    static int saves;
    const char *e = getenv("FF_FAULT_KILL_IN_SAVE");
    if (e && atoi(e) == ++saves)
        raise(SIGKILL);
#endif
}

static void state_header(const ff_gpt *g, const ff_train_state *st, int32_t h[HEADER_INTS])
{
    int32_t model[HEADER_INTS];
    ff_gpt_header(g, model);
    memset(h, 0, HEADER_INTS * sizeof(int32_t));
    h[S_MAGIC] = FF_STATE_MAGIC;
    h[S_VERSION] = FF_STATE_VERSION;
    memcpy(&h[S_SHAPE], &model[2], 6 * sizeof(int32_t));
    if (model[0] == FF_GPT_MAGIC_MOE)
        memcpy(&h[S_MOE], &model[8], 2 * sizeof(int32_t));
    ff_slot_put64(h, S_STEP, (uint64_t)st->step);
    ff_slot_put64(h, S_SEED, st->seed);
    ff_slot_put64(h, S_SHARD, (uint64_t)st->data.shard);
    ff_slot_put64(h, S_OFFSET, (uint64_t)st->data.offset);
    ff_slot_put64(h, S_EPOCH, (uint64_t)st->data.epoch);
    h[S_BATCH] = st->batch;
    h[S_MICRO] = st->micro_batch;
    h[S_SEQ] = st->seq;
    memcpy(&h[S_MODEL_CRC], &st->model_crc, sizeof(uint32_t));
    ff_slot_put64(h, S_COUNT, ff_gpt_canonical_size(g));
    ff_ckpt_put_adamw(h, S_LR, &st->hyper);
}

static void state_from_header(const int32_t h[HEADER_INTS], ff_train_state *st)
{
    st->step = (int64_t)ff_slot_get64(h, S_STEP);
    st->seed = ff_slot_get64(h, S_SEED);
    st->data.shard = (int64_t)ff_slot_get64(h, S_SHARD);
    st->data.offset = (int64_t)ff_slot_get64(h, S_OFFSET);
    st->data.epoch = (int64_t)ff_slot_get64(h, S_EPOCH);
    st->batch = h[S_BATCH];
    st->micro_batch = h[S_MICRO];
    st->seq = h[S_SEQ];
    memcpy(&st->model_crc, &h[S_MODEL_CRC], sizeof(uint32_t));
    ff_ckpt_get_adamw(h, S_LR, &st->hyper);
}

/* The CRC a fourfold model file carries in its header (rank 0). */
static int model_crc(ff_ctx *ctx, const char *path, uint32_t *crc)
{
    int32_t h[HEADER_INTS];
    FILE *f = ff_fopen_regular(path);
    int ok = f && fread(h, sizeof h, 1, f) == 1;
    if (f)
        fclose(f);
    if (!ok)
        return ff_set_error(ctx, FF_EIO, "cannot read the header of '%s'", path);
    if (h[FF_GPT_SLOT_CRC_TAG] != FF_GPT_CRC_TAG)
        return ff_set_error(ctx, FF_ECORRUPT, "'%s' carries no fourfold checksum", path);
    memcpy(crc, &h[FF_GPT_SLOT_CRC], sizeof *crc);
    return FF_OK;
}

/* Writes the state file: the header, then m and v gathered to canonical
 * layout one after the other (one canonical buffer on rank 0). Rank 0's
 * I/O errors are kept until both gathers are done, so every rank issues
 * the same collectives. */
static int write_state(ff_gpt *g, const char *path, const ff_train_state *st)
{
    ff_ctx *ctx = g->ctx;
    int root = ff_ctx_rank(ctx) == 0;
    size_t n = ff_gpt_canonical_size(g);
    char tmp[FF_TMP_PATH_MAX];
    float *canon = NULL;
    FILE *f = NULL;
    int io = FF_OK;
    if (root) {
        if (!(canon = malloc(n * sizeof(float))))
            io = ff_set_error(ctx, FF_ENOMEM, "out of memory for a checkpoint");
        else if (!(f = ff_atomic_open(path, tmp)))
            io = ff_set_error(ctx, FF_EIO, "cannot create the training state '%s': %s", path,
                              strerror(errno));
    }
    int rc = ff_ctx_agree(ctx, io);
    int32_t h[HEADER_INTS];
    state_header(g, st, h);
    uint32_t crc = 0;
    if (rc == FF_OK && root) {
        crc = ff_crc32(0, h, sizeof h - sizeof(int32_t)); /* all but the CRC slot */
        if (fwrite(h, sizeof h, 1, f) != 1)
            io = FF_EIO;
    }
    for (int k = 0; k < 2 && rc == FF_OK; k++) {
        rc = ff_gpt_gather(g, k == 0 ? FF_GPT_ADAM_M : FF_GPT_ADAM_V, canon, 0);
        if (rc == FF_OK && root && io == FF_OK) {
            crc = ff_crc32(crc, canon, n * sizeof(float));
            if (fwrite(canon, sizeof(float), n, f) != n)
                io = FF_EIO;
            else if (k == 0 && fflush(f) == 0)
                fault_point();
        }
    }
    if (rc == FF_OK && root && io == FF_OK) {
        memcpy(&h[SLOT_CRC], &crc, sizeof crc);
        if (fseek(f, 0, SEEK_SET) != 0 || fwrite(h, sizeof h, 1, f) != 1)
            io = FF_EIO;
    }
    if (f && (rc != FF_OK || io != FF_OK))
        ff_atomic_abort(f, tmp);
    else if (f && ff_atomic_commit(f, tmp, path) != 0)
        io = FF_EIO;
    if (rc == FF_OK && io == FF_EIO) /* (a failed creation made rc fail) */
        io = ff_set_error(ctx, FF_EIO, "cannot write the training state '%s': %s", path,
                          strerror(errno));
    free(canon);
    return rc ? rc : ff_ctx_agree(ctx, io);
}

static int write_done(const char *path, int64_t step)
{
    char text[32];
    int len = snprintf(text, sizeof text, "%lld\n", (long long)step);
    return ff_write_file_atomic(path, text, (size_t)len);
}

/* Steps with a DONE marker in dir, ascending (rank-local; *n = -1 if the
 * folder cannot be read). */
static int64_t *done_steps(const char *dir, int *n)
{
    *n = -1;
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    int64_t *steps = NULL;
    int count = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        char tail;
        if (sscanf(e->d_name, "DONE_%lld%c", &s, &tail) != 1 || s < 0)
            continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *grown = realloc(steps, (size_t)cap * sizeof *steps);
            if (!grown) {
                free(steps);
                closedir(d);
                return NULL;
            }
            steps = grown;
        }
        steps[count++] = s;
    }
    closedir(d);
    for (int i = 1; i < count; i++) /* few entries: insertion sort */
        for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    *n = count;
    return steps;
}

/* Removes the checkpoints of steps <= upto but the newest `keep` of them:
 * the DONE marker first, so a checkpoint half removed never looks complete.
 * Steps above `upto` (none, when the caller checked the folder) are left. */
static void prune(const char *dir, int keep, int64_t upto)
{
    int n;
    int64_t *steps = done_steps(dir, &n);
    char path[4096];
    int below = 0;
    while (below < n && steps[below] <= upto)
        below++;
    for (int i = 0; i < below - keep; i++) {
        ff_ckpt_path(path, sizeof path, dir, "done", steps[i]);
        remove(path);
        ff_ckpt_path(path, sizeof path, dir, "model", steps[i]);
        remove(path);
        ff_ckpt_path(path, sizeof path, dir, "state", steps[i]);
        remove(path);
        ff_ckpt_path(path, sizeof path, dir, "mask", steps[i]);
        remove(path);
    }
    free(steps);
}

int ff_ckpt_clear(ff_ctx *ctx, const char *dir)
{
    int rc = FF_OK;
    if (ff_ctx_rank(ctx) == 0) {
        prune(dir, 0, INT64_MAX);
        int n;
        free(done_steps(dir, &n));
        if (n != 0 || sync_dir(dir) != 0)
            rc = ff_set_error(ctx, FF_EIO, "cannot remove the checkpoints in '%s'", dir);
    }
    return ff_ctx_agree(ctx, rc);
}

/* A checkpoint of this step already complete: its DONE marker is withdrawn
 * before its files are replaced, so a kill meanwhile cannot leave a marker
 * over a mismatched pair. */
static int ckpt_begin(ff_ctx *ctx, const char *dir, int64_t step)
{
    char done[4096];
    ff_ckpt_path(done, sizeof done, dir, "done", step);
    int rc = FF_OK;
    if (ff_ctx_rank(ctx) == 0 && access(done, F_OK) == 0 &&
        (remove(done) != 0 || sync_dir(dir) != 0))
        rc = ff_set_error(ctx, FF_EIO, "cannot replace the checkpoint '%s'", done);
    return ff_ctx_agree(ctx, rc);
}

/* The files written: the DONE marker completes the set, then the older
 * checkpoints go. */
static int ckpt_finish(ff_ctx *ctx, const char *dir, int64_t step, int keep)
{
    char done[4096];
    ff_ckpt_path(done, sizeof done, dir, "done", step);
    int io = FF_OK;
    if (ff_ctx_rank(ctx) == 0) {
        if (sync_dir(dir) != 0 || write_done(done, step) != 0 || sync_dir(dir) != 0)
            io = ff_set_error(ctx, FF_EIO, "cannot complete the checkpoint '%s'", done);
        else if (keep > 0)
            prune(dir, keep, step);
    }
    return ff_ctx_agree(ctx, io);
}

int ff_ckpt_gpt_files(ff_gpt *g, const char *dir, ff_train_state *st)
{
    ff_ctx *ctx = g->ctx;
    int root = ff_ctx_rank(ctx) == 0;
    char model[4096], state[4096];
    ff_ckpt_path(model, sizeof model, dir, "model", st->step);
    ff_ckpt_path(state, sizeof state, dir, "state", st->step);
    int rc = ff_gpt_save(g, FF_GPT_PARAMS, model);
    if (rc)
        return rc;
    /* the state names the model file it belongs with */
    rc = ff_ctx_agree(ctx, root ? model_crc(ctx, model, &st->model_crc) : FF_OK);
    if (rc == FF_OK)
        rc = MPI_Bcast(&st->model_crc, 1, MPI_UINT32_T, 0, ff_ctx_comm(ctx)) == MPI_SUCCESS
                 ? FF_OK
                 : ff_ctx_agree(ctx, ff_set_error(ctx, FF_EMPI, "MPI_Bcast failed"));
    if (rc == FF_OK)
        rc = write_state(g, state, st);
    if (rc == FF_OK) { /* a masked run's mask, before the marker completes the set */
        char mask[4096];
        ff_ckpt_path(mask, sizeof mask, dir, "mask", st->step);
        rc = ff_gpt_save_mask(g, mask);
    }
    return rc;
}

int ff_ckpt_save(ff_gpt *g, const char *dir, ff_train_state *st, int keep)
{
    int rc = ckpt_begin(g->ctx, dir, st->step);
    if (rc == FF_OK)
        rc = ff_ckpt_gpt_files(g, dir, st);
    return rc ? rc : ckpt_finish(g->ctx, dir, st->step, keep);
}

int ff_ckpt_commit(ff_ctx *ctx, const ff_net *net, const char *dir, ff_train_state *st, int keep)
{
    int rc = ckpt_begin(ctx, dir, st->step);
    if (rc == FF_OK)
        rc = net->ops->save(net->impl, dir, st);
    return rc ? rc : ckpt_finish(ctx, dir, st->step, keep);
}

int ff_ckpt_latest(ff_ctx *ctx, const char *dir, int64_t *step)
{
    return ff_ckpt_older(ctx, dir, INT64_MAX, step);
}

int ff_ckpt_older(ff_ctx *ctx, const char *dir, int64_t before, int64_t *step)
{
    int64_t latest = -1;
    int rc = FF_OK;
    if (ff_ctx_rank(ctx) == 0) {
        int n;
        int64_t *steps = done_steps(dir, &n);
        if (n < 0)
            rc = ff_set_error(ctx, FF_EIO, "cannot read the checkpoint folder '%s'", dir);
        for (int i = n - 1; i >= 0 && latest < 0; i--)
            if (steps[i] < before)
                latest = steps[i];
        free(steps);
    }
    if ((rc = ff_ctx_agree(ctx, rc)))
        return rc;
    if (MPI_Bcast(&latest, 1, MPI_INT64_T, 0, ff_ctx_comm(ctx)) != MPI_SUCCESS)
        return ff_ctx_agree(ctx, ff_set_error(ctx, FF_EMPI, "MPI_Bcast failed"));
    *step = latest;
    return FF_OK;
}

/* Rank 0: reads and checks the state file's header and CRC (a full pass
 * over the file before anything is scattered), leaving f after the header. */
static int open_state(ff_gpt *g, const char *path, int32_t h[HEADER_INTS], FILE **out)
{
    ff_ctx *ctx = g->ctx;
    *out = NULL;
    FILE *f = ff_fopen_regular(path);
    if (!f)
        return ff_set_error(ctx, FF_EIO, "cannot open the training state '%s': %s", path,
                            ff_open_error(errno));
    int rc = FF_OK;
    int32_t model[HEADER_INTS];
    ff_gpt_header(g, model);
    size_t n = ff_gpt_canonical_size(g);
    if (fread(h, sizeof(int32_t), HEADER_INTS, f) != HEADER_INTS)
        rc = ff_set_error(ctx, FF_ECORRUPT, "training state '%s' is shorter than its header", path);
    else if (h[S_MAGIC] != FF_STATE_MAGIC || h[S_VERSION] != FF_STATE_VERSION)
        rc = ff_set_error(ctx, FF_ECORRUPT,
                          "'%s' is not a fourfold training state (magic %d version %d)", path,
                          h[S_MAGIC], h[S_VERSION]);
    else if (memcmp(&h[S_SHAPE], &model[2], 6 * sizeof(int32_t)) != 0)
        rc = ff_set_error(ctx, FF_EINVAL,
                          "training state '%s' is of a model with maxT=%d V=%d L=%d NH=%d C=%d, "
                          "this one has maxT=%d V=%d L=%d NH=%d C=%d",
                          path, h[2], h[3], h[4], h[5], h[6], model[2], model[3], model[4],
                          model[5], model[6]);
    else if (h[S_MOE] != (model[0] == FF_GPT_MAGIC_MOE ? model[8] : 0) ||
             h[S_MOE + 1] != (model[0] == FF_GPT_MAGIC_MOE ? model[9] : 0))
        rc = ff_set_error(ctx, FF_EINVAL,
                          "training state '%s' is of a model with %d experts in one block of "
                          "every %d, this one has %d (one block of every %d)",
                          path, h[S_MOE], h[S_MOE + 1], model[0] == FF_GPT_MAGIC_MOE ? model[8] : 0,
                          model[0] == FF_GPT_MAGIC_MOE ? model[9] : 0);
    else if (ff_slot_get64(h, S_COUNT) != n)
        rc = ff_set_error(ctx, FF_ECORRUPT,
                          "training state '%s' holds %llu floats per moment, "
                          "expected %zu",
                          path, (unsigned long long)ff_slot_get64(h, S_COUNT), n);
    if (rc == FF_OK) {
        uint32_t want, crc = ff_crc32(0, h, (HEADER_INTS - 1) * sizeof(int32_t));
        memcpy(&want, &h[SLOT_CRC], sizeof want);
        enum { CHUNK = 1 << 20 };
        float *buf = malloc(CHUNK * sizeof(float));
        size_t left = 2 * n, got = 0;
        while (buf && left > 0) {
            size_t k = left < CHUNK ? left : CHUNK;
            size_t r = fread(buf, sizeof(float), k, f);
            crc = ff_crc32(crc, buf, r * sizeof(float));
            got += r;
            left -= r;
            if (r < k)
                break;
        }
        char extra;
        if (!buf)
            rc = ff_set_error(ctx, FF_ENOMEM, "out of memory reading '%s'", path);
        else if (left > 0)
            rc = ff_set_error(ctx, FF_ECORRUPT,
                              "training state '%s' is truncated (%zu of %zu floats)", path, got,
                              2 * n);
        else if (fread(&extra, 1, 1, f) == 1)
            rc = ff_set_error(ctx, FF_ECORRUPT,
                              "training state '%s' is longer than its header says", path);
        else if (crc != want)
            rc = ff_set_error(
                ctx, FF_ECORRUPT,
                "training state '%s' fails its checksum (CRC-32 %08x, header says %08x)", path, crc,
                want);
        free(buf);
    }
    if (rc == FF_OK && fseek(f, HEADER_INTS * sizeof(int32_t), SEEK_SET) != 0)
        rc = ff_set_error(ctx, FF_EIO, "cannot read '%s'", path);
    if (rc) {
        fclose(f);
        return rc;
    }
    *out = f;
    return FF_OK;
}

int ff_ckpt_load(ff_gpt *g, const char *dir, int64_t step, ff_train_state *st)
{
    ff_ctx *ctx = g->ctx;
    int root = ff_ctx_rank(ctx) == 0;
    char model[4096], state[4096];
    ff_ckpt_path(model, sizeof model, dir, "model", step);
    ff_ckpt_path(state, sizeof state, dir, "state", step);
    /* the state (its CRC) and its pairing with the model first, before any
     * of the checkpoint reaches the model: a resume that passes over a bad
     * checkpoint must not keep a part of it (its mask, say) */
    int32_t h[HEADER_INTS];
    FILE *f = NULL;
    uint32_t mcrc = 0;
    size_t n = ff_gpt_canonical_size(g);
    float *canon = NULL;
    int io = FF_OK;
    if (root) {
        io = ff_ckpt_check_kind(ctx, model, FF_NET_GPT);
        if (io == FF_OK)
            io = ff_gpt_check_header(g, model);
        if (io == FF_OK)
            io = open_state(g, state, h, &f);
        if (io == FF_OK && (io = model_crc(ctx, model, &mcrc)) == FF_OK) {
            uint32_t paired;
            memcpy(&paired, &h[S_MODEL_CRC], sizeof paired);
            if (paired != mcrc)
                io = ff_set_error(ctx, FF_ECORRUPT,
                                  "'%s' does not belong with '%s' (model CRC %08x, the state "
                                  "expects %08x)",
                                  model, state, mcrc, paired);
        }
        if (io == FF_OK && !(canon = malloc(n * sizeof(float))))
            io = ff_set_error(ctx, FF_ENOMEM, "out of memory for a checkpoint");
    }
    int rc = ff_ctx_agree(ctx, io);
    if (rc == FF_OK)
        rc = ff_gpt_load(g, model); /* shape and CRC checked there, before the scatter */
    if (rc == FF_OK) {              /* a masked run's mask comes back with it */
        char mask[4096];
        ff_ckpt_path(mask, sizeof mask, dir, "mask", step);
        rc = ff_gpt_load_mask(g, mask, 1);
    }
    if (rc) {
        if (f)
            fclose(f);
        free(canon);
        return rc;
    }
    for (int k = 0; k < 2 && rc == FF_OK; k++) {
        io = root && fread(canon, sizeof(float), n, f) != n
                 ? ff_set_error(ctx, FF_EIO, "cannot read '%s'", state)
                 : FF_OK;
        if ((rc = ff_ctx_agree(ctx, io)) == FF_OK)
            rc = ff_gpt_scatter(g, k == 0 ? FF_GPT_ADAM_M : FF_GPT_ADAM_V, canon, 0);
    }
    if (f)
        fclose(f);
    free(canon);
    if (rc)
        return rc;
    if (MPI_Bcast(h, HEADER_INTS, MPI_INT32_T, 0, ff_ctx_comm(ctx)) != MPI_SUCCESS)
        return ff_ctx_agree(ctx, ff_set_error(ctx, FF_EMPI, "MPI_Bcast failed"));
    state_from_header(h, st);
    return FF_OK;
}

int ff_ckpt_check_kind(ff_ctx *ctx, const char *path, int kind)
{
    int32_t magic = 0;
    FILE *f = ff_fopen_regular(path);
    int got = f && fread(&magic, sizeof magic, 1, f) == 1;
    if (f)
        fclose(f);
    if (!got) /* the model's own reader names what is wrong */
        return FF_OK;
    if (kind == FF_NET_GPT && magic == FF_UNET_CKPT_MAGIC)
        return ff_set_error(ctx, FF_EINVAL,
                            "'%s' is a U-Net checkpoint; this run trains a GPT (--model "
                            "unet-... trains the U-Net)",
                            path);
    if (kind == FF_NET_UNET && magic != FF_UNET_CKPT_MAGIC &&
        (magic == FF_GPT_MAGIC_MOE || magic == 20240326))
        return ff_set_error(ctx, FF_EINVAL,
                            "'%s' is a GPT checkpoint (an llm.c model file), not a U-Net's", path);
    return FF_OK;
}
