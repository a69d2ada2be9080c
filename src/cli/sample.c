/* fourfold sample and fourfold eval: a checkpoint's text and its loss, on
 * any grid (the model's shape comes from the checkpoint's header). Text
 * for a model of another vocabulary than bytes goes through its BPE
 * vocabulary (include/fourfold/bpe.h): --bpe DIR, or found beside the
 * checkpoint or in scripts/setup.sh gpt2-vocab's cache. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "fourfold/image.h" /* FF_FASHION_MNIST_TEST */

/* Prints token t of a sequence: its bytes through the vocabulary bpe, or
 * the byte itself for the byte-level vocabulary (end-of-text as a newline
 * in both), else the token id. */
static void put_token(const ff_bpe *bpe, int V, int32_t t)
{
    size_t len;
    const unsigned char *bytes = bpe && t != ff_bpe_eot(bpe) ? ff_bpe_token(bpe, t, &len) : NULL;
    if (bytes)
        fwrite(bytes, 1, len, stdout);
    else if (bpe || V == FF_BYTE_VOCAB)
        putchar(bpe || t == FF_BYTE_EOT ? '\n' : (int)t);
    else
        printf("%d ", (int)t);
}

int cli_vocab_find(int V, const char *const *folders, int nfolders, ff_bpe **out)
{
    *out = NULL;
    const char *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[4200], file[4300];
    for (int i = 0; i <= nfolders && !*out; i++) {
        if (i < nfolders)
            snprintf(dir, sizeof dir, "%s", folders[i]);
        else if (cache && *cache)
            snprintf(dir, sizeof dir, "%s/fourfold/gpt2", cache);
        else if (home && *home)
            snprintf(dir, sizeof dir, "%s/.cache/fourfold/gpt2", home);
        else
            break;
        snprintf(file, sizeof file, "%s/encoder.json", dir);
        int has = access(file, R_OK) == 0;
        snprintf(file, sizeof file, "%s/gpt2_tokenizer.bin", dir);
        has = has || access(file, R_OK) == 0;
        char err[512];
        if (has && ff_bpe_load(dir, out, err, sizeof err) == FF_OK &&
            ff_bpe_vocab_size(*out) != V) {
            ff_bpe_destroy(*out);
            *out = NULL;
        }
    }
    return *out != NULL;
}

int cli_generate(ff_gpt *g, const int32_t *prompt, int prompt_len, long n, const ff_sampler *s,
                 int show)
{
    /* only rank 0 prints; `train --sample` looks for a vocabulary in the cache */
    ff_bpe *bpe = NULL;
    int V = ff_gpt_get_config(g).V;
    if (cli_world_rank() == 0 && show > 0 && V != FF_BYTE_VOCAB &&
        !cli_vocab_find(V, NULL, 0, &bpe))
        cli_print("note: token ids: no vocabulary of %d tokens found (scripts/setup.sh "
                  "gpt2-vocab fetches GPT-2's)\n",
                  V);
    int rc = cli_generate_text(g, bpe, prompt, prompt_len, n, s, show);
    ff_bpe_destroy(bpe);
    return rc;
}

int cli_generate_text(ff_gpt *g, const ff_bpe *bpe, const int32_t *prompt, int prompt_len, long n,
                      const ff_sampler *s, int show)
{
    ff_gpt_config cfg = ff_gpt_get_config(g);
    int first, count;
    ff_gpt_local_sequences(g, &first, &count);
    int T;
    {
        int64_t rows, cols;
        ff_gpt_logits(g, &rows, &cols);
        T = (int)(rows / (count ? count : 1));
    }
    int32_t *ctxt = malloc((size_t)count * T * sizeof *ctxt);
    int32_t *next = malloc((size_t)count * sizeof *next);
    int32_t *out = malloc((size_t)count * (size_t)n * sizeof *out);
    int world, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    ff_ctx *ctx = ff_gpt_ctx(g);
    int rc = ff_ctx_agree(
        ctx, ctxt && next && out ? FF_OK
                                 : ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory for sampling"));
    /* every sequence: end-of-text, then the prompt (its last T-1 tokens) */
    int len = 0;
    if (rc == FF_OK) {
        int skip = prompt_len > T - 1 ? prompt_len - (T - 1) : 0;
        for (int j = 0; j < count; j++) {
            int32_t *c = ctxt + (size_t)j * T;
            for (int t = 0; t < T; t++)
                c[t] = cfg.V - 1;
            for (int t = skip; t < prompt_len; t++)
                c[1 + t - skip] = prompt[t];
        }
        len = 1 + prompt_len - skip;
    }
    const int printer = rank == 0 && first == 0 && show > 0;
    for (long i = 0; rc == FF_OK && i < n; i++) {
        if ((rc = ff_gpt_sample_next(g, ctxt, len - 1, s, (uint64_t)i, next)))
            break;
        for (int j = 0; j < count; j++) {
            int32_t *c = ctxt + (size_t)j * T;
            if (len == T) /* a full window slides by one */
                memmove(c, c + 1, (size_t)(T - 1) * sizeof *c);
            c[len == T ? T - 1 : len] = next[j];
            out[(size_t)j * n + i] = next[j];
        }
        if (len < T)
            len++;
        if (printer) {
            put_token(bpe, cfg.V, next[0]);
            fflush(stdout);
        }
    }
    if (printer)
        putchar('\n');
    /* further samples (held by other ranks) are printed at the end */
    if (rc == FF_OK && show > 1 && (double)count * n * world > INT32_MAX)
        rc = ff_ctx_set_error(ctx, FF_EINVAL, "too many samples to print (%d x %ld tokens)", show,
                              n);
    int *firsts = NULL;
    int32_t *gathered = NULL;
    if (rc == FF_OK && show > 1) {
        if (rank == 0) {
            firsts = malloc((size_t)world * sizeof *firsts);
            gathered = malloc((size_t)world * count * (size_t)n * sizeof *gathered);
        }
        rc = ff_ctx_agree(ctx, rank != 0 || (firsts && gathered)
                                   ? FF_OK
                                   : ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory for samples"));
    }
    if (rc == FF_OK && show > 1) {
        MPI_Gather(&first, 1, MPI_INT, firsts, 1, MPI_INT, 0, MPI_COMM_WORLD);
        MPI_Gather(out, (int)(count * n), MPI_INT32_T, gathered, (int)(count * n), MPI_INT32_T, 0,
                   MPI_COMM_WORLD);
        for (int seq = 1; rank == 0 && seq < show; seq++)
            for (int r = 0; r < world; r++)
                if (seq >= firsts[r] && seq < firsts[r] + count) {
                    printf("---- sample %d\n", seq);
                    for (long i = 0; i < n; i++)
                        put_token(bpe, cfg.V,
                                  gathered[((size_t)r * count + seq - firsts[r]) * n + i]);
                    putchar('\n');
                    break;
                }
        fflush(stdout);
    }
    free(firsts);
    free(gathered);
    free(ctxt);
    free(next);
    free(out);
    return rc;
}

typedef struct {
    cli_run_opts run;
    const char *checkpoint, *prompt, *data, *bpe, *png;
    long tokens, samples, seq, batch, batches, seed, top_k;
    long sample_steps;                   /* --png: reverse steps; 0: the default */
    const char *unet_sampler;            /* --png: ddpm or ddim; NULL: ddpm */
    int samples_set;                     /* --samples given (--png's default is 16) */
    double temperature, capacity_factor; /* capacity_factor 0: the checkpoint's */
    ff_precision precision;
    ff_bf16_products bf16_products;
} sample_opts;

static const char help_sample[] =
    "usage: mpirun -np N fourfold sample --checkpoint FILE [options]\n\n"
    "Generates text from an llm.c gpt2_*.bin v3 checkpoint (fourfold's or llm.c's), or\n"
    "fourfold's mixture-of-experts checkpoint, on\n"
    "any grid; the draws depend on the seed, not the grid (docs/train.md). A byte-level model\n"
    "(vocabulary 257) prints text, and so does a model with its BPE vocabulary (GPT-2's:\n"
    "--bpe DIR, or found beside the checkpoint or in ~/.cache/fourfold/gpt2, where\n"
    "scripts/setup.sh gpt2-vocab puts it); without one, token ids.\n\n"
    "options:\n"
    "  --checkpoint FILE  the model (e.g. out/model_00000200.bin)\n"
    "  --png FILE         a U-Net checkpoint (fourfold train --model unet-...): --samples\n"
    "                     images (default 16) of its reverse process as a PNG grid\n"
    "  --sample-steps K   with --png: K of the model's T reverse steps (improved DDPM's\n"
    "                     respacing; default 100, or T if less)\n"
    "  --sampler S        with --png: ddpm (improved DDPM's, default) or ddim (DDIM,\n"
    "                     eta = 0: no noise after x_T; docs/unet.md)\n"
    "  --prompt TEXT      text to continue (default none); a BPE model encodes it with its\n"
    "                     vocabulary's encoder.json and vocab.bpe\n"
    "  --bpe DIR          the vocabulary: GPT-2's encoder.json and vocab.bpe, or llm.c's\n"
    "                     gpt2_tokenizer.bin (decoding only); its size must be the model's\n"
    "  --tokens N         tokens to generate (default 256)\n"
    "  --temperature F    0 = greedy (default 0.8)\n"
    "  --top-k N          draw among the N likeliest, 0 = all (default 40)\n"
    "  --samples N        sequences to print (default 1)\n"
    "  --seq N            context window (default: the model's positions)\n"
    "  --seed N           (default 1337)\n"
    "  --capacity-factor F  an MoE model's expert capacity (default: the checkpoint's;\n"
    "                     docs/moe.md)\n"
    "  --precision P      fp32 or bf16-mixed: bf16 products (default fp32; docs/design.md)\n"
    "  --bf16-products P  emulated, onednn or auto (default; docs/design.md §13)\n";

static const char help_eval[] =
    "usage: mpirun -np N fourfold eval --checkpoint FILE --data GLOB [options]\n"
    "       mpirun -np N fourfold eval --checkpoint FILE --prompt TEXT [options]\n"
    "       mpirun -np N fourfold eval --checkpoint UNET_FILE [--data IDX] [options]\n\n"
    "The mean cross-entropy loss of a checkpoint on the first batches of token\n"
    "shards, or on one text, on any grid. A U-Net checkpoint (fourfold train --model\n"
    "unet-...): its run's validation loss (the DDPM objective with the run's draws) on\n"
    "--batches batches spread over test images (--data IDX; default Fashion-MNIST's).\n\n"
    "options:\n"
    "  --checkpoint FILE  the model\n"
    "  --data GLOB        token shards (llm.c .bin); a U-Net's: an IDX image file\n"
    "  --prompt TEXT      instead: the loss of predicting TEXT's tokens after end-of-text\n"
    "                     (a BPE model encodes it with its vocabulary, as sample does)\n"
    "  --bpe DIR          the vocabulary (as sample's; default: beside the checkpoint, or in\n"
    "                     ~/.cache/fourfold/gpt2); its size must be the model's\n"
    "  --batch N          sequences per batch, whole grid (default: Gz*Gd); a U-Net's:\n"
    "                     images (default: its run's batch)\n"
    "  --seq N            tokens per sequence (default: the model's positions)\n"
    "  --batches N        batches averaged (default 1)\n"
    "  --capacity-factor F  an MoE model's expert capacity (default: the checkpoint's;\n"
    "                     docs/moe.md)\n"
    "  --precision P      fp32 or bf16-mixed: bf16 products (default fp32; docs/design.md)\n"
    "  --bf16-products P  emulated, onednn or auto (default; docs/design.md §13)\n";

/* Returns CLI_OK, CLI_USAGE, or -1 for --help. */
static int parse(int argc, char **argv, sample_opts *o, const char *command)
{
    cli_args a;
    cli_args_init(&a, argc, argv);
    int bad = 0;
    while (!bad && cli_next(&a)) {
        const char *v;
        if (cli_run_option(&a, &o->run, &bad))
            continue;
        if (!a.name)
            return cli_unknown(&a, command);
        if (cli_is(&a, "help"))
            return -1;
        else if (cli_is(&a, "checkpoint"))
            bad = !(o->checkpoint = cli_value(&a));
        else if (cli_is(&a, "png") && !strcmp(command, "sample"))
            bad = !(o->png = cli_value(&a));
        else if (cli_is(&a, "sample-steps") && !strcmp(command, "sample"))
            bad = !(v = cli_value(&a)) ||
                  cli_parse_int("sample-steps", v, 1, 0x7fffffffL, &o->sample_steps);
        else if (cli_is(&a, "sampler") && !strcmp(command, "sample")) {
            bad = !(o->unet_sampler = cli_value(&a));
            if (!bad && strcmp(o->unet_sampler, "ddpm") && strcmp(o->unet_sampler, "ddim")) {
                cli_error("--sampler %s: ddpm or ddim", o->unet_sampler);
                bad = 1;
            }
        } else if (cli_is(&a, "prompt"))
            bad = !(o->prompt = cli_value(&a));
        else if (cli_is(&a, "data"))
            bad = !(o->data = cli_value(&a));
        else if (cli_is(&a, "bpe"))
            bad = !(o->bpe = cli_value(&a));
        else if (cli_is(&a, "tokens"))
            bad = !(v = cli_value(&a)) || cli_parse_int("tokens", v, 1, 1 << 24, &o->tokens);
        else if (cli_is(&a, "samples")) {
            bad = !(v = cli_value(&a)) || cli_parse_int("samples", v, 1, 1 << 16, &o->samples);
            o->samples_set = 1;
        } else if (cli_is(&a, "seq"))
            bad = !(v = cli_value(&a)) || cli_parse_int("seq", v, 1, 1 << 20, &o->seq);
        else if (cli_is(&a, "batch"))
            bad = !(v = cli_value(&a)) || cli_parse_int("batch", v, 1, 1 << 24, &o->batch);
        else if (cli_is(&a, "batches"))
            bad = !(v = cli_value(&a)) || cli_parse_int("batches", v, 1, 1 << 24, &o->batches);
        else if (cli_is(&a, "seed"))
            bad = !(v = cli_value(&a)) || cli_parse_int("seed", v, 0, 0x7fffffffL, &o->seed);
        else if (cli_is(&a, "capacity-factor"))
            bad = !(v = cli_value(&a)) ||
                  cli_parse_double("capacity-factor", v, 1e-6, 1e6, &o->capacity_factor);
        else if (cli_is(&a, "top-k"))
            bad = !(v = cli_value(&a)) || cli_parse_int("top-k", v, 0, 1 << 24, &o->top_k);
        else if (cli_is(&a, "temperature"))
            bad =
                !(v = cli_value(&a)) || cli_parse_double("temperature", v, 0, 1e6, &o->temperature);
        else if (cli_is(&a, "precision"))
            bad = !(v = cli_value(&a)) || cli_parse_precision(v, &o->precision);
        else if (cli_is(&a, "bf16-products"))
            bad = !(v = cli_value(&a)) || cli_parse_bf16_products(v, &o->bf16_products);
        else
            return cli_unknown(&a, command);
    }
    if (bad)
        return CLI_USAGE;
    if (!o->checkpoint) {
        cli_error("%s needs --checkpoint FILE", command);
        return CLI_USAGE;
    }
    if (!strcmp(command, "eval") && o->data && o->prompt) {
        cli_error("eval takes --data GLOB or --prompt TEXT, not both");
        return CLI_USAGE;
    }
    return CLI_OK;
}

/* The folder of a path ("." without one), for looking beside it. */
static void folder_of(const char *path, char *out, size_t len)
{
    const char *slash = strrchr(path, '/');
    snprintf(out, len, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (!out[0])
        snprintf(out, len, "/");
}

/* On rank 0: the vocabulary (--bpe, else, when text is to be printed or
 * encoded (`find`) and the model is not byte-level, found beside the
 * checkpoint or in the cache), checked against the model's V,
 * and the prompt's tokens; the outcome agreed, the tokens sent to every
 * rank (*prompt malloc'd there too). Collective. */
static int prepare_text(ff_ctx *ctx, const sample_opts *o, int V, int find, ff_bpe **bpe,
                        int32_t **prompt, int *n)
{
    int rc = FF_OK;
    long len = 0;
    *bpe = NULL;
    *prompt = NULL;
    *n = 0;
    if (ff_ctx_rank(ctx) == 0) {
        char err[1024], here[4200];
        const char *folders[1] = {here};
        folder_of(o->checkpoint, here, sizeof here);
        if (o->bpe && ff_bpe_load(o->bpe, bpe, err, sizeof err) != FF_OK)
            rc = ff_ctx_set_error(ctx, FF_EIO, "--bpe: %s", err);
        else if (o->bpe && ff_bpe_vocab_size(*bpe) != V)
            rc = ff_ctx_set_error(
                ctx, FF_EINVAL, "the vocabulary %s has %d tokens, but the model '%s' has %d",
                ff_bpe_source(*bpe), (int)ff_bpe_vocab_size(*bpe), o->checkpoint, V);
        else if (!o->bpe && V != FF_BYTE_VOCAB && find)
            cli_vocab_find(V, folders, 1, bpe);
        if (rc == FF_OK && o->prompt && *bpe && !ff_bpe_can_encode(*bpe))
            rc = ff_ctx_set_error(ctx, FF_EINVAL,
                                  "--prompt: %s decodes only; encoding needs GPT-2's encoder.json "
                                  "and vocab.bpe (scripts/setup.sh gpt2-vocab fetches them)",
                                  ff_bpe_source(*bpe));
        else if (rc == FF_OK && o->prompt && !*bpe && V != FF_BYTE_VOCAB)
            rc = ff_ctx_set_error(ctx, FF_EINVAL,
                                  "--prompt needs the vocabulary of this model of %d tokens: "
                                  "--bpe DIR (scripts/setup.sh gpt2-vocab fetches GPT-2's into "
                                  "~/.cache/fourfold/gpt2)",
                                  V);
        size_t plen = o->prompt ? strlen(o->prompt) : 0;
        if (rc == FF_OK && o->prompt && !(*prompt = malloc((plen ? plen : 1) * sizeof **prompt)))
            rc = ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory");
        if (rc == FF_OK && o->prompt && *bpe) {
            size_t k = 0;
            int32_t *t = *prompt;
            if (ff_bpe_encode(*bpe, o->prompt, plen, t, &k) != FF_OK)
                rc = ff_ctx_set_error(ctx, FF_EINVAL, "--prompt: %s", ff_bpe_error(*bpe));
            len = (long)k;
        } else if (rc == FF_OK && o->prompt) {
            for (size_t i = 0; i < plen; i++)
                (*prompt)[i] = (unsigned char)o->prompt[i];
            len = (long)plen;
        }
    }
    if ((rc = ff_ctx_agree(ctx, rc)) == FF_OK && o->prompt) {
        MPI_Bcast(&len, 1, MPI_LONG, 0, ff_ctx_comm(ctx));
        if (ff_ctx_rank(ctx) != 0 && !(*prompt = malloc((len ? (size_t)len : 1) * sizeof **prompt)))
            rc = ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory");
        if ((rc = ff_ctx_agree(ctx, rc)) == FF_OK)
            MPI_Bcast(*prompt, (int)len, MPI_INT32_T, 0, ff_ctx_comm(ctx));
        *n = (int)len;
    }
    return rc;
}

/* The checkpoint's model on the grid, for micro-batches of `batch`
 * sequences (0: one per (z, d) pair) of T tokens (*T: --seq, or if 0 all
 * positions; set). */
static int load_model(ff_ctx *ctx, ff_grid *grid, const sample_opts *o, const ff_gpt_config *c,
                      long batch, ff_gpt **g, int *T)
{
    ff_gpt_config cfg = *c;
    int rc;
    if (!*T)
        *T = o->seq ? (int)o->seq : cfg.maxT;
    if (o->capacity_factor > 0 && cfg.experts == 0)
        return ff_ctx_agree(ctx, ff_ctx_set_error(ctx, FF_EINVAL,
                                                  "--capacity-factor is for a model with experts; "
                                                  "'%s' is dense",
                                                  o->checkpoint));
    if (o->capacity_factor > 0)
        cfg.capacity_factor = (float)o->capacity_factor;
    if (*T > cfg.maxT)
        return ff_ctx_agree(ctx,
                            ff_ctx_set_error(ctx, FF_EINVAL,
                                             "--seq %d is longer than the %d positions of '%s'", *T,
                                             cfg.maxT, o->checkpoint));
    ff_gpt_opts go;
    ff_gpt_opts_default(&go);
    go.precision = o->precision;
    go.bf16_products = o->bf16_products;
    if ((rc = ff_gpt_create(grid, &cfg, &go, (int)batch, *T, g)))
        return rc;
    return ff_gpt_load(*g, o->checkpoint);
}

/* fourfold eval of a U-Net checkpoint (docs/unet.md, "Training"): its
 * run's validation loss on test images. */
static int eval_unet(ff_ctx *ctx, ff_grid *grid, const sample_opts *o)
{
    const char *gpt_only = o->prompt                                   ? "--prompt"
                           : o->seq                                    ? "--seq"
                           : o->bpe                                    ? "--bpe"
                           : o->capacity_factor > 0                    ? "--capacity-factor"
                           : o->precision != FF_PRECISION_FP32         ? "--precision bf16-mixed"
                           : o->bf16_products != FF_BF16_PRODUCTS_AUTO ? "--bf16-products"
                                                                       : NULL;
    if (gpt_only) { /* the same on every rank */
        cli_error("%s is a GPT's option; '%s' is a U-Net checkpoint (its eval takes --data "
                  "IDX, --batch, --batches)",
                  gpt_only, o->checkpoint);
        return CLI_FAIL;
    }
    float loss = 0;
    int64_t batch = 0;
    int rc =
        ff_net_file_eval(grid, o->checkpoint, o->data, o->batch, (int)o->batches, &loss, &batch);
    if (rc) {
        cli_error("%s", ff_ctx_error(ctx));
        return CLI_FAIL;
    }
    ff_dims s = ff_grid_shape(grid);
    cli_print("loss %.9g (the DDPM objective on %ld batches of %lld images of %s, grid "
              "%dx%dx%dx%d, fp32)\n",
              loss, o->batches, (long long)batch, o->data ? o->data : FF_FASHION_MNIST_TEST, s.x,
              s.y, s.z, s.d);
    return CLI_OK;
}

static int run(int argc, char **argv, const char *command)
{
    sample_opts o;
    memset(&o, 0, sizeof o);
    cli_run_opts_default(&o.run);
    o.tokens = 256;
    o.samples = 1;
    o.batches = 1;
    o.seed = 1337;
    o.top_k = 40;
    o.temperature = 0.8;
    int eval = !strcmp(command, "eval");
    char products[160]; /* (the eval lines' bf16 products) */
    int code = parse(argc, argv, &o, command);
    if (code == -1) {
        cli_print("%s%s", eval ? help_eval : help_sample, cli_run_help);
        return CLI_OK;
    }
    if (code != CLI_OK)
        return code;
    if ((o.sample_steps || o.unet_sampler) && !o.png) {
        cli_error("%s is for a U-Net's images (--png FILE)",
                  o.sample_steps ? "--sample-steps" : "--sampler");
        return CLI_USAGE;
    }
    ff_ctx *ctx;
    ff_grid *grid;
    if (cli_setup(&o.run, &ctx, &grid) != CLI_OK)
        return CLI_FAIL;
    if (eval && ff_net_file_kind(ctx, o.checkpoint) == FF_NET_UNET)
        return cli_teardown(&o.run, ctx, grid, eval_unet(ctx, grid, &o));
    if (eval && !o.data && !o.prompt) {
        cli_error("eval needs --data GLOB (or --prompt TEXT)");
        return cli_teardown(&o.run, ctx, grid, CLI_USAGE);
    }
    ff_dims s = ff_grid_shape(grid);
    const long pairs = (long)s.z * s.d;
    if (o.png) { /* a U-Net's images (docs/unet.md) */
        long k = o.samples_set ? o.samples : 16;
        const int ddim = o.unet_sampler && !strcmp(o.unet_sampler, "ddim");
        int rc = ff_net_file_samples(grid, o.checkpoint, (k + pairs - 1) / pairs * pairs,
                                     (int)o.sample_steps, ddim ? FF_UNET_DDIM : FF_UNET_DDPM,
                                     (uint64_t)o.seed, o.png);
        if (rc == FF_OK)
            cli_print("wrote %s: %ld %s samples of %s\n", o.png, (k + pairs - 1) / pairs * pairs,
                      ddim ? "DDIM" : "DDPM", o.checkpoint);
        else
            cli_error("%s", ff_ctx_error(ctx));
        return cli_teardown(&o.run, ctx, grid, rc ? CLI_FAIL : CLI_OK);
    }
    long batch = eval ? (o.batch ? o.batch : pairs) : (o.samples + pairs - 1) / pairs * pairs;
    ff_gpt *g = NULL;
    ff_data *data = NULL;
    ff_bpe *bpe = NULL;
    int32_t *tok = NULL, *tgt = NULL, *prompt = NULL;
    int T = 0, n = 0;
    ff_gpt_config cfg0;
    memset(&cfg0, 0, sizeof cfg0);
    int rc = ff_gpt_read_config(ctx, o.checkpoint, &cfg0);
    if (rc == FF_OK)
        rc = prepare_text(ctx, &o, cfg0.V, !eval || o.prompt, &bpe, &prompt, &n);
    if (rc == FF_OK && eval && o.prompt) { /* one sequence: the text's n tokens after EOT */
        if (n < 1 || n > cfg0.maxT)
            rc = ff_ctx_set_error(ctx, FF_EINVAL,
                                  "--prompt: the text is %d tokens; the model predicts 1 to %d", n,
                                  cfg0.maxT); /* the same on every rank */
        T = n;
        batch = pairs;
    }
    if (rc == FF_OK)
        rc = load_model(ctx, grid, &o, &cfg0, batch, &g, &T);
    if (rc == FF_OK && eval && o.prompt) {
        int first, count;
        ff_gpt_local_sequences(g, &first, &count);
        tok = malloc((size_t)count * T * sizeof *tok);
        tgt = malloc((size_t)count * T * sizeof *tgt);
        rc = ff_ctx_agree(ctx,
                          tok && tgt ? FF_OK : ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory"));
        for (int j = 0; rc == FF_OK && j < count; j++)
            for (int t = 0; t < T; t++) {
                tok[(size_t)j * T + t] = t ? prompt[t - 1] : cfg0.V - 1;
                tgt[(size_t)j * T + t] = prompt[t];
            }
        float l = 0;
        if (rc == FF_OK && (rc = ff_gpt_eval(g, tok, tgt, &l)) == FF_OK)
            cli_print("loss %.9g on the %d tokens of the text (grid %dx%dx%dx%d, %s%s)\n", l, T,
                      s.x, s.y, s.z, s.d, ff_precision_name(o.precision),
                      cli_bf16_products(g, products, sizeof products));
    } else if (rc == FF_OK && eval) {
        ff_gpt_config cfg = ff_gpt_get_config(g);
        int first, count;
        ff_gpt_local_sequences(g, &first, &count);
        tok = malloc((size_t)count * T * sizeof *tok);
        tgt = malloc((size_t)count * T * sizeof *tgt);
        rc = ff_ctx_agree(ctx,
                          tok && tgt ? FF_OK : ff_ctx_set_error(ctx, FF_ENOMEM, "out of memory"));
        if (rc == FF_OK)
            rc = ff_data_open(ctx, o.data, batch * T + 1, &data);
        double sum = 0;
        for (long i = 0; rc == FF_OK && i < o.batches; i++) {
            float l = 0;
            rc = ff_ctx_agree(ctx,
                              ff_data_next(data, 1, (int)batch, T, first, count, cfg.V, tok, tgt));
            if (rc == FF_OK && (rc = ff_gpt_eval(g, tok, tgt, &l)) == FF_OK)
                sum += l;
        }
        if (rc == FF_OK && !isfinite(sum))
            rc = ff_ctx_set_error(ctx, FF_ENUMERIC, "the loss of '%s' is %s", o.checkpoint,
                                  isnan(sum) ? "NaN" : "infinite"); /* the same on every rank */
        if (rc == FF_OK)
            cli_print("loss %.9g (%ld batches of %ld x %d tokens, grid %dx%dx%dx%d, %d "
                      "stage%s, %s%s)\n",
                      sum / (double)o.batches, o.batches, batch, T, s.x, s.y, s.z, s.d,
                      ff_grid_stages(grid), ff_grid_stages(grid) > 1 ? "s" : "",
                      ff_precision_name(o.precision),
                      cli_bf16_products(g, products, sizeof products));
    } else if (rc == FF_OK) {
        ff_sampler smp = {(float)o.temperature, (int)o.top_k, (uint64_t)o.seed};
        if (!bpe && cfg0.V != FF_BYTE_VOCAB)
            cli_print("note: token ids: no vocabulary of %d tokens found (--bpe DIR; "
                      "scripts/setup.sh gpt2-vocab fetches GPT-2's)\n",
                      cfg0.V);
        if (o.prompt)
            cli_print("%s", o.prompt);
        rc = cli_generate_text(g, bpe, prompt, n, o.tokens, &smp, (int)o.samples);
    }
    if (rc)
        cli_error("%s", ff_ctx_error(ctx));
    free(tok);
    free(tgt);
    free(prompt);
    ff_bpe_destroy(bpe);
    ff_data_close(data);
    ff_gpt_destroy(g);
    return cli_teardown(&o.run, ctx, grid, rc ? CLI_FAIL : CLI_OK);
}

int cmd_sample(int argc, char **argv) { return run(argc, argv, "sample"); }
int cmd_eval(int argc, char **argv) { return run(argc, argv, "eval"); }
