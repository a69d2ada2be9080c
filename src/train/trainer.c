/* The training loop (include/fourfold/trainer.h): what `fourfold train`
 * runs, as a library. */
#include "fourfold/trainer.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../device.h"
#include "../internal.h"
#include "../nn/gpt_internal.h"
#include "../util/file.h"
#include "../util/plot.h"
#include "../util/text.h"
#include "ckpt.h"
#include "fourfold/prune.h"
#include "peak.h"

/* Communication on this rank from the group counters: time blocked in
 * waits, and time collectives were in flight (summed over collectives). */
typedef struct {
    double wait_s, flight_s;
    double p2p_wait_s; /* of wait_s: a pipeline's point-to-point messages */
} comm_totals;

typedef struct {
    double *x, *y;
    int n, cap;
} series;

struct ff_trainer {
    ff_trainer_config cfg;
    ff_grid *grid;
    ff_ctx *ctx;
    ff_net net; /* the model (include/fourfold/model.h) */
    ff_gpt *g;  /* the GPT's binding (below), NULL for another model */
    ff_gpt_config shape;
    ff_data *data, *val;
    int32_t *tok, *tgt;
    int first, count, n_micro;
    FILE *log;
    ff_train_state st; /* st.step: steps completed */
    int64_t start_step;
    char train_glob[4300], val_glob[4300];
    double sgemm_rate, flops_step;
    double sgemm_share; /* of a core per compute thread, the measured rate scaled by it */
    int resume_in_out;  /* resume_from is the folder out (by identity) */
    int lock_fd;        /* rank 0: the output folder's lock (claim_out), or -1 */
    double run_t0;      /* wall time when this run's first step began */
    /* the last two checkpoints written or loaded: checkpoint s is known good
     * once step s + 1 has a finite loss */
    char ck_last[4300], ck_prev[4300];
    int64_t saved;
    series loss, val_loss;
};

void ff_trainer_config_default(ff_trainer_config *c)
{
    memset(c, 0, sizeof *c);
    c->model = (ff_gpt_config){.L = 4, .C = 128, .NH = 4, .V = 257, .maxT = 64};
    ff_gpt_opts_default(&c->gpt);
    c->batch = c->micro_batch = 16;
    c->seq = 64;
    c->steps = 200;
    ff_adamw_default(&c->hyper);
    c->hyper.lr = 1e-3f;
    c->seed = 1337;
    c->val_every = 50;
    c->val_batches = 8;
    c->keep = 2;
}

static void emit(ff_trainer *t, ff_train_event ev)
{
    ev.at = t->st.step;
    if (t->cfg.hook)
        t->cfg.hook(&ev, t->cfg.user);
}

static void note(ff_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(ff_trainer *t, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    emit(t, (ff_train_event){.kind = FF_TRAIN_NOTE, .text = text});
}

static int fail(ff_trainer *t, int code, const char *msg)
{
    return ff_ctx_agree(t->ctx, ff_ctx_set_error(t->ctx, code, "%s", msg));
}

static int push(series *s, double x, double y)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
        if (nx)
            s->x = nx;
        double *ny = nx ? realloc(s->y, (size_t)cap * sizeof *ny) : NULL;
        if (!ny)
            return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return 0;
}

/* mkdir -p: the folder and its missing parents. */
static int make_dirs(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(path, 0777) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(path, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

/* Rank 0 makes the output folder and checks that it can write there. */
static int prepare_out(ff_ctx *ctx, const char *dir)
{
    int rc = FF_OK;
    if (ff_ctx_rank(ctx) == 0) {
        char probe[4200];
        snprintf(probe, sizeof probe, "%s/.fourfold-probe", dir);
        struct stat sb;
        if (make_dirs(dir) != 0)
            rc = ff_ctx_set_error(ctx, FF_EIO, "cannot create the output folder '%s': %s", dir,
                                  strerror(errno));
        else if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            rc = ff_ctx_set_error(ctx, FF_EIO, "the output folder '%s' is not a folder", dir);
        else if (ff_file_writable(probe) != 0)
            rc = ff_ctx_set_error(ctx, FF_EIO, "cannot write in the output folder '%s': %s", dir,
                                  strerror(errno));
    }
    return ff_ctx_agree(ctx, rc);
}

/* Whether a and b name one folder: the same device and inode where both
 * exist (so `runs/x`, `./runs/x/` and a link to it are one), else the same
 * string. */
static int same_dir(const char *a, const char *b)
{
    struct stat sa, sb;
    if (!a || !b)
        return 0;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    return !strcmp(a, b);
}

/* The configuration's own consistency, the same on every rank
 * (resume_in_out: rank 0's same_dir(resume_from, out)). */
static const char *check_config(const ff_trainer_config *c, int resume_in_out)
{
    if (c->batch < 1 || c->micro_batch < 1 || c->seq < 1 || c->steps < 0 || c->val_batches < 1 ||
        c->val_every < 0 || c->save_every < 0 || c->keep < 0)
        return "batch, micro-batch, sequence length and validation batches must be positive; "
               "steps, intervals and keep not negative";
    if (c->batch % c->micro_batch)
        return "the batch is not a multiple of the micro-batch";
    const ff_adamw *h = &c->hyper;
    if (!(isfinite(h->lr) && h->lr >= 0 && h->warmup >= 0 && h->min_lr_frac >= 0 &&
          h->min_lr_frac <= 1 && isfinite(h->clip) && h->clip >= 0 && isfinite(h->weight_decay) &&
          h->weight_decay >= 0 && h->beta1 >= 0 && h->beta1 < 1 && h->beta2 >= 0 && h->beta2 < 1 &&
          h->eps > 0))
        return "the optimizer settings are out of range (lr, clip, weight decay >= 0 and finite; "
               "warm-up >= 0; min-lr-frac in [0, 1]; betas in [0, 1); eps > 0)";
    const char *paths[] = {c->out,  c->resume_from, c->init_from,
                           c->data, c->val_data,    c->corpus_dir};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (paths[i] && !paths[i][0])
            return "an empty path (out, resume_from, init_from, data, val_data, corpus_dir: "
                   "NULL for none)";
    if (c->resume_from && c->init_from)
        return "init_from starts a new run; it cannot be combined with resume_from";
    if (c->mask && !c->mask[0])
        return "an empty mask path (NULL for none)";
    if (!(c->prune.sparsity >= 0 && c->prune.sparsity < 1) || c->prune_every < 0 ||
        c->prune_steps < 0 || (c->prune.sparsity > 0 && (c->prune_every < 1 || c->prune_steps < 1)))
        return "pruning: sparsity in [0, 1), and with a sparsity prune_every and prune_steps >= 1";
    if (c->mask && !strcmp(c->mask, "auto") && !c->init_from)
        return "mask \"auto\" is init_from's mask: it needs init_from";
    if (c->overwrite && resume_in_out)
        return "overwrite starts a new run; it cannot be combined with resuming in the same folder";
    if (c->kind != FF_NET_GPT && c->kind != FF_NET_UNET)
        return "the model kind is neither FF_NET_GPT nor FF_NET_UNET";
    if (c->kind == FF_NET_UNET) {
        if (c->init_from || c->mask || c->prune.sparsity > 0 || c->samo)
            return "init_from, masks, pruning and SAMO are the GPT's; a U-Net run has none";
        if (c->gpt.precision != FF_PRECISION_FP32)
            return "the U-Net trains in fp32 only (bf16-mixed is the GPT's)";
        if (c->micro_batch != c->batch)
            return "the U-Net takes its batch in one micro-batch (micro_batch = batch)";
    }
    return NULL;
}

/* Rank 0 locks the output folder for the run (flock on out/.fourfold.lock,
 * released by the kernel when the process ends, however it ends): two
 * runs writing one folder interleave their log lines and can leave one
 * run's model beside the other's state under one DONE marker. The lock
 * file holds the owner's process id and host for the message; flock is
 * the local file system's (on a network file system that does not
 * implement it the lock may not hold across machines). */
static int lock_out(ff_trainer *t)
{
    const char *dir = t->cfg.out;
    int rc = FF_OK;
    if (ff_ctx_rank(t->ctx) == 0) {
        char path[4300], owner[128] = "";
        snprintf(path, sizeof path, "%s/.fourfold.lock", dir);
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            rc = ff_ctx_set_error(t->ctx, FF_EIO, "cannot open the lock '%s': %s", path,
                                  strerror(errno));
        else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            ssize_t got = pread(fd, owner, sizeof owner - 1, 0);
            owner[got > 0 ? got : 0] = '\0';
            owner[strcspn(owner, "\n")] = '\0';
            close(fd);
            rc = e == EWOULDBLOCK
                     ? ff_ctx_set_error(t->ctx, FF_EINVAL,
                                        "'%s' is in use by another run (%s holds %s); wait "
                                        "for it to end or give another output folder",
                                        dir, owner[0] ? owner : "a process", path)
                     : ff_ctx_set_error(t->ctx, FF_EIO, "cannot lock '%s': %s", path, strerror(e));
        } else {
            char host[64] = "?";
            gethostname(host, sizeof host - 1);
            int n = snprintf(owner, sizeof owner, "process %ld on %s\n", (long)getpid(), host);
            if (ftruncate(fd, 0) != 0 || pwrite(fd, owner, (size_t)n, 0) != n)
                rc = ff_ctx_set_error(t->ctx, FF_EIO, "cannot write the lock '%s': %s", path,
                                      strerror(errno));
            t->lock_fd = fd;
        }
    }
    return ff_ctx_agree(t->ctx, rc);
}

/* A new run (or one resumed from elsewhere) must not mix its checkpoints
 * with an older run's in `out`: a later resume would pick the wrong one. */
static int claim_out(ff_trainer *t)
{
    const ff_trainer_config *c = &t->cfg;
    int rc = prepare_out(t->ctx, c->out);
    if (rc == FF_OK)
        rc = lock_out(t);
    if (rc || t->resume_in_out)
        return rc;
    int64_t newest;
    if ((rc = ff_ckpt_latest(t->ctx, c->out, &newest)))
        return rc;
    if (newest >= 0 && c->overwrite)
        return ff_ckpt_clear(t->ctx, c->out);
    if (newest >= 0)
        return ff_ctx_agree(t->ctx, ff_ctx_set_error(t->ctx, FF_EINVAL,
                                                     "'%s' holds the checkpoints of another run "
                                                     "(newest: step %lld); continue it (--resume, "
                                                     "resume_from) or remove them (--overwrite)",
                                                     c->out, (long long)newest));
    return FF_OK;
}

static int open_data(ff_trainer *t)
{
    ff_trainer_config *c = &t->cfg;
    if (!c->data) {
        char dir[4200];
        if (c->corpus_dir)
            snprintf(dir, sizeof dir, "%s", c->corpus_dir);
        else
            snprintf(dir, sizeof dir, "%s/corpus", c->out ? c->out : ".");
        ff_tokenize_report rep;
        int rc =
            ff_corpus_default(t->ctx, dir, t->train_glob, t->val_glob, sizeof t->train_glob, &rep);
        if (rc)
            return rc;
        if (rep.files)
            note(t, "made the default corpus from %d fortune files: %s (%lld tokens), %s (%lld)",
                 rep.files, rep.train.path, (long long)rep.train.tokens, rep.val.path,
                 (long long)rep.val.tokens);
        c->data = t->train_glob;
        if (!c->val_data)
            c->val_data = t->val_glob;
    }
    int rc = ff_data_open(t->ctx, c->data, (int64_t)c->batch * c->seq + 1, &t->data);
    if (rc == FF_OK && c->val_data)
        rc = ff_data_open(t->ctx, c->val_data, (int64_t)c->micro_batch * c->seq + 1, &t->val);
    return rc;
}

static int maybe_samo(ff_trainer *t);

/* Masked training: the given mask file, or init_from's (docs/samo.md). */
static int load_mask(ff_trainer *t)
{
    const char *path = t->cfg.mask;
    char buf[4200];
    if (!strcmp(path, "auto")) {
        if (ff_mask_path(t->cfg.init_from, buf, sizeof buf) != FF_OK)
            return fail(t, FF_EINVAL, "the init_from path is too long for its mask's");
        path = buf;
    }
    return ff_gpt_load_mask(t->g, path, 0);
}

/* Starts the run: from a checkpoint, an llm.c file or GPT-2's initialisation. */
static int start_run(ff_trainer *t)
{
    const ff_trainer_config *c = &t->cfg;
    int rc;
    if (!c->resume_from) /* (the U-Net's binding initialised it from the seed) */
        return !t->g          ? FF_OK
               : c->init_from ? ff_gpt_load(t->g, c->init_from)
                              : ff_gpt_init(t->g, c->seed);
    int64_t step;
    if ((rc = ff_ckpt_latest(t->ctx, c->resume_from, &step)))
        return rc;
    if (step < 0)
        return ff_ctx_agree(t->ctx, ff_ctx_set_error(t->ctx, FF_EIO,
                                                     "no complete checkpoint to resume in '%s' "
                                                     "(no DONE_* marker)",
                                                     c->resume_from));
    /* the newest checkpoint whose files are whole and belong together: a
     * corrupt or mismatched one (a crash, a second writer) is noted and
     * passed over for the one before it (ff_ckpt_load checks all of a
     * checkpoint before any of it reaches the model); an error that is not
     * the files' (unreadable, out of memory) stops the resume */
    while ((rc = t->net.ops->load(t->net.impl, c->resume_from, step, &t->st)) == FF_ECORRUPT) {
        char why[FF_ERRMSG_LEN];
        snprintf(why, sizeof why, "%s", ff_ctx_error(t->ctx));
        int64_t older;
        if ((rc = ff_ckpt_older(t->ctx, c->resume_from, step, &older)))
            return rc;
        if (older < 0)
            return ff_ctx_agree(t->ctx, ff_ctx_set_error(t->ctx, FF_ECORRUPT,
                                                         "%s; no older checkpoint to resume", why));
        note(t, "passing over the checkpoint of step %lld (%s); trying step %lld", (long long)step,
             why, (long long)older);
        step = older;
    }
    if (rc)
        return rc;
    const ff_adamw *h = &t->st.hyper, *n = &c->hyper;
    if (h->lr != n->lr || h->warmup != n->warmup || h->steps != n->steps ||
        h->min_lr_frac != n->min_lr_frac || h->weight_decay != n->weight_decay ||
        h->clip != n->clip)
        note(t,
             "the schedule differs from the checkpoint's (lr %g, warm-up %d, steps %d, "
             "min-lr-frac %g, weight decay %g, clip %g); continuing with this one, so the run "
             "is not the one that was saved",
             h->lr, h->warmup, h->steps, h->min_lr_frac, h->weight_decay, h->clip);
    if (t->st.batch != c->batch || t->st.seq != c->seq)
        note(t,
             "the checkpoint was trained with batch %d, seq %d; continuing with batch %d, "
             "seq %d from its data position",
             t->st.batch, t->st.seq, c->batch, c->seq);
    note(t, "resumed from step %lld of %s", (long long)t->st.step, c->resume_from);
    t->saved = t->st.step;
    ff_ckpt_path(t->ck_last, sizeof t->ck_last, c->resume_from, "model", t->saved);
    if (t->st.step >= c->steps)
        note(t, "the checkpoint is at step %lld, the run ends at %d: nothing to train",
             (long long)t->st.step, c->steps);
    return FF_OK;
}

/* ---- the GPT's binding of the model interface (fourfold/model.h) ----------
 * Its handle is the trainer: the model t->g, its token data t->data and
 * t->val, and the batch buffers. */

static int gpt_step(void *impl, int64_t step, const ff_adamw *h, ff_net_step *info)
{
    ff_trainer *t = impl;
    const ff_trainer_config *c = &t->cfg;
    /* the batch read is agreed with the step's token check: one agreement */
    int rc = ff_data_next(t->data, t->n_micro, c->micro_batch, c->seq, t->first, t->count,
                          t->shape.V, t->tok, t->tgt);
    ff_gpt_step_info gi;
    rc = ff_gpt_step_agreed(t->g, rc, t->tok, t->tgt, t->n_micro, h, (int)step, &gi);
    *info = (ff_net_step){.loss = gi.loss,
                          .lr = gi.lr,
                          .grad_norm = gi.grad_norm,
                          .aux_loss = gi.aux_loss,
                          .dropped = gi.dropped};
    return rc;
}

static int gpt_eval(void *impl, int i, int n, float *loss)
{
    ff_trainer *t = impl;
    const ff_trainer_config *c = &t->cfg;
    /* a bad token may be on one rank's sequences only: agree first */
    int rc = ff_ctx_agree(t->ctx, ff_data_seek(t->val, ff_data_spread(t->val, i, n)));
    if (rc == FF_OK)
        rc = ff_ctx_agree(t->ctx, ff_data_next(t->val, 1, c->micro_batch, c->seq, t->first,
                                               t->count, t->shape.V, t->tok, t->tgt));
    if (rc == FF_OK)
        rc = ff_gpt_eval(t->g, t->tok, t->tgt, loss);
    return rc;
}

static int gpt_has_val(void *impl) { return ((ff_trainer *)impl)->val != NULL; }

static int gpt_save(void *impl, const char *dir, ff_train_state *st)
{
    ff_trainer *t = impl;
    st->data = ff_data_tell(t->data);
    return ff_ckpt_gpt_files(t->g, dir, st);
}

static int gpt_load(void *impl, const char *dir, int64_t step, ff_train_state *st)
{
    ff_trainer *t = impl;
    int rc = ff_ckpt_load(t->g, dir, step, st);
    return rc ? rc : ff_ctx_agree(t->ctx, ff_data_seek(t->data, st->data));
}

static double gpt_flops(void *impl)
{
    ff_trainer *t = impl;
    return ff_gpt_flops_per_token(t->g, t->cfg.seq) * (double)t->cfg.batch * t->cfg.seq;
}

static void gpt_describe(void *impl, char *json, size_t jl, char *title, size_t tl)
{
    const ff_trainer *t = impl;
    const ff_gpt_config *m = &t->shape;
    snprintf(json, jl, "\"L\":%d,\"C\":%d,\"NH\":%d,\"V\":%d,\"maxT\":%d", m->L, m->C, m->NH, m->V,
             m->maxT);
    snprintf(title, tl, "L=%d C=%d NH=%d, %d x %d tokens per step", m->L, m->C, m->NH, t->cfg.batch,
             t->cfg.seq);
}

static void gpt_destroy(void *impl) { (void)impl; /* the trainer's own fields */ }

static const ff_net_ops gpt_ops = {
    .kind = FF_NET_GPT,
    .name = "gpt",
    .loss_unit = "nats per token",
    .step = gpt_step,
    .eval = gpt_eval,
    .has_val = gpt_has_val,
    .save = gpt_save,
    .load = gpt_load,
    .flops_per_step = gpt_flops,
    .describe = gpt_describe,
    .write_samples = NULL, /* text: ff_gpt_sample_next, `fourfold sample` */
    .destroy = gpt_destroy,
};

/* The empirical peak (docs/design.md §8): sgemm (or, for bf16-mixed
 * products on oneDNN, its bf16 matmul) on every rank at once, as the step
 * runs, by CPU time and the share of a core (src/train/peak.h); the mean
 * over ranks. */
static void measure_sgemm(ff_trainer *t)
{
    const ff_trainer_config *c = &t->cfg;
    int threads = ff_ctx_blas_threads(t->ctx); /* the step's products' */
    double r = c->sgemm_rate, share = 1;
    int need = !(r > 0 && isfinite(r)), any = 0; /* then every rank measures, at once */
    MPI_Allreduce(&need, &any, 1, MPI_INT, MPI_MAX, ff_ctx_comm(t->ctx));
    if (any) {
#ifdef FF_CUDA
        /* on a GPU, cuBLAS's fp32 rate at a size where it peaks */
        struct ff_cuda *cu = ff_ctx_cuda(t->ctx);
        if (cu) {
            MPI_Barrier(ff_ctx_comm(t->ctx));
            r = ff_cuda_sgemm_rate(cu, 4096, 4096, 4096, 0.2);
        }
#else
        void *cu = NULL;
#endif
        if (!cu) {
            /* a bf16-mixed run's products on oneDNN: its bf16 matmul's rate */
            ff_bf16_gemm *bf16 = NULL;
            if (t->g && ff_gpt_bf16_products(t->g, NULL, NULL) == FF_BF16_PRODUCTS_ONEDNN &&
                ff_bf16_gemm_create(t->ctx, &bf16) != FF_OK)
                bf16 = NULL; /* (created at the model's start: alike on every rank) */
            ff_sgemm_peak p = ff_sgemm_peak_measure(ff_ctx_comm(t->ctx), threads, 0.1, bf16);
            ff_bf16_gemm_destroy(bf16);
            r = p.flops;
            share = p.share;
        }
    }
    ff_blas_set_threads(threads);
    MPI_Allreduce(&r, &t->sgemm_rate, 1, MPI_DOUBLE, MPI_SUM, ff_ctx_comm(t->ctx));
    t->sgemm_rate /= ff_ctx_size(t->ctx);
    MPI_Allreduce(&share, &t->sgemm_share, 1, MPI_DOUBLE, MPI_MIN, ff_ctx_comm(t->ctx));
}

/* s as a JSON string literal (util/text.h's escaper: quotes, backslashes,
 * control characters), malloc'd; NULL if out of memory. */
static char *json_string(const char *s)
{
    ff_text b = {0};
    ff_text_json_string(&b, s, 0);
    if (b.failed)
        ff_text_free(&b);
    return b.s;
}

static int open_log(ff_trainer *t)
{
    const ff_trainer_config *c = &t->cfg;
    int io = FF_OK;
    if (c->out && ff_ctx_rank(t->ctx) == 0) {
        char path[4300];
        snprintf(path, sizeof path, "%s/log.jsonl", c->out);
        if (!(t->log = fopen(path, c->resume_from ? "a" : "w")))
            return ff_ctx_agree(t->ctx,
                                ff_ctx_set_error(t->ctx, FF_EIO, "cannot write '%s'", path));
        ff_dims s = ff_grid_shape(t->grid);
        char model[1024], title[256];
        t->net.ops->describe(t->net.impl, model, sizeof model, title, sizeof title);
        /* strings from outside (the BLAS's name, paths) escaped */
        char *core = json_string(ff_blas_core());
        /* (on oneDNN, sgemm_flops_per_rank is its bf16 matmul's rate) */
        ff_bf16_products products =
            t->g ? ff_gpt_bf16_products(t->g, NULL, NULL) : FF_BF16_PRODUCTS_AUTO;
        char *from = c->resume_from ? json_string(c->resume_from) : NULL;
        if (!core || (c->resume_from && !from)) {
            io = ff_ctx_set_error(t->ctx, FF_ENOMEM, "out of memory writing '%s'", path);
        } else {
            fprintf(t->log,
                    "{\"type\":\"config\",\"grid\":\"%dx%dx%dx%d\",\"stages\":%d,%s,"
                    "\"batch\":%d,\"micro_batch\":%d,"
                    "\"seq\":%d,\"steps\":%d,\"lr\":%g,\"start_step\":%lld,"
                    "\"sgemm_flops_per_rank\":%.4g,\"sgemm_core_share\":%.4g,\"blas_core\":%s,"
                    "\"device\":\"%s\",\"ranks\":%d,\"precision\":\"%s\","
                    "\"bf16_products\":\"%s\"}\n",
                    s.x, s.y, s.z, s.d, ff_grid_stages(t->grid), model, c->batch, c->micro_batch,
                    c->seq, c->steps, c->hyper.lr, (long long)t->st.step, t->sgemm_rate,
                    t->sgemm_share, core, ff_ctx_cuda(t->ctx) ? "cuda" : "cpu", ff_ctx_size(t->ctx),
                    ff_precision_name(c->gpt.precision),
                    products == FF_BF16_PRODUCTS_AUTO ? "none" : ff_bf16_products_name(products));
            if (from)
                fprintf(t->log, "{\"type\":\"resume\",\"step\":%lld,\"from\":%s}\n",
                        (long long)t->st.step, from);
            io = fflush(t->log) == 0 ? FF_OK
                                     : ff_ctx_set_error(t->ctx, FF_EIO, "cannot write '%s'", path);
        }
        free(core);
        free(from);
    }
    return ff_ctx_agree(t->ctx, io);
}

/* The model of init_from: the file's shape. A mixture of experts in the
 * configuration (model.experts > 0) must have the file's experts and
 * expert_every, and its top_k, capacity_factor and aux_coef replace the
 * file's (fine-tuning with another capacity); a dense file does not become
 * a mixture of experts. Collective; agreed. */
static int init_shape(ff_trainer *t, ff_gpt_config *shape)
{
    const ff_gpt_config *want = &t->cfg.model;
    int rc = ff_gpt_read_config(t->ctx, t->cfg.init_from, shape);
    if (rc || want->experts <= 0)
        return rc;
    if (shape->experts != want->experts || shape->expert_every != want->expert_every)
        return ff_ctx_agree(t->ctx,
                            ff_ctx_set_error(t->ctx, FF_EINVAL,
                                             "'%s' has %d experts in one block of every %d; the "
                                             "run asks for %d in one of every %d",
                                             t->cfg.init_from, shape->experts, shape->expert_every,
                                             want->experts, want->expert_every));
    shape->top_k = want->top_k;
    shape->capacity_factor = want->capacity_factor;
    shape->aux_coef = want->aux_coef;
    return FF_OK;
}

/* The GPT's model and its token data (the binding above). */
static int gpt_create(ff_trainer *t)
{
    const ff_trainer_config *c = &t->cfg;
    ff_grid *grid = t->grid;
    ff_ctx *ctx = t->ctx;
    int rc = open_data(t);
    t->shape = c->model;
    if (rc == FF_OK && c->init_from)
        rc = init_shape(t, &t->shape);
    if (rc == FF_OK && c->seq > t->shape.maxT)
        rc = ff_ctx_agree(ctx, ff_ctx_set_error(ctx, FF_EINVAL,
                                                "the sequence length %d is longer than the "
                                                "%d positions of %s",
                                                c->seq, t->shape.maxT,
                                                c->init_from ? c->init_from : "the model"));
    if (rc == FF_OK)
        rc = ff_gpt_create(grid, &t->shape, &c->gpt, c->micro_batch, c->seq, &t->g);
    if (rc == FF_OK) {
        t->shape = ff_gpt_get_config(t->g);
        t->n_micro = c->batch / c->micro_batch;
        ff_gpt_local_sequences(t->g, &t->first, &t->count);
        size_t n = (size_t)t->n_micro * t->count * c->seq;
        t->tok = malloc(n * sizeof *t->tok);
        t->tgt = malloc(n * sizeof *t->tgt);
        rc = ff_ctx_agree(ctx, t->tok && t->tgt
                                   ? FF_OK
                                   : ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory for a batch"));
    }
    if (rc == FF_OK)
        t->net = (ff_net){&gpt_ops, t};
    return rc;
}

int ff_trainer_create(ff_grid *grid, const ff_trainer_config *cfg, ff_trainer **out)
{
    *out = NULL;
    ff_ctx *ctx = ff_grid_ctx(grid);
    ff_trainer *t = calloc(1, sizeof *t);
    int rc = ff_ctx_agree(ctx, t ? FF_OK : ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory"));
    if (rc) {
        free(t);
        return rc;
    }
    t->cfg = *cfg;
    t->grid = grid;
    t->ctx = ctx;
    t->saved = -1;
    t->lock_fd = -1;
    t->cfg.hyper.steps = cfg->steps;
    /* one folder by identity, decided on rank 0 (the folders are its) */
    t->resume_in_out = ff_ctx_rank(ctx) == 0 && same_dir(cfg->resume_from, cfg->out);
    MPI_Bcast(&t->resume_in_out, 1, MPI_INT, 0, ff_ctx_comm(ctx));
    const char *bad = check_config(cfg, t->resume_in_out);
    rc = bad ? fail(t, FF_EINVAL, bad) : FF_OK;
    if (rc == FF_OK && cfg->out)
        rc = claim_out(t);
    if (rc == FF_OK && cfg->kind == FF_NET_UNET) {
        rc = ff_net_unet_create(grid, cfg, &t->net);
        ff_net_unet_data(cfg, &t->cfg.data, &t->cfg.val_data); /* named in ff_trainer_info */
    } else if (rc == FF_OK)
        rc = gpt_create(t);
    if (rc == FF_OK)
        rc = start_run(t);
    if (rc == FF_OK && cfg->mask)
        rc = load_mask(t);
    if (rc == FF_OK)
        rc = maybe_samo(t);
    if (rc == FF_OK) {
        t->start_step = t->st.step;
        t->st.seed = cfg->seed;
        t->st.batch = cfg->batch;
        t->st.micro_batch = cfg->micro_batch;
        t->st.seq = cfg->seq;
        t->st.hyper = t->cfg.hyper;
        t->flops_step = t->net.ops->flops_per_step(t->net.impl);
        measure_sgemm(t);
        rc = open_log(t);
    }
    if (rc) {
        ff_trainer_destroy(t);
        return rc;
    }
    *out = t;
    return FF_OK;
}

/* The groups the step communicates on, k < N_STEP_GROUPS: the grid's,
 * then a mixture of experts' expert group and the experts' replicas (with
 * expert parallelism only; without it the replicas are D, counted there):
 * NULL where there is none. */
enum { N_STEP_GROUPS = FF_NGROUPS + 2 };
static ff_group *step_group(ff_trainer *t, int k, const char **name)
{
    if (k < FF_NGROUPS) {
        *name = ff_group_kind_name((ff_group_kind)k);
        return ff_grid_group(t->grid, (ff_group_kind)k);
    }
    *name = k == FF_NGROUPS ? "EP" : "EDP";
    return t->g && ff_gpt_expert_group(t->g, 0) ? ff_gpt_expert_group(t->g, k > FF_NGROUPS) : NULL;
}

static comm_totals totals(ff_trainer *tr)
{
    comm_totals t = {0};
    for (int k = 0; k < N_STEP_GROUPS; k++) {
        const char *name;
        ff_group *g = step_group(tr, k, &name);
        for (int c = 0; g && c <= FF_COLL_P2P; c++) {
            ff_counters n = ff_group_counters(g, (ff_coll)c);
            t.wait_s += n.wait_s;
            /* a pipeline's receives are posted long before their message
             * comes: their time in flight is not hidden communication */
            if (c != FF_COLL_P2P)
                t.flight_s += n.flight_s;
            else
                t.p2p_wait_s += n.wait_s;
        }
    }
    return t;
}

static void log_line(ff_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_line(ff_trainer *t, const char *fmt, ...)
{
    if (!t->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(t->log, fmt, ap);
    va_end(ap);
    fflush(t->log);
}

/* SAMO once the mask is final: at once, or after the schedule's last round. */
static int maybe_samo(ff_trainer *t)
{
    const ff_trainer_config *c = &t->cfg;
    if (!c->samo || ff_gpt_is_samo(t->g) ||
        (c->prune.sparsity > 0 && t->st.step < (int64_t)c->prune_every * c->prune_steps))
        return FF_OK;
    int rc = ff_gpt_samo(t->g);
    if (rc)
        return rc;
    ff_gpt_memory m;
    ff_gpt_memory_report(t->g, &m);
    note(t,
         "SAMO from step %lld: %zu kept weights compressed on this rank, gradients, moments and "
         "offsets %.1f MiB, parameters %.1f MiB (%s)",
         (long long)t->st.step, m.mask / sizeof(uint32_t),
         (double)(m.grads + m.adam + m.mask) / (1 << 20), (double)m.params / (1 << 20),
         c->gpt.precision == FF_PRECISION_BF16_MIXED
             ? "the compressed fp32 master and the dense bf16 copy"
             : "dense: the products' weights");
    return FF_OK;
}

/* Round i of the pruning schedule: the parameters and the mask so far to
 * rank 0, pruned there (ff_prune), the new mask applied everywhere. */
static int prune_round(ff_trainer *t, int i)
{
    ff_prune_opts o = t->cfg.prune;
    o.sparsity = 1.0 - pow(1.0 - t->cfg.prune.sparsity, (double)i / t->cfg.prune_steps);
    const size_t n = ff_gpt_canonical_size(t->g);
    const int root = ff_ctx_rank(t->ctx) == 0, masked = ff_gpt_has_mask(t->g);
    float *canon = NULL, *mask = NULL;
    unsigned char *keep = NULL;
    int local = FF_OK;
    if (root && (!(canon = malloc((n ? n : 1) * sizeof *canon)) || !(keep = malloc(n ? n : 1)) ||
                 (masked && !(mask = malloc((n ? n : 1) * sizeof *mask)))))
        local = ff_ctx_set_error(t->ctx, FF_ENOMEM, "out of memory pruning");
    int rc = ff_ctx_agree(t->ctx, local);
    if (rc == FF_OK)
        rc = ff_gpt_gather(t->g, FF_GPT_PARAMS, canon, 0);
    if (rc == FF_OK && masked)
        rc = ff_gpt_gather(t->g, FF_GPT_MASK, mask, 0);
    int64_t cand = 0, pruned = 0;
    if (rc == FF_OK) {
        char err[512] = "";
        if (root) {
            for (size_t k = 0; k < n; k++)
                keep[k] = !masked || mask[k] != 0.0f;
            if ((local = ff_prune(t->g, canon, &o, keep, &cand, &pruned, err, sizeof err)))
                ff_ctx_set_error(t->ctx, local, "%s", err);
        }
        rc = ff_ctx_agree(t->ctx, local);
    }
    if (rc == FF_OK)
        rc = ff_gpt_set_mask(t->g, keep, 0);
    free(canon);
    free(mask);
    free(keep);
    if (rc)
        return rc;
    int64_t counts[2] = {cand, pruned};
    if (MPI_Bcast(counts, 2, MPI_INT64_T, 0, ff_ctx_comm(t->ctx)) != MPI_SUCCESS)
        return fail(t, FF_EMPI, "MPI_Bcast failed");
    log_line(t,
             "{\"type\":\"prune\",\"step\":%lld,\"round\":%d,\"sparsity\":%.6f,"
             "\"candidates\":%lld,\"pruned\":%lld}\n",
             (long long)t->st.step, i, o.sparsity, (long long)counts[0], (long long)counts[1]);
    note(t, "step %lld: pruning round %d of %d: %lld of %lld candidate weights pruned (%.4f)",
         (long long)t->st.step, i, t->cfg.prune_steps, (long long)counts[1], (long long)counts[0],
         counts[0] ? (double)counts[1] / (double)counts[0] : 0.0);
    return FF_OK;
}

int ff_trainer_step(ff_trainer *t, ff_train_step_info *out)
{
    const ff_trainer_config *c = &t->cfg;
    const int64_t step = t->st.step; /* 0-based index of this step */
    if (step >= c->steps)
        return fail(t, FF_EINVAL, "the run has reached its last step");
    comm_totals c0 = totals(t);
    double t0 = ff_now();
    if (step == t->start_step)
        t->run_t0 = t0;
    ff_net_step gi;
    int rc = t->net.ops->step(t->net.impl, step, &c->hyper, &gi);
    double now = ff_now(), dt = now - t0;
    if (rc == FF_ENUMERIC) {
        /* the checkpoint of the previous step holds the parameters that
         * gave this loss; an older one was followed by a finite loss */
        const char *good = t->saved >= 0 && t->saved < step ? t->ck_last : t->ck_prev;
        if (good == t->ck_prev && c->keep == 1)
            good = ""; /* removed when the newer one was written */
        char why[FF_ERRMSG_LEN];
        snprintf(why, sizeof why, "%s", ff_ctx_error(t->ctx)); /* names the step */
        ff_ctx_set_error(t->ctx, rc, "%s; stopping (the last good checkpoint: %s)", why,
                         *good ? good : "none");
    }
    if (rc)
        return rc;
    t->st.step = step + 1;
    comm_totals c1 = totals(t);
    double wait = c1.wait_s - c0.wait_s;
    ff_train_step_info in = {.step = step + 1,
                             .steps = c->steps,
                             .loss = gi.loss,
                             .lr = gi.lr,
                             .grad_norm = gi.grad_norm,
                             .ms = dt * 1e3,
                             .aux_loss = gi.aux_loss,
                             .dropped = gi.dropped};
    in.tokens_per_s = (double)c->batch * c->seq / dt;
    in.model_flops_per_s = t->flops_step / dt;
    in.sgemm_fraction = in.model_flops_per_s / (t->sgemm_rate * ff_ctx_size(t->ctx));
    in.compute_ms = (dt - wait) * 1e3;
    in.wait_ms = wait * 1e3;
    /* in flight beside compute: summed over collectives (concurrent ones
     * each count), so capped at the compute time it hid behind */
    double coll_wait = wait - (c1.p2p_wait_s - c0.p2p_wait_s);
    in.hidden_ms = fmin(fmax(0.0, (c1.flight_s - c0.flight_s) - coll_wait), dt - wait) * 1e3;
    in.eta_s =
        (now - t->run_t0) / (double)(step + 1 - t->start_step) * (double)(c->steps - step - 1);
    push(&t->loss, (double)(step + 1), gi.loss);
    char moe[96] = ""; /* a mixture of experts: the step's MoE figures too */
    if (t->g && t->shape.experts > 0)
        snprintf(moe, sizeof moe, ",\"aux_loss\":%.9g,\"dropped\":%.6f", in.aux_loss, in.dropped);
    log_line(t,
             "{\"type\":\"step\",\"step\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,"
             "\"ms\":%.3f,\"tokens_per_s\":%.1f,\"model_flops_per_s\":%.4g,"
             "\"sgemm_fraction\":%.4f,\"compute_ms\":%.3f,\"wait_ms\":%.3f,"
             "\"hidden_ms\":%.3f,\"eta_s\":%.1f%s}\n",
             (long long)in.step, in.loss, in.lr, in.grad_norm, in.ms, in.tokens_per_s,
             in.model_flops_per_s, in.sgemm_fraction, in.compute_ms, in.wait_ms, in.hidden_ms,
             in.eta_s, moe);
    if (out)
        *out = in;
    /* a pruning round belongs to this step: done before its event, so a
     * hook that saves there saves the new mask */
    const int64_t done = step + 1;
    if (c->prune.sparsity > 0 && done % c->prune_every == 0 &&
        done / c->prune_every <= c->prune_steps &&
        ((rc = prune_round(t, (int)(done / c->prune_every))) || (rc = maybe_samo(t))))
        return rc;
    emit(t, (ff_train_event){.kind = FF_TRAIN_STEP, .step = &in});
    if (t->g && done == t->start_step + 1) { /* the layers' pool and GEMM scratch exist now */
        ff_gpt_memory m;
        ff_gpt_memory_report(t->g, &m);
        const double mib = 1.0 / (1 << 20);
        note(t,
             "memory of this rank after the run's first step: %.1f MiB (model state %.1f, "
             "activations %.1f, scratch %.1f, the layers' pool %.1f, the GEMMs' scratch %.1f; "
             "as allocated)",
             (double)ff_gpt_memory_total(&m) * mib,
             (double)(m.params + m.grads + m.adam + m.mask) * mib, (double)m.activations * mib,
             (double)m.scratch * mib, (double)m.linear_held * mib, (double)m.gemm_scratch * mib);
    }
    return FF_OK;
}

int ff_trainer_eval(ff_trainer *t, float *val_loss)
{
    const ff_trainer_config *c = &t->cfg;
    if (!t->net.ops->has_val(t->net.impl))
        return fail(t, FF_EINVAL, "no validation data");
    int rc = FF_OK;
    double sum = 0;
    for (int i = 0; rc == FF_OK && i < c->val_batches; i++) {
        float l = 0;
        rc = t->net.ops->eval(t->net.impl, i, c->val_batches, &l);
        sum += l;
    }
    if (rc)
        return rc;
    float v = (float)(sum / c->val_batches);
    push(&t->val_loss, (double)t->st.step, v);
    if (isfinite(v))
        log_line(t, "{\"type\":\"val\",\"step\":%lld,\"val_loss\":%.9g}\n", (long long)t->st.step,
                 v);
    else /* JSON has no NaN */
        log_line(t, "{\"type\":\"val\",\"step\":%lld,\"val_loss\":null}\n", (long long)t->st.step);
    if (val_loss)
        *val_loss = v;
    emit(t, (ff_train_event){.kind = FF_TRAIN_VAL, .val_loss = v});
    return FF_OK;
}

int ff_trainer_save(ff_trainer *t)
{
    const ff_trainer_config *c = &t->cfg;
    if (!c->out)
        return fail(t, FF_EINVAL, "no output folder to save a checkpoint in");
    int rc = ff_ckpt_commit(t->ctx, &t->net, c->out, &t->st, c->keep);
    if (rc)
        return rc;
    if (t->saved != t->st.step) /* a second save of one step keeps the older one */
        memcpy(t->ck_prev, t->ck_last, sizeof t->ck_prev);
    t->saved = t->st.step;
    ff_ckpt_path(t->ck_last, sizeof t->ck_last, c->out, "model", t->saved);
    emit(t, (ff_train_event){.kind = FF_TRAIN_SAVE, .path = t->ck_last});
    return FF_OK;
}

/* The bytes each group moved over the run, one log line per collective used. */
static void log_bytes(ff_trainer *t)
{
    for (int k = 0; t->log && k < N_STEP_GROUPS; k++) {
        const char *name;
        ff_group *g = step_group(t, k, &name);
        for (int c = 0; g && c <= FF_COLL_P2P; c++) {
            ff_counters n = ff_group_counters(g, (ff_coll)c);
            if (n.calls)
                log_line(t,
                         "{\"type\":\"bytes\",\"group\":\"%s\",\"coll\":\"%s\",\"calls\":%llu,"
                         "\"bytes_sent\":%llu,\"bytes_recv\":%llu,\"wait_s\":%.6f}\n",
                         name, ff_coll_name((ff_coll)c), (unsigned long long)n.calls,
                         (unsigned long long)n.bytes_sent, (unsigned long long)n.bytes_recv,
                         n.wait_s);
        }
    }
}

int ff_trainer_run(ff_trainer *t)
{
    const ff_trainer_config *c = &t->cfg;
    int rc = FF_OK;
    while (rc == FF_OK && t->st.step < c->steps) {
        if ((rc = ff_trainer_step(t, NULL)))
            break;
        const int64_t s = t->st.step;
        const int last = s == c->steps;
        /* the checkpoint before the validation: a validation that fails (a
         * bad token in its data) must not lose the steps trained */
        if (c->out && ((c->save_every && s % c->save_every == 0) || last))
            rc = ff_trainer_save(t);
        if (rc == FF_OK && t->net.ops->has_val(t->net.impl) &&
            ((c->val_every && s % c->val_every == 0) || last))
            rc = ff_trainer_eval(t, NULL);
    }
    if (rc == FF_OK)
        log_bytes(t); /* rank 0's log only */
    if (rc == FF_OK && c->out && t->st.step > t->start_step) {
        char path[4300];
        snprintf(path, sizeof path, "%s/loss.svg", c->out);
        if ((rc = ff_trainer_write_loss_svg(t, path)) == FF_OK)
            note(t, "the loss curves: %s", path);
    }
    return rc;
}

int ff_trainer_write_loss_svg(ff_trainer *t, const char *path)
{
    int rc = FF_OK;
    if (ff_ctx_rank(t->ctx) == 0) {
        ff_dims s = ff_grid_shape(t->grid);
        char title[512], model[1024], head[256], err[512];
        t->net.ops->describe(t->net.impl, model, sizeof model, head, sizeof head);
        snprintf(title, sizeof title, "%s, grid %dx%dx%dx%d (%s)", head, s.x, s.y, s.z, s.d,
                 t->net.ops->loss_unit);
        ff_plot_series ser[2] = {
            {"training", "#1f77b4", t->loss.x, t->loss.y, t->loss.n, 0},
            {"validation", "#d62728", t->val_loss.x, t->val_loss.y, t->val_loss.n, 1},
        };
        if (ff_plot_svg(path, title, "step", "loss", ser, t->val_loss.n ? 2 : 1, err, sizeof err) !=
            0)
            rc = ff_ctx_set_error(t->ctx, FF_EIO, "%s", err);
    }
    return ff_ctx_agree(t->ctx, rc);
}

int64_t ff_trainer_steps_done(const ff_trainer *t) { return t->st.step; }

ff_gpt *ff_trainer_gpt(ff_trainer *t) { return t->g; }

ff_unet *ff_trainer_unet(ff_trainer *t) { return ff_net_unet(&t->net); }

const ff_net *ff_trainer_net(const ff_trainer *t) { return &t->net; }

int ff_trainer_write_samples(ff_trainer *t, const char *path, uint64_t seed)
{
    if (!t->net.ops->write_samples)
        return fail(t, FF_EUNSUPPORTED, "this model writes no samples to a file");
    return t->net.ops->write_samples(t->net.impl, path, seed);
}

void ff_trainer_get_info(const ff_trainer *t, ff_trainer_info *info)
{
    info->start_step = t->start_step;
    info->data = t->cfg.data;
    info->val_data = t->net.ops && t->net.ops->has_val(t->net.impl) ? t->cfg.val_data : NULL;
    info->sgemm_rate = t->sgemm_rate;
    info->sgemm_core_share = t->sgemm_share;
    info->flops_per_step = t->flops_step;
    info->state = &t->st;
}

void ff_trainer_destroy(ff_trainer *t)
{
    if (!t)
        return;
    if (t->log)
        fclose(t->log);
    if (t->lock_fd >= 0)
        close(t->lock_fd); /* the folder's lock goes with it */
    free(t->tok);
    free(t->tgt);
    ff_data_close(t->data);
    ff_data_close(t->val);
    ff_gpt_destroy(t->g);
    if (t->net.ops && t->net.impl != t)
        t->net.ops->destroy(t->net.impl);
    free(t->loss.x);
    free(t->loss.y);
    free(t->val_loss.x);
    free(t->val_loss.y);
    free(t);
}
