/* fourfold: the command-line program. Dispatches to subcommands; holds the
 * option parsing and error reporting they share. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "util/crc32.h"
#include "util/file.h"

/* ---- output ---- */

int cli_world_rank(void)
{
    int init = 0, fin = 0, rank = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin)
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

void cli_error(const char *fmt, ...)
{
    if (cli_world_rank() != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("fourfold: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
}

void cli_print(const char *fmt, ...)
{
    if (cli_world_rank() != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fflush(stdout);
}

int cli_quiet_process(void)
{
    /* launched by mpirun/srun without MPI_Init: only launcher rank 0 works */
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                       "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return strcmp(v, "0") != 0;
    }
    return 0;
}

/* ---- option parsing ---- */

void cli_args_init(cli_args *a, int argc, char **argv)
{
    memset(a, 0, sizeof *a);
    a->argc = argc;
    a->argv = argv;
    a->i = 0;
}

int cli_next(cli_args *a)
{
    a->name = a->value = a->inline_value = NULL;
    if (a->i >= a->argc)
        return 0;
    char *arg = a->argv[a->i++];
    if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
        a->value = arg;
        return 1;
    }
    a->name = arg + 2;
    char *eq = strchr(arg, '=');
    if (eq) {
        /* name is compared with cli_is() up to the '=' */
        a->inline_value = eq + 1;
    }
    return 1;
}

int cli_is(const cli_args *a, const char *name)
{
    if (!a->name)
        return 0;
    size_t n = strlen(name);
    return strncmp(a->name, name, n) == 0 && (a->name[n] == '\0' || a->name[n] == '=');
}

const char *cli_value(cli_args *a)
{
    if (a->inline_value)
        return a->value = a->inline_value;
    if (a->i >= a->argc) {
        cli_error("option --%s needs a value", a->name);
        return NULL;
    }
    return a->value = a->argv[a->i++];
}

int cli_unknown(const cli_args *a, const char *command)
{
    if (a->name)
        cli_error("unknown option --%s for '%s' (see fourfold %s --help)", a->name, command,
                  command);
    else
        cli_error("unexpected argument '%s' for '%s' (see fourfold %s --help)", a->value, command,
                  command);
    return CLI_USAGE;
}

int cli_parse_int(const char *opt, const char *text, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        cli_error("--%s %s: expected an integer from %ld to %ld", opt, text, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_stage_layers(const char *text, int stages, int *out, int cap)
{
    int n = 0;
    const char *p = text;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > 100000 || (*end && *end != ',') || n == cap) {
            cli_error("--stage-layers %s: expected the blocks of each stage, positive numbers "
                      "separated by commas (e.g. 3,3,2)",
                      text);
            return -1;
        }
        out[n++] = (int)v;
        if (!*end)
            break;
        p = end + 1;
    }
    if (n != stages) {
        cli_error("--stage-layers %s gives %d stages, but --stages is %d", text, n, stages);
        return -1;
    }
    return 0;
}

int cli_parse_double(const char *opt, const char *text, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= lo && v <= hi)) {
        cli_error("--%s %s: expected a number from %g to %g", opt, text, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static const char *const progress_names[] = {"wait", "poll", "thread"};
static const ff_progress_mode progress_modes[] = {FF_PROGRESS_WAIT, FF_PROGRESS_POLL,
                                                  FF_PROGRESS_THREAD};

const char *cli_progress_name(int mode)
{
    for (int i = 0; i < 3; i++)
        if ((int)progress_modes[i] == mode)
            return progress_names[i];
    return "?";
}

int cli_parse_progress(const char *text, ff_progress_mode *out)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(text, progress_names[i])) {
            *out = progress_modes[i];
            return 0;
        }
    cli_error("--progress %s: expected wait, poll or thread", text);
    return -1;
}

int cli_parse_precision(const char *text, ff_precision *out)
{
    if (ff_precision_parse(text, out) == FF_OK)
        return 0;
    cli_error("--precision %s: expected " FF_PRECISION_CHOICES, text);
    return -1;
}

int cli_parse_bf16_products(const char *text, ff_bf16_products *out)
{
    if (ff_bf16_products_parse(text, out) == FF_OK)
        return 0;
    cli_error("--bf16-products %s: expected " FF_BF16_PRODUCTS_CHOICES, text);
    return -1;
}

const char *cli_bf16_products(const ff_gpt *g, char *buf, size_t len)
{
    double onednn, blas;
    ff_bf16_products p = ff_gpt_bf16_products(g, &onednn, &blas);
    char timed[96] = "";
    if (onednn > 0 && blas > 0)
        snprintf(timed, sizeof timed, "; timed %.0f against %.0f GFLOP/s on rank 0", onednn * 1e-9,
                 blas * 1e-9);
    if (p == FF_BF16_PRODUCTS_ONEDNN)
        snprintf(buf, len, ", products on oneDNN's bf16 matmul%s", timed);
    else if (p == FF_BF16_PRODUCTS_EMULATED)
        snprintf(buf, len, ", products emulated on the BLAS%s", timed);
    else
        snprintf(buf, len, "%s", "");
    return buf;
}

int cli_parse_size(const char *opt, const char *text, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    double mult = 1;
    if (!errno && end != text) {
        if (!strcmp(end, "K") || !strcmp(end, "KiB") || !strcmp(end, "k"))
            mult = 1024;
        else if (!strcmp(end, "M") || !strcmp(end, "MiB"))
            mult = 1024.0 * 1024;
        else if (!strcmp(end, "G") || !strcmp(end, "GiB"))
            mult = 1024.0 * 1024 * 1024;
        else if (*end)
            mult = -1;
    }
    if (errno || end == text || mult < 0 || !(v >= 0) || v * mult > 1e15) {
        cli_error("--%s %s: expected a size such as 4096, 64K, 16MiB", opt, text);
        return -1;
    }
    *out = (size_t)(v * mult);
    return 0;
}

/* ---- options shared by grid commands ---- */

const char cli_run_help[] =
    "  --grid G          process grid Gx x Gy x Gz x Gd (e.g. 2x2x2x1) or a preset: serial, data,\n"
    "                    fsdp, hsdp[:Z], megatron[:X]  (default: data); with --stages,\n"
    "                    of the ranks of one stage\n"
    "  --stages P        pipeline stages (default 1): P copies of the grid, stage outermost;\n"
    "                    the job runs Gx*Gy*Gz*Gd*P ranks (docs/pipeline.md)\n"
    "  --progress M      how collectives advance during compute: wait, poll, thread\n"
    "                    (default: poll; see docs/overlap.md)\n"
    "  --poll-us N       minimum microseconds between polls (default 200)\n"
    "  --threads N       compute threads per rank: the BLAS's and the element-wise\n"
    "                    work's (default 1; the element-wise work's results do not\n"
    "                    depend on it, the products' only as the BLAS's kernels do)\n"
    "  --device D        where the model computes: cpu (default) or cuda (a build with\n"
    "                    -DFF_CUDA=ON; docs/cuda.md)\n"
    "  --trace FILE      write a Chrome-trace timeline (open in Perfetto)\n"
    "  --timeout S       abort the job when a rank waits more than S seconds for one\n"
    "                    collective (a stopped or hung peer; default: wait forever)\n";

void cli_run_opts_default(cli_run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->grid = "data";
    o->stages = 1;
    ff_ctx_options_default(&o->ctx);
    o->ctx.threads = 1;
}

int cli_run_option(cli_args *a, cli_run_opts *o, int *bad)
{
    const char *v;
    long n;
    double d;
    if (cli_is(a, "grid")) {
        if (!(v = cli_value(a)))
            return *bad = 1;
        o->grid = v;
    } else if (cli_is(a, "stages")) {
        if (!(v = cli_value(a)) || cli_parse_int("stages", v, 1, 1 << 20, &n))
            return *bad = 1;
        o->stages = (int)n;
    } else if (cli_is(a, "trace")) {
        if (!(v = cli_value(a)))
            return *bad = 1;
        o->trace = v;
    } else if (cli_is(a, "progress")) {
        if (!(v = cli_value(a)))
            return *bad = 1;
        if (cli_parse_progress(v, &o->ctx.progress))
            return *bad = 1;
    } else if (cli_is(a, "poll-us")) {
        if (!(v = cli_value(a)) || cli_parse_double("poll-us", v, 0, 1e7, &d))
            return *bad = 1;
        o->ctx.poll_interval_s = d * 1e-6;
    } else if (cli_is(a, "device")) {
        if (!(v = cli_value(a)))
            return *bad = 1;
        if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
            cli_error("--device %s: expected cpu or cuda", v);
            return *bad = 1;
        }
        o->ctx.device = v;
    } else if (cli_is(a, "timeout")) {
        if (!(v = cli_value(a)) || cli_parse_double("timeout", v, 1e-3, 1e9, &d))
            return *bad = 1;
        o->ctx.timeout_s = d;
    } else if (cli_is(a, "threads")) {
        if (!(v = cli_value(a)) || cli_parse_int("threads", v, 1, 1024, &n))
            return *bad = 1;
        o->ctx.threads = (int)n;
    } else {
        return 0;
    }
    return 1;
}

int cli_coll_model(ff_coll_model *m, char *err, size_t err_len)
{
    ff_coll_model_default(m);
    const char *path = getenv("FF_PROFILE");
    if (!path || !*path)
        return FF_OK;
    char why[512];
    int rc = ff_coll_model_read(path, m, why, sizeof why);
    if (rc != FF_OK)
        snprintf(err, err_len, "FF_PROFILE: %s", why);
    return rc;
}

int cli_ranks_per_node(MPI_Comm comm)
{
    MPI_Comm node;
    int local = 1, minimum = 1;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    MPI_Allreduce(&local, &minimum, 1, MPI_INT, MPI_MIN, comm);
    return minimum;
}

int cli_setup(const cli_run_opts *o, ff_ctx **pctx, ff_grid **pgrid)
{
    *pctx = NULL;
    *pgrid = NULL;
    ff_ctx *ctx;
    int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, &o->ctx);
    if (rc != FF_OK) {
        cli_error("%s", ff_ctx_error(ctx));
        ff_ctx_destroy(ctx);
        return CLI_FAIL;
    }
    int per_node = cli_ranks_per_node(ff_ctx_comm(ctx));
    ff_dims shape;
    char err[256];
    rc = ff_grid_parse_staged(o->grid, ff_ctx_size(ctx), o->stages, per_node, &shape, err,
                              sizeof err);
    /* the parse is deterministic, but agree anyway: a rank with a different
     * command line must not leave the others waiting */
    if (rc != FF_OK)
        ff_ctx_set_error(ctx, rc, "%s", err);
    rc = ff_ctx_agree(ctx, rc);
    ff_grid *grid = NULL;
    if (rc == FF_OK)
        rc = ff_grid_create_staged(ctx, shape, o->stages, &grid);
    /* the trace's file is written at the end: refused now if it cannot be */
    if (rc == FF_OK && o->trace)
        rc = ff_ctx_agree(ctx, ff_ctx_rank(ctx) == 0 && ff_file_writable(o->trace) != 0
                                   ? ff_ctx_set_error(ctx, FF_EIO, "cannot write trace %s: %s",
                                                      o->trace, strerror(errno))
                                   : FF_OK);
    if (rc == FF_OK && o->trace) {
        char label[96];
        ff_dims c = ff_grid_coords(grid);
        if (o->stages > 1)
            snprintf(label, sizeof label, "rank %d (stage %d, x=%d y=%d z=%d d=%d)",
                     ff_ctx_rank(ctx), ff_grid_stage(grid), c.x, c.y, c.z, c.d);
        else
            snprintf(label, sizeof label, "rank %d (x=%d y=%d z=%d d=%d)", ff_ctx_rank(ctx), c.x,
                     c.y, c.z, c.d);
        ff_trace_set_label(ctx, label);
        rc = ff_trace_enable(ctx);
    }
    if (rc != FF_OK) {
        cli_error("%s", ff_ctx_error(ctx));
        ff_grid_destroy(grid);
        ff_ctx_destroy(ctx);
        return CLI_FAIL;
    }
    *pctx = ctx;
    *pgrid = grid;
    return CLI_OK;
}

int cli_teardown(const cli_run_opts *o, ff_ctx *ctx, ff_grid *grid, int code)
{
    if (ctx && o->trace) {
        int rc = ff_trace_write(ctx, o->trace);
        if (rc != FF_OK) {
            cli_error("%s", ff_ctx_error(ctx));
            code = CLI_FAIL;
        } else {
            cli_print("trace written to %s (open it in https://ui.perfetto.dev)\n", o->trace);
        }
    }
    ff_grid_destroy(grid);
    ff_ctx_destroy(ctx);
    return code;
}

/* ---- dispatch ---- */

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"selftest", cmd_selftest, "check every collective on every group of a grid"},
    {"bench", cmd_bench, "collective algorithms, sgemm, machine profile (coll|gemm|profile|tune)"},
    {"train", cmd_train, "train a GPT on token shards; checkpoints, resume (any grid)"},
    {"sample", cmd_sample, "generate text from a checkpoint, on any grid"},
    {"eval", cmd_eval, "the mean loss of a checkpoint on token shards"},
    {"prune", cmd_prune, "magnitude-prune a checkpoint's weights; writes it and its mask"},
    {"tokenize", cmd_tokenize, "text files to byte-level token shards (no MPI)"},
    {"plan", cmd_plan, "rank every grid of a rank count by predicted step time (no MPI)"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "fourfold %s: 4D hybrid-parallel training of transformer language models\n\n"
            "usage: mpirun -np N fourfold COMMAND [options]   (fourfold COMMAND --help)\n\n"
            "commands:\n",
            FF_VERSION_STRING);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

static int wants_thread(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--progress=thread"))
            return 1;
        if (!strcmp(argv[i], "--progress") && i + 1 < argc && !strcmp(argv[i + 1], "thread"))
            return 1;
    }
    return 0;
}

/* Every rank must run the same command line: ranks given different options
 * (a different --model, --steps or --lr on one of them) would build other
 * models or stop at other steps and hang or diverge in silence. The ranks
 * compare the length and a CRC-32 of their arguments (argv[0] aside); only
 * where they differ does rank 0 gather the arguments to name the first that
 * differs. 1 if they agree. */
static int same_command_line(int argc, char **argv)
{
    int size, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (size == 1)
        return 1;
    size_t len = 0;
    for (int i = 1; i < argc; i++)
        len += strlen(argv[i]) + 1;
    char *mine = malloc(len + 1), *p = mine;
    for (int i = 1; mine && i < argc; i++) {
        size_t l = strlen(argv[i]) + 1;
        memcpy(p, argv[i], l);
        p += l;
    }
    /* length, checksum, and whether this rank could build its copy: the
     * minimum and maximum over the ranks (the last negated for MIN) */
    long long v[6] = {(long long)len, mine ? (long long)ff_crc32(0, mine, len) : -1, mine != NULL};
    v[3] = -v[0], v[4] = -v[1], v[5] = -v[2];
    MPI_Allreduce(MPI_IN_PLACE, v, 6, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    const int all_built = v[2] == 1, same = all_built && v[0] == -v[3] && v[1] == -v[4];
    if (same || !all_built || -v[3] >= INT32_MAX) {
        if (!same)
            cli_error(all_built ? "the ranks were given command lines of different lengths, one "
                                  "beyond 2 GB (every rank must run the same command)"
                                : "out of memory comparing the ranks' command lines");
        free(mine);
        return same;
    }
    /* they differ: rank 0 names the first argument that does */
    int n = (int)len, *lens = NULL, *offs = NULL;
    char *all = NULL;
    if (rank == 0) {
        lens = malloc((size_t)size * sizeof *lens);
        offs = malloc((size_t)size * sizeof *offs);
    }
    int ok = rank != 0 || (lens && offs);
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (ok) {
        MPI_Gather(&n, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD);
        long long total = 0;
        for (int r = 0; rank == 0 && r < size; r++)
            offs[r] = total < INT32_MAX ? (int)total : 0, total += lens[r];
        ok = rank != 0 || (total < INT32_MAX && (all = malloc((size_t)total + 1)));
        MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    if (ok)
        MPI_Gatherv(mine, n, MPI_CHAR, all, lens, offs, MPI_CHAR, 0, MPI_COMM_WORLD);
    for (int r = 1; rank == 0 && ok && r < size; r++) {
        if (lens[r] == n && !memcmp(all + offs[r], mine, (size_t)n))
            continue;
        const char *a = mine, *b = all + offs[r], *ea = mine + n, *eb = b + lens[r];
        int k = 1;
        while (a < ea && b < eb && !strcmp(a, b))
            a += strlen(a) + 1, b += strlen(b) + 1, k++;
        cli_error("the ranks were given different command lines: rank %d's argument %d is "
                  "'%s', rank 0's '%s' (every rank must run the same command)",
                  r, k, b < eb ? b : "(none)", a < ea ? a : "(none)");
        break;
    }
    if (!ok)
        cli_error("the ranks were given different command lines (every rank must run the same "
                  "command)");
    free(mine), free(lens), free(offs), free(all);
    return 0;
}

int main(int argc, char **argv)
{
    /* The planner is arithmetic only: it runs from a plain shell, without
     * initialising MPI (cli_error and cli_print then print unconditionally). */
    if (argc >= 2 && !strcmp(argv[1], "plan"))
        return cmd_plan(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "tokenize"))
        return cmd_tokenize(argc - 2, argv + 2);
    /* Before MPI: the BLAS's kernels, if it fell back to generic ones on
     * this CPU (src/blas.c; this process may be replaced by a new one). */
    ff_blas_reexec(argv);
    /* MPI first, so that every message below is printed once, by rank 0.
     * The progress thread calls MPI concurrently with the main thread; the
     * other modes need only the main thread in MPI. */
    int required = wants_thread(argc, argv) ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
    int provided;
    if (MPI_Init_thread(&argc, &argv, required, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "fourfold: error: MPI_Init_thread failed\n");
        return CLI_FAIL;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (!same_command_line(argc, argv)) {
        MPI_Finalize();
        return CLI_USAGE;
    }
    int code;
    const command *cmd = NULL;
    if (argc >= 2)
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (!strcmp(argv[1], commands[i].name))
                cmd = &commands[i];
    if (argc < 2) {
        if (cli_world_rank() == 0)
            usage(stderr);
        code = CLI_USAGE;
    } else if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (cli_world_rank() == 0)
            usage(stdout);
        code = CLI_OK;
    } else if (!strcmp(argv[1], "--version")) {
        cli_print("fourfold %s\n", FF_VERSION_STRING);
        code = CLI_OK;
    } else if (!cmd) {
        cli_error("unknown command '%s' (see fourfold --help)", argv[1]);
        code = CLI_USAGE;
    } else {
        code = cmd->run(argc - 2, argv + 2);
    }
    MPI_Finalize();
    return code;
}
