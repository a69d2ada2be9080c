/* The U-Net's binding of the model interface (include/fourfold/model.h):
 * ff_unet with its images as the trainer's model. docs/unet.md, "The model
 * interface" and "Checkpoints".
 *
 * Data: the training batch of step s is the images at positions p = s *
 * batch + g of the shuffled training file, g = 0 .. batch-1 the global
 * index in the batch (rank blocks as ff_unet_images): position p is image
 * perm_e[p mod N] of epoch e = p / N, perm_e a permutation drawn from
 * (seed, epoch) (ff_rng_permutation), so every image once an epoch, the
 * same images on every grid, and the data position is the step itself: a
 * resumed run sees the batches of the uninterrupted one on any grid.
 * Validation batch i of n: images i * (N_val / n) + g of the test file,
 * with the DDPM draws of (seed ^ VAL_KEY, i): the same noise every time.
 *
 * The checkpoint of step s is one file, model_%08d.bin (then the DONE
 * marker): a header of HEADER_INTS int32 (magic, version, the config, the
 * training state, the tensor count and canonical size, a CRC-32 of the
 * header and data in its last slot), then the canonical parameters, AdamW's
 * m and v, each tensor after tensor in ff_unet_tensor order. Canonical, so
 * it resumes on any grid. Rank 0 writes and reads it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../internal.h"
#include "../util/crc32.h"
#include "../util/file.h"
#include "ckpt.h"
#include "fourfold/image.h"
#include "fourfold/plan.h"
#include "fourfold/rng.h"
#include "fourfold/unet.h"

enum { HEADER_INTS = 256, SLOT_CRC = 255 };
enum {
    H_MAGIC = 0,
    H_VERSION = 1,
    H_CONFIG = 2, /* 2..: image_size, img_channels, pad, base, levels, mult[6], nres,
                     group_channels, temb_mult, attn_head_channels, timesteps, schedule,
                     attn_levels (slot 19) */
    H_BETAS = 24, /* 24..27: beta_first, beta_last (doubles) */
    H_STEP = 32,
    H_SEED = 34,
    H_BATCH = 36,
    H_MICRO = 37,
    H_SEQ = 38,
    H_HYPER = 40, /* 40..48: lr, min_lr_frac, warmup, steps, beta1, beta2, eps, wd, clip */
    H_TENSORS = 50,
    H_COUNT = 52, /* canonical floats of the parameters (int64) */
};
static const uint64_t VAL_KEY = 0x76616c6964617465ull; /* "validate" */
enum { STREAM_SHUFFLE = 0xDD10 }; /* the epochs' permutations (unet_ddpm.c has 0xDD01..03) */

typedef struct {
    ff_ctx *ctx;
    ff_grid *grid;
    ff_unet *u;
    ff_unet_config cfg;
    ff_idx train, val;
    int has_val;
    int64_t batch, first, count, per;
    float *x0, *padded; /* a batch; one image padded before pooling (fill) */
    uint64_t seed;
    int64_t *order, epoch; /* the training images of epoch `epoch` in their order */
    int sample_steps;      /* the reverse steps of samples */
    /* their update (the trainer's: DDPM) */
    ff_unet_sampler sampler;
    char train_path[4200];
} unet_net;

static void config_slots(const ff_unet_config *c, int32_t *h)
{
    int32_t *p = &h[H_CONFIG];
    *p++ = (int32_t)c->image_size;
    *p++ = c->img_channels;
    *p++ = c->img_channels_pad;
    *p++ = c->base;
    *p++ = c->levels;
    for (int i = 0; i < FF_UNET_MAX_LEVELS; i++)
        *p++ = i < c->levels ? c->mult[i] : 0;
    *p++ = c->nres;
    *p++ = c->group_channels;
    *p++ = c->temb_mult;
    *p++ = c->attn_head_channels;
    *p++ = c->timesteps;
    *p++ = (int32_t)c->schedule;
    *p++ = c->attn_levels; /* (0 in the files of before it: the same model) */
    memcpy(&h[H_BETAS], &c->beta_first, sizeof(double));
    memcpy(&h[H_BETAS + 2], &c->beta_last, sizeof(double));
}

static size_t canonical_size(const ff_unet *u)
{
    size_t n = 0;
    for (int i = 0; i < ff_unet_tensors(u); i++)
        n += (size_t)ff_unet_tensor(u, i).numel;
    return n;
}

/* For tests/unet_train.sh (test builds only, FF_TEST_HOOKS): with
 * FF_TEST_UNET_IMAGES=DIR each rank appends "position image" of every
 * training image it loads to DIR/images.RANK. */
static void trace_image(unet_net *m, int64_t p, int64_t img)
{
#ifdef FF_TEST_HOOKS
    const char *dir = getenv("FF_TEST_UNET_IMAGES");
    char path[4200];
    FILE *f;
    if (dir && snprintf(path, sizeof path, "%s/images.%d", dir, ff_ctx_rank(m->ctx)) > 0 &&
        (f = fopen(path, "a"))) {
        fprintf(f, "%lld %lld\n", (long long)p, (long long)img);
        fclose(f);
    }
#else
    (void)m, (void)p, (void)img;
#endif
}

/* Training position p: image perm_e[p mod N] of epoch e = p / N. */
static int64_t train_image(unet_net *m, int64_t p)
{
    const int64_t n = m->train.dims[0], e = p / n;
    if (e != m->epoch) {
        ff_rng_permutation(m->seed, STREAM_SHUFFLE, (uint64_t)e, n, m->order);
        m->epoch = e;
    }
    trace_image(m, p, m->order[p % n]);
    return m->order[p % n];
}

/* The images idx[(start + first + b) mod N], b < count (of the training
 * file: at positions start + first + b, train_image), as floats into x0:
 * each padded (black, centred) to f S pixels, f = ceil(max(h, w) / S) for
 * the model's size S, then averaged over f x f blocks (Fashion-MNIST's 28 x
 * 28: padded to 32, then as they are for S = 32 or pooled 4 x 4 for the
 * tiny preset's 8). */
static int fill(unet_net *m, const ff_idx *x, int64_t start, float *x0)
{
    const int64_t n = x->dims[0], hw = x->dims[1] * x->dims[2], S = m->cfg.image_size;
    const int64_t big = x->dims[1] > x->dims[2] ? x->dims[1] : x->dims[2];
    const int64_t f = (big + S - 1) / S, P = f * S;
    char err[512];
    for (int64_t b = 0; b < m->count; b++) {
        int64_t img =
            x == &m->train ? train_image(m, start + m->first + b) : (start + m->first + b) % n;
        ff_idx one = {.ndims = 3,
                      .dims = {1, x->dims[1], x->dims[2]},
                      .count = hw,
                      .data = x->data + img * hw};
        if (ff_images_from_idx(&one, P, m->padded, err, sizeof err))
            return ff_set_error(m->ctx, FF_EINVAL, "%s", err);
        float *out = x0 + b * m->per;
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = 0; j < S; j++) {
                double sum = 0;
                for (int64_t a = 0; a < f; a++)
                    for (int64_t c = 0; c < f; c++)
                        sum += m->padded[(i * f + a) * P + j * f + c];
                out[i * S + j] = (float)(sum / (double)(f * f));
            }
    }
    return FF_OK;
}

static int unet_step(void *impl, int64_t step, const ff_adamw *h, ff_net_step *info)
{
    unet_net *m = impl;
    int rc = ff_ctx_agree(m->ctx, fill(m, &m->train, step * m->batch, m->x0));
    ff_unet_step_info ui = {0};
    if (rc == FF_OK)
        rc = ff_unet_step(m->u, m->x0, m->seed, (int)step, h, &ui);
    *info = (ff_net_step){.loss = ui.loss, .lr = ui.lr, .grad_norm = ui.grad_norm};
    return rc;
}

static int unet_eval(void *impl, int i, int n, float *loss)
{
    unet_net *m = impl;
    const int64_t nval = m->val.dims[0];
    int rc = ff_ctx_agree(m->ctx, fill(m, &m->val, (int64_t)i * (nval / n), m->x0));
    if (rc == FF_OK)
        rc = ff_unet_ddpm_eval(m->u, m->x0, m->seed ^ VAL_KEY, i, loss);
    return rc;
}

static int unet_has_val(void *impl) { return ((unet_net *)impl)->has_val; }

static void header(const unet_net *m, const ff_train_state *st, int32_t h[HEADER_INTS])
{
    memset(h, 0, HEADER_INTS * sizeof(int32_t));
    h[H_MAGIC] = FF_UNET_CKPT_MAGIC;
    h[H_VERSION] = FF_UNET_CKPT_VERSION;
    config_slots(&m->cfg, h);
    ff_slot_put64(h, H_STEP, (uint64_t)st->step);
    ff_slot_put64(h, H_SEED, st->seed);
    h[H_BATCH] = st->batch;
    h[H_MICRO] = st->micro_batch;
    h[H_SEQ] = st->seq;
    ff_ckpt_put_adamw(h, H_HYPER, &st->hyper);
    h[H_TENSORS] = ff_unet_tensors(m->u);
    ff_slot_put64(h, H_COUNT, canonical_size(m->u));
}

static int unet_save(void *impl, const char *dir, ff_train_state *st)
{
    unet_net *m = impl;
    ff_ctx *ctx = m->ctx;
    const int root = ff_ctx_rank(ctx) == 0;
    char path[4300], tmp[FF_TMP_PATH_MAX];
    ff_ckpt_path(path, sizeof path, dir, "model", st->step);
    const size_t n = canonical_size(m->u);
    int64_t most = 1;
    for (int i = 0; i < ff_unet_tensors(m->u); i++)
        most = ff_unet_tensor(m->u, i).numel > most ? ff_unet_tensor(m->u, i).numel : most;
    float *canon = malloc((size_t)most * sizeof(float));
    FILE *f = NULL;
    int io = canon ? FF_OK : ff_set_error(ctx, FF_ENOMEM, "out of memory for a checkpoint");
    if (io == FF_OK && root && !(f = ff_atomic_open(path, tmp)))
        io = ff_set_error(ctx, FF_EIO, "cannot create the checkpoint '%s': %s", path,
                          strerror(errno));
    int rc = ff_ctx_agree(ctx, io);
    if (rc == FF_OK)
        rc = ff_unet_alloc_moments(m->u); /* zero before the first step */
    int32_t h[HEADER_INTS];
    header(m, st, h);
    uint32_t crc = ff_crc32(0, h, sizeof h - sizeof(int32_t));
    io = FF_OK;
    if (rc == FF_OK && root && fwrite(h, sizeof h, 1, f) != 1)
        io = FF_EIO;
    static const int which[3] = {0, 2, 3}; /* parameters, m, v */
    size_t written = 0;
    for (int k = 0; k < 3 && rc == FF_OK; k++)
        for (int i = 0; i < ff_unet_tensors(m->u) && rc == FF_OK; i++) {
            size_t numel = (size_t)ff_unet_tensor(m->u, i).numel;
            rc = ff_unet_gather(m->u, i, which[k], canon);
            rc = ff_ctx_agree(ctx, rc);
            if (rc == FF_OK && root && io == FF_OK) {
                crc = ff_crc32(crc, canon, numel * sizeof(float));
                if (fwrite(canon, sizeof(float), numel, f) != numel)
                    io = FF_EIO;
                written += numel;
            }
        }
    if (rc == FF_OK && root && io == FF_OK && written != 3 * n)
        io = FF_EIO;
    if (rc == FF_OK && root && io == FF_OK) {
        memcpy(&h[SLOT_CRC], &crc, sizeof crc);
        if (fseek(f, 0, SEEK_SET) != 0 || fwrite(h, sizeof h, 1, f) != 1)
            io = FF_EIO;
    }
    if (f && (rc != FF_OK || io != FF_OK))
        ff_atomic_abort(f, tmp);
    else if (f && ff_atomic_commit(f, tmp, path) != 0)
        io = FF_EIO;
    if (rc == FF_OK && io == FF_EIO)
        io = ff_set_error(ctx, FF_EIO, "cannot write the checkpoint '%s': %s", path,
                          strerror(errno));
    free(canon);
    st->model_crc = crc;
    return rc ? rc : ff_ctx_agree(ctx, io);
}

/* Rank 0: the whole file, checked (kind, magic, version, config, size,
 * CRC) before anything reaches the model. */
static int read_checked(unet_net *m, const char *path, int32_t h[HEADER_INTS], float **data)
{
    ff_ctx *ctx = m->ctx;
    *data = NULL;
    int rc = ff_ckpt_check_kind(ctx, path, FF_NET_UNET);
    if (rc)
        return rc;
    FILE *f = ff_fopen_regular(path);
    if (!f)
        return ff_set_error(ctx, FF_EIO, "cannot open the checkpoint '%s': %s", path,
                            ff_open_error(errno));
    const size_t n = canonical_size(m->u);
    int32_t want[HEADER_INTS];
    header(m, &(ff_train_state){0}, want);
    float *buf = NULL;
    char extra;
    if (fread(h, sizeof(int32_t), HEADER_INTS, f) != HEADER_INTS)
        rc = ff_set_error(ctx, FF_ECORRUPT, "checkpoint '%s' is shorter than its header", path);
    else if (h[H_MAGIC] != FF_UNET_CKPT_MAGIC)
        rc = ff_set_error(ctx, FF_EINVAL, "'%s' is not a fourfold U-Net checkpoint (magic %d)",
                          path, h[H_MAGIC]);
    else if (h[H_VERSION] != FF_UNET_CKPT_VERSION)
        rc = ff_set_error(ctx, FF_EINVAL,
                          "'%s' is a U-Net checkpoint of version %d; this fourfold reads %d", path,
                          h[H_VERSION], FF_UNET_CKPT_VERSION);
    else if (memcmp(&h[H_CONFIG], &want[H_CONFIG], (H_STEP - H_CONFIG) * sizeof(int32_t)) ||
             h[H_TENSORS] != want[H_TENSORS])
        rc = ff_set_error(ctx, FF_EINVAL,
                          "checkpoint '%s' is of a U-Net with %dx%d images, C0=%d, %d levels, "
                          "%d blocks; this one has %dx%d, C0=%d, %d levels, %d blocks (or "
                          "another schedule or attention)",
                          path, h[H_CONFIG], h[H_CONFIG], h[H_CONFIG + 3], h[H_CONFIG + 4],
                          h[H_CONFIG + 11], want[H_CONFIG], want[H_CONFIG], want[H_CONFIG + 3],
                          want[H_CONFIG + 4], want[H_CONFIG + 11]);
    else if (ff_slot_get64(h, H_COUNT) != n)
        rc = ff_set_error(ctx, FF_ECORRUPT, "checkpoint '%s' holds %llu parameters, expected %zu",
                          path, (unsigned long long)ff_slot_get64(h, H_COUNT), n);
    else if (!(buf = malloc(3 * n * sizeof(float) + 1)))
        rc = ff_set_error(ctx, FF_ENOMEM, "out of memory reading '%s'", path);
    else if (fread(buf, sizeof(float), 3 * n, f) != 3 * n)
        rc = ff_set_error(ctx, FF_ECORRUPT, "checkpoint '%s' is truncated", path);
    else if (fread(&extra, 1, 1, f) == 1)
        rc = ff_set_error(ctx, FF_ECORRUPT, "checkpoint '%s' is longer than its header says", path);
    if (rc == FF_OK) {
        uint32_t got = ff_crc32(0, h, (HEADER_INTS - 1) * sizeof(int32_t)), said;
        got = ff_crc32(got, buf, 3 * n * sizeof(float));
        memcpy(&said, &h[SLOT_CRC], sizeof said);
        if (got != said)
            rc = ff_set_error(ctx, FF_ECORRUPT,
                              "checkpoint '%s' fails its checksum (CRC-32 %08x, header says %08x)",
                              path, got, said);
    }
    fclose(f);
    if (rc)
        free(buf);
    else
        *data = buf;
    return rc;
}

/* Checkpoint file path into the model (verified on rank 0 first). */
static int load_file(unet_net *m, const char *path, ff_train_state *st)
{
    ff_ctx *ctx = m->ctx;
    int32_t h[HEADER_INTS];
    float *data = NULL;
    int rc = ff_ctx_agree(ctx, ff_ctx_rank(ctx) == 0 ? read_checked(m, path, h, &data) : FF_OK);
    if (rc == FF_OK && MPI_Bcast(h, HEADER_INTS, MPI_INT32_T, 0, ff_ctx_comm(ctx)) != MPI_SUCCESS)
        rc = ff_ctx_agree(ctx, ff_set_error(ctx, FF_EMPI, "MPI_Bcast failed"));
    int64_t most = 1;
    for (int i = 0; i < ff_unet_tensors(m->u); i++)
        most = ff_unet_tensor(m->u, i).numel > most ? ff_unet_tensor(m->u, i).numel : most;
    float *canon = rc == FF_OK ? malloc((size_t)most * sizeof(float)) : NULL;
    if (rc == FF_OK)
        rc = ff_ctx_agree(ctx, canon ? FF_OK : ff_set_error(ctx, FF_ENOMEM, "out of memory"));
    static const int which[3] = {0, 2, 3};
    size_t off = 0;
    for (int k = 0; k < 3 && rc == FF_OK; k++)
        for (int i = 0; i < ff_unet_tensors(m->u) && rc == FF_OK; i++) {
            int64_t numel = ff_unet_tensor(m->u, i).numel;
            if (data)
                memcpy(canon, data + off, (size_t)numel * sizeof(float));
            off += (size_t)numel;
            if (MPI_Bcast(canon, (int)numel, MPI_FLOAT, 0, ff_ctx_comm(ctx)) != MPI_SUCCESS)
                rc = ff_set_error(ctx, FF_EMPI, "MPI_Bcast failed");
            if (rc == FF_OK)
                rc = ff_unet_scatter_to(m->u, i, which[k], canon);
            rc = ff_ctx_agree(ctx, rc);
        }
    free(canon);
    free(data);
    if (rc)
        return rc;
    memset(st, 0, sizeof *st);
    st->step = (int64_t)ff_slot_get64(h, H_STEP);
    st->seed = ff_slot_get64(h, H_SEED);
    st->batch = h[H_BATCH];
    st->micro_batch = h[H_MICRO];
    st->seq = h[H_SEQ];
    memcpy(&st->model_crc, &h[SLOT_CRC], sizeof(uint32_t));
    ff_ckpt_get_adamw(h, H_HYPER, &st->hyper);
    return FF_OK;
}

static int unet_load(void *impl, const char *dir, int64_t step, ff_train_state *st)
{
    char path[4300];
    ff_ckpt_path(path, sizeof path, dir, "model", step);
    return load_file(impl, path, st);
}

static double unet_flops(void *impl)
{
    const unet_net *m = impl;
    return ff_plan_unet_flops(&m->cfg, m->batch); /* the planner's count: one home */
}

static void unet_describe(void *impl, char *json, size_t jl, char *title, size_t tl)
{
    const unet_net *m = impl;
    const ff_unet_config *c = &m->cfg;
    snprintf(json, jl,
             "\"model\":\"unet\",\"image_size\":%lld,\"base\":%d,\"levels\":%d,\"nres\":%d,"
             "\"timesteps\":%d,\"params\":%zu",
             (long long)c->image_size, c->base, c->levels, c->nres, c->timesteps,
             canonical_size(m->u));
    snprintf(title, tl, "U-Net %lldx%lld C0=%d, %lld images per step", (long long)c->image_size,
             (long long)c->image_size, c->base, (long long)m->batch);
}

/* The reverse process for the batch's images, gathered on rank 0 in global
 * order (the ranks of x = y = 0 hold images q = z + Gz d), as a PNG grid. */
static int unet_samples(void *impl, const char *path, uint64_t seed)
{
    unet_net *m = impl;
    ff_ctx *ctx = m->ctx;
    const int size = ff_ctx_size(ctx), root = ff_ctx_rank(ctx) == 0;
    const int64_t per = m->per, cnt = m->count;
    float *mine = malloc((size_t)(cnt * per + 1) * sizeof(float));
    float *all = root ? malloc((size_t)(size * cnt * per + 1) * sizeof(float)) : NULL;
    float *ordered = root ? malloc((size_t)(m->batch * per + 1) * sizeof(float)) : NULL;
    int rc = ff_ctx_agree(ctx, mine && (!root || (all && ordered))
                                   ? FF_OK
                                   : ff_set_error(ctx, FF_ENOMEM, "out of memory for samples"));
    if (rc == FF_OK)
        rc = ff_unet_sample(m->u, seed, m->sample_steps, m->sampler, mine);
    if (rc == FF_OK && MPI_Gather(mine, (int)(cnt * per), MPI_FLOAT, all, (int)(cnt * per),
                                  MPI_FLOAT, 0, ff_ctx_comm(ctx)) != MPI_SUCCESS)
        rc = ff_ctx_agree(ctx, ff_set_error(ctx, FF_EMPI, "MPI_Gather failed"));
    int io = FF_OK;
    if (rc == FF_OK && root) {
        ff_dims shape = ff_grid_shape(m->grid);
        for (int r = 0; r < size; r++) {
            ff_dims c = ff_grid_coords_of(shape, r);
            if (c.x == 0 && c.y == 0)
                memcpy(ordered + (c.z + (int64_t)shape.z * c.d) * cnt * per,
                       all + (int64_t)r * cnt * per, (size_t)(cnt * per) * sizeof(float));
        }
        char err[512];
        int64_t cols = (int64_t)ceil(sqrt((double)m->batch));
        if ((io = ff_png_write_grid(path, ordered, m->batch, m->cfg.image_size, m->cfg.image_size,
                                    m->cfg.img_channels, cols, err, sizeof err)))
            ff_set_error(ctx, io, "%s", err);
    }
    free(mine), free(all), free(ordered);
    return rc ? rc : ff_ctx_agree(ctx, io);
}

static void unet_destroy(void *impl)
{
    unet_net *m = impl;
    if (!m)
        return;
    ff_unet_destroy(m->u);
    ff_idx_free(&m->train);
    ff_idx_free(&m->val);
    free(m->x0);
    free(m->padded);
    free(m->order);
    free(m);
}

static const ff_net_ops unet_ops = {
    .kind = FF_NET_UNET,
    .name = "unet",
    .loss_unit = "mean squared error of the noise",
    .step = unet_step,
    .eval = unet_eval,
    .has_val = unet_has_val,
    .save = unet_save,
    .load = unet_load,
    .flops_per_step = unet_flops,
    .describe = unet_describe,
    .write_samples = unet_samples,
    .destroy = unet_destroy,
};

/* Every rank reads the file (agreed: one message, the same on every rank). */
static int read_images(unet_net *m, const char *path, ff_idx *x)
{
    char err[700];
    int rc = ff_idx_read(path, x, err, sizeof err);
    if (rc == FF_OK && (x->ndims != 3 || m->cfg.img_channels != 1)) {
        snprintf(err, sizeof err,
                 "'%s' does not hold images (an IDX file of %d dimensions, not 3: images, "
                 "rows, columns)",
                 path, x->ndims);
        ff_idx_free(x);
        rc = FF_EINVAL;
    }
    if (rc && rc != FF_EINVAL && rc != FF_EIO)
        rc = FF_EINVAL;
    if (rc == FF_EIO && !strncmp(path, FF_FASHION_MNIST_DIR, strlen(FF_FASHION_MNIST_DIR)))
        ff_set_error(m->ctx, rc,
                     "%s (Fashion-MNIST: Debian's dataset-fashion-mnist, which "
                     "scripts/setup.sh installs; or --data FILE)",
                     err);
    else if (rc)
        ff_set_error(m->ctx, rc, "%s", err);
    return ff_ctx_agree(m->ctx, rc);
}

/* The reverse steps of samples: `asked`, 1 .. T, or 0: FF_UNET_SAMPLE_STEPS
 * (T if less). Agreed (every rank has the same configuration). */
static int sample_steps(ff_ctx *ctx, const ff_unet_config *c, int asked, int *steps)
{
    *steps = asked                                 ? asked
             : FF_UNET_SAMPLE_STEPS < c->timesteps ? FF_UNET_SAMPLE_STEPS
                                                   : c->timesteps;
    if (asked >= 0 && asked <= c->timesteps)
        return FF_OK;
    return ff_ctx_agree(ctx, ff_set_error(ctx, FF_EINVAL,
                                          "%d reverse steps for samples: the U-Net has T = %d "
                                          "timesteps, so 1 .. %d",
                                          asked, c->timesteps, c->timesteps));
}

/* A batch's buffers: x0, one image padded before pooling (fill: the
 * largest of the loaded files'), the epochs' order of the training file.
 * Collective. */
static int batch_buffers(unet_net *m)
{
    const int64_t S = m->cfg.image_size;
    const ff_idx *files[2] = {&m->train, &m->val};
    int64_t side = 1;
    for (int k = 0; k < 2; k++)
        if (files[k]->ndims == 3) {
            int64_t big =
                files[k]->dims[1] > files[k]->dims[2] ? files[k]->dims[1] : files[k]->dims[2];
            side = (big + S - 1) / S * S > side ? (big + S - 1) / S * S : side;
        }
    m->x0 = malloc((size_t)(m->count * m->per + 1) * sizeof(float));
    m->padded = malloc((size_t)(side * side) * sizeof(float));
    m->order = malloc((size_t)(m->train.dims[0] + 1) * sizeof *m->order);
    return ff_ctx_agree(m->ctx, m->x0 && m->padded && m->order
                                    ? FF_OK
                                    : ff_set_error(m->ctx, FF_ENOMEM, "out of memory for a batch"));
}

void ff_net_unet_data(const ff_trainer_config *cfg, const char **train, const char **val)
{
    *train = cfg->data ? cfg->data : FF_FASHION_MNIST_TRAIN;
    *val = cfg->data ? cfg->val_data : FF_FASHION_MNIST_TEST;
}

int ff_net_unet_create(ff_grid *grid, const ff_trainer_config *cfg, ff_net *out)
{
    ff_ctx *ctx = ff_grid_ctx(grid);
    out->ops = NULL, out->impl = NULL;
    unet_net *m = calloc(1, sizeof *m);
    int rc = ff_ctx_agree(ctx, m ? FF_OK : ff_set_error(ctx, FF_ENOMEM, "out of memory"));
    if (rc) {
        free(m);
        return rc;
    }
    m->ctx = ctx;
    m->grid = grid;
    m->cfg = cfg->unet;
    m->batch = cfg->batch;
    m->seed = cfg->seed;
    m->epoch = -1;
    m->per = m->cfg.image_size * m->cfg.image_size * m->cfg.img_channels;
    const char *train, *val;
    ff_net_unet_data(cfg, &train, &val);
    snprintf(m->train_path, sizeof m->train_path, "%s", train);
    rc = sample_steps(ctx, &m->cfg, cfg->sample_steps, &m->sample_steps);
    if (rc == FF_OK)
        rc = ff_unet_create(grid, &m->cfg, NULL, cfg->batch, &m->u);
    if (rc == FF_OK)
        rc = read_images(m, train, &m->train);
    if (rc == FF_OK && val && (rc = read_images(m, val, &m->val)) == FF_OK)
        m->has_val = 1;
    if (rc == FF_OK) {
        ff_unet_images(m->u, &m->first, &m->count);
        rc = batch_buffers(m);
    }
    if (rc == FF_OK)
        rc = ff_unet_init(m->u, cfg->seed);
    if (rc) {
        unet_destroy(m);
        return rc;
    }
    out->ops = &unet_ops;
    out->impl = m;
    return FF_OK;
}

ff_unet *ff_net_unet(const ff_net *net)
{
    return net->ops && net->ops->kind == FF_NET_UNET ? ((unet_net *)net->impl)->u : NULL;
}

/* The configuration in a checkpoint's header (config_slots reversed). */
static void config_from_slots(const int32_t *h, ff_unet_config *c)
{
    memset(c, 0, sizeof *c);
    const int32_t *p = &h[H_CONFIG];
    c->image_size = *p++;
    c->img_channels = *p++;
    c->img_channels_pad = *p++;
    c->base = *p++;
    c->levels = *p++;
    for (int i = 0; i < FF_UNET_MAX_LEVELS; i++)
        c->mult[i] = *p++;
    c->nres = *p++;
    c->group_channels = *p++;
    c->temb_mult = *p++;
    c->attn_head_channels = *p++;
    c->timesteps = *p++;
    c->schedule = (ff_schedule)*p++;
    c->attn_levels = *p++;
    memcpy(&c->beta_first, &h[H_BETAS], sizeof(double));
    memcpy(&c->beta_last, &h[H_BETAS + 2], sizeof(double));
}

/* The U-Net of a checkpoint file on grid for batches of n images (0: the
 * file's batch): its configuration from the header (rank 0 reads and
 * checks it, every rank agrees), the model created, the file verified and
 * loaded (*st its training state). `what` ends the message for another
 * model's file. Collective; *out NULL on failure. */
static int open_file(ff_grid *grid, const char *path, int64_t n, const char *what, unet_net **out,
                     ff_train_state *st)
{
    ff_ctx *ctx = ff_grid_ctx(grid);
    int32_t h[HEADER_INTS] = {0};
    int io = FF_OK;
    *out = NULL;
    if (ff_ctx_rank(ctx) == 0) {
        FILE *f = NULL;
        io = ff_ckpt_check_kind(ctx, path, FF_NET_UNET);
        if (io == FF_OK && !(f = ff_fopen_regular(path)))
            io = ff_set_error(ctx, FF_EIO, "cannot open the checkpoint '%s': %s", path,
                              ff_open_error(errno));
        else if (io == FF_OK && (fread(h, sizeof(int32_t), HEADER_INTS, f) != HEADER_INTS ||
                                 h[H_MAGIC] != FF_UNET_CKPT_MAGIC))
            io = ff_set_error(ctx, FF_EINVAL, "'%s' is not a fourfold U-Net checkpoint (%s)", path,
                              what);
        if (f)
            fclose(f);
    }
    int rc = ff_ctx_agree(ctx, io);
    if (rc == FF_OK && MPI_Bcast(h, HEADER_INTS, MPI_INT32_T, 0, ff_ctx_comm(ctx)) != MPI_SUCCESS)
        rc = ff_ctx_agree(ctx, ff_set_error(ctx, FF_EMPI, "MPI_Bcast failed"));
    if (rc)
        return rc;
    unet_net *m = calloc(1, sizeof *m);
    rc = ff_ctx_agree(ctx, m ? FF_OK : ff_set_error(ctx, FF_ENOMEM, "out of memory"));
    if (rc) {
        free(m);
        return rc;
    }
    m->ctx = ctx;
    m->grid = grid;
    m->epoch = -1;
    config_from_slots(h, &m->cfg);
    m->batch = n ? n : h[H_BATCH];
    m->per = m->cfg.image_size * m->cfg.image_size * m->cfg.img_channels;
    rc = ff_unet_create(grid, &m->cfg, NULL, m->batch, &m->u);
    if (rc == FF_OK) {
        ff_unet_images(m->u, &m->first, &m->count);
        rc = load_file(m, path, st);
    }
    if (rc)
        unet_destroy(m);
    else
        *out = m;
    return rc;
}

int ff_net_file_samples(ff_grid *grid, const char *path, int64_t n, int steps,
                        ff_unet_sampler sampler, uint64_t seed, const char *png)
{
    unet_net *m = NULL;
    ff_train_state st;
    int rc = open_file(grid, path, n, "samples to a PNG are the U-Net's", &m, &st);
    if (rc == FF_OK) {
        m->sampler = sampler;
        rc = sample_steps(m->ctx, &m->cfg, steps, &m->sample_steps);
    }
    if (rc == FF_OK)
        rc = unet_samples(m, png, seed);
    unet_destroy(m);
    return rc;
}

int ff_net_file_eval(ff_grid *grid, const char *path, const char *images, int64_t n, int batches,
                     float *loss, int64_t *batch)
{
    unet_net *m = NULL;
    ff_train_state st;
    int rc = open_file(grid, path, n, "the GPT's loss is on token shards", &m, &st);
    if (rc == FF_OK) {
        m->seed = st.seed; /* the run's validation draws */
        *batch = m->batch;
        rc = read_images(m, images ? images : FF_FASHION_MNIST_TEST, &m->val);
    }
    if (rc == FF_OK)
        rc = batch_buffers(m);
    double sum = 0;
    for (int i = 0; i < batches && rc == FF_OK; i++) {
        float l = 0;
        rc = unet_eval(m, i, batches, &l);
        sum += l;
    }
    if (rc == FF_OK)
        *loss = (float)(sum / batches); /* as ff_trainer_eval's */
    unet_destroy(m);
    return rc;
}

ff_net_kind ff_net_file_kind(ff_ctx *ctx, const char *path)
{
    int32_t magic = 0;
    if (ff_ctx_rank(ctx) == 0) {
        FILE *f = ff_fopen_regular(path);
        if (!f || fread(&magic, sizeof magic, 1, f) != 1)
            magic = 0;
        if (f)
            fclose(f);
    }
    MPI_Bcast(&magic, 1, MPI_INT32_T, 0, ff_ctx_comm(ctx));
    return magic == FF_UNET_CKPT_MAGIC ? FF_NET_UNET : FF_NET_GPT;
}
