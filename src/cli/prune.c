/* fourfold prune: magnitude pruning of a checkpoint's weight matrices,
 * writing the pruned checkpoint and its mask (docs/samo.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "util/file.h"

static const char help_prune[] =
    "usage: mpirun -np N fourfold prune --checkpoint IN --sparsity P --out OUT [options]\n"
    "\n"
    "Sets the smallest weights of the linear layers' matrices (qkvw, attprojw, fcw,\n"
    "fcprojw and the experts' efcw, efcprojw) to zero by magnitude and writes the\n"
    "checkpoint OUT and its mask OUT.mask (docs/samo.md). If IN.mask exists, its\n"
    "pruned weights stay pruned and count towards P (iterative pruning).\n"
    "\n"
    "  --checkpoint IN   an llm.c v3 or fourfold MoE checkpoint\n"
    "  --sparsity P      the fraction of the candidate weights pruned, 0 <= P < 1\n"
    "  --out OUT         the pruned checkpoint (OUT.mask beside it)\n"
    "  --per-layer       each matrix (a block's, an expert's) loses P on its own\n"
    "                    (default: one threshold over all of them)\n"
    "  --embedding       prune the token embedding too\n";

typedef struct {
    cli_run_opts run;
    const char *in, *out;
    double sparsity;
    int have_sparsity;
    ff_prune_opts prune;
} prune_opts;

static int parse(int argc, char **argv, prune_opts *o)
{
    cli_args a;
    cli_args_init(&a, argc, argv);
    int bad = 0;
    const char *v;
    while (!bad && cli_next(&a)) {
        if (cli_is(&a, "help"))
            return -1;
        if (cli_run_option(&a, &o->run, &bad))
            continue;
        if (cli_is(&a, "checkpoint"))
            bad = !(o->in = cli_value(&a));
        else if (cli_is(&a, "out"))
            bad = !(o->out = cli_value(&a));
        else if (cli_is(&a, "sparsity")) {
            bad = !(v = cli_value(&a)) || cli_parse_double("sparsity", v, 0, 1, &o->sparsity);
            if (!bad && o->sparsity >= 1.0) {
                cli_error("--sparsity %s: expected 0 <= P < 1", v);
                bad = 1;
            }
            o->have_sparsity = 1;
        } else if (cli_is(&a, "per-layer"))
            o->prune.per_layer = 1;
        else if (cli_is(&a, "embedding"))
            o->prune.embedding = 1;
        else
            return cli_unknown(&a, "prune");
    }
    if (bad)
        return CLI_USAGE;
    if (!o->in || !o->out || !o->have_sparsity) {
        cli_error("prune needs --checkpoint IN, --sparsity P and --out OUT");
        return CLI_USAGE;
    }
    o->prune.sparsity = o->sparsity;
    return CLI_OK;
}

/* Rank 0's part: the mask (continuing IN.mask if there is one), the pruned
 * canonical parameters, the mask file. */
static int prune_root(ff_gpt *g, const prune_opts *o, float *canon, unsigned char *keep, char *err,
                      size_t len)
{
    const size_t n = ff_gpt_canonical_size(g);
    char path[4200];
    int rc = ff_mask_path(o->in, path, sizeof path);
    memset(keep, 1, n);
    if (rc == FF_OK && access(path, F_OK) == 0) {
        int64_t kept;
        if ((rc = ff_mask_read(g, path, keep, &kept, err, len)))
            return rc;
        printf("starting from %s: %lld of %zu entries kept\n", path, (long long)kept, n);
        const int64_t over = ff_prune_excess(g, &o->prune, keep);
        if (over < 0)
            return ff_format_error(err, len, FF_ENOMEM, "out of memory reading %s", path);
        if (over > 0)
            return ff_format_error(err, len, FF_EINVAL,
                                   "%s already prunes %lld more weights than --sparsity %g asks "
                                   "(%s): pruning only adds; ask for at least its sparsity",
                                   path, (long long)over, o->sparsity,
                                   o->prune.per_layer ? "per layer" : "global");
    }
    int64_t cand = 0, pruned = 0;
    if ((rc = ff_prune(g, canon, &o->prune, keep, &cand, &pruned, err, len)))
        return rc;
    for (size_t i = 0; i < n; i++)
        if (!keep[i])
            canon[i] = 0.0f;
    printf("pruned %lld of %lld candidate weights (%.6f; %s%s)\n", (long long)pruned,
           (long long)cand, cand ? (double)pruned / (double)cand : 0.0,
           o->prune.per_layer ? "per layer" : "global",
           o->prune.embedding ? ", the embedding included" : "");
    /* the kept fraction of each candidate tensor */
    size_t off = 0;
    for (int i = 0; i < FF_GPT_NTENSORS; i++) {
        size_t sz = ff_gpt_tensor_size(g, i), k = 0;
        for (size_t j = off; j < off + sz; j++)
            k += keep[j];
        if (sz && k < sz)
            printf("  %-9s %zu of %zu kept (%.4f)\n", ff_gpt_tensor_name(i), k, sz,
                   (double)k / (double)sz);
        off += sz;
    }
    fflush(stdout);
    return FF_OK;
}

int cmd_prune(int argc, char **argv)
{
    prune_opts o;
    memset(&o, 0, sizeof o);
    cli_run_opts_default(&o.run);
    ff_prune_opts_default(&o.prune);
    int code = parse(argc, argv, &o);
    if (code == -1) {
        cli_print("%s%s", help_prune, cli_run_help);
        return CLI_OK;
    }
    if (code != CLI_OK)
        return code;
    ff_ctx *ctx;
    ff_grid *grid;
    if (cli_setup(&o.run, &ctx, &grid) != CLI_OK)
        return CLI_FAIL;
    ff_gpt_config cfg;
    memset(&cfg, 0, sizeof cfg);
    ff_gpt *g = NULL;
    float *canon = NULL;
    unsigned char *keep = NULL;
    int rank = ff_ctx_rank(ctx);
    /* the outputs (the checkpoint and its mask beside it) before the work */
    char mask_path[4200];
    int rc = FF_OK;
    if (rank == 0 && ff_file_writable(o.out) != 0)
        rc = ff_ctx_set_error(ctx, FF_EIO, "cannot write '%s': %s", o.out, strerror(errno));
    else if (rank == 0 && (ff_mask_path(o.out, mask_path, sizeof mask_path) != FF_OK ||
                           ff_file_writable(mask_path) != 0))
        rc = ff_ctx_set_error(ctx, FF_EIO, "cannot write the mask beside '%s'", o.out);
    rc = ff_ctx_agree(ctx, rc);
    if (rc == FF_OK)
        rc = ff_gpt_read_config(ctx, o.in, &cfg);
    if (rc == FF_OK) {
        ff_gpt_opts go;
        ff_gpt_opts_default(&go);
        ff_dims s = ff_grid_shape(grid);
        rc = ff_gpt_create(grid, &cfg, &go, s.z * s.d, 1, &g);
    }
    if (rc == FF_OK)
        rc = ff_gpt_load(g, o.in);
    if (rc == FF_OK) {
        size_t n = ff_gpt_canonical_size(g);
        int local = FF_OK;
        if (rank == 0 &&
            (!(canon = malloc((n ? n : 1) * sizeof *canon)) || !(keep = malloc(n ? n : 1))))
            local = ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory for the parameters");
        rc = ff_ctx_agree(ctx, local);
    }
    if (rc == FF_OK)
        rc = ff_gpt_gather(g, FF_GPT_PARAMS, canon, 0);
    if (rc == FF_OK) {
        char err[512] = "";
        int local = rank == 0 ? prune_root(g, &o, canon, keep, err, sizeof err) : FF_OK;
        if (local)
            ff_ctx_set_error(ctx, local, "%s", err);
        rc = ff_ctx_agree(ctx, local);
    }
    if (rc == FF_OK)
        rc = ff_gpt_scatter(g, FF_GPT_PARAMS, canon, 0);
    if (rc == FF_OK)
        rc = ff_gpt_save(g, FF_GPT_PARAMS, o.out);
    if (rc == FF_OK) { /* the mask once its checkpoint is there */
        char path[4200], err[512] = "";
        int local = FF_OK;
        if (rank == 0 && ff_mask_path(o.out, path, sizeof path) != FF_OK)
            local = ff_format_error(err, sizeof err, FF_EINVAL, "--out is too long");
        else if (rank == 0)
            local = ff_mask_write(g, path, keep, &o.prune, err, sizeof err);
        if (local)
            ff_ctx_set_error(ctx, local, "%s", err);
        if ((rc = ff_ctx_agree(ctx, local)) == FF_OK)
            cli_print("wrote %s and %s\n", o.out, path);
    }
    if (rc)
        cli_error("%s", ff_ctx_error(ctx));
    free(canon);
    free(keep);
    ff_gpt_destroy(g);
    return cli_teardown(&o.run, ctx, grid, rc ? CLI_FAIL : CLI_OK);
}
