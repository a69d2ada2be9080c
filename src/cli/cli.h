/* Shared plumbing of the fourfold command-line program. */
#ifndef FF_CLI_H
#define FF_CLI_H

#include <stddef.h>

#include "fourfold/fourfold.h"

/* Exit codes: 0 success, 1 a failure at run time (on every rank), 2 a usage
 * error (bad option or value). */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* Prints "fourfold: error: ..." once (on rank 0 of MPI_COMM_WORLD, or
 * unconditionally if MPI is not initialised). */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints on rank 0 only (stdout). */
void cli_print(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cli_world_rank(void);
/* 1 in a process that mpirun or srun started as rank > 0 of a command that
 * runs without MPI (plan, tokenize): such a process should do nothing. */
int cli_quiet_process(void);

/* Command-line options as "--name value" or "--name=value". */
typedef struct {
    int argc;
    char **argv;
    int i;             /* next argument */
    const char *name;  /* the option being parsed, without "--" */
    const char *value; /* its value after cli_value(), or NULL */
    const char *inline_value;
} cli_args;

void cli_args_init(cli_args *a, int argc, char **argv);
/* Advances to the next option; returns 0 at the end. Positional arguments
 * are returned with name == NULL and value set. */
int cli_next(cli_args *a);
/* The option's value; reports a usage error and returns NULL if missing. */
const char *cli_value(cli_args *a);
int cli_is(const cli_args *a, const char *name);
/* Parsers that print the usage error themselves; return 0 on success. */
int cli_parse_int(const char *opt, const char *text, long lo, long hi, long *out);
int cli_parse_double(const char *opt, const char *text, double lo, double hi, double *out);
int cli_parse_size(const char *opt, const char *text, size_t *out); /* 16MiB, 4K, 100 */
/* --precision fp32|bf16-mixed (docs/design.md §13) */
int cli_parse_precision(const char *text, ff_precision *out);
/* --bf16-products auto|emulated|onednn */
int cli_parse_bf16_products(const char *text, ff_bf16_products *out);
/* For a settings table: ", products on oneDNN (brg:...; 190 against 100
 * GFLOP/s on this rank)" in bf16-mixed, "" in fp32 (in buf). */
const char *cli_bf16_products(const ff_gpt *g, char *buf, size_t len);
/* --progress wait|poll|thread */
int cli_parse_progress(const char *text, ff_progress_mode *out);
/* The option's name of a progress mode ("wait", "poll", "thread"). */
const char *cli_progress_name(int mode);
/* --stage-layers A,B,..: the blocks of each of `stages` stages into out
 * (at most cap). */
int cli_parse_stage_layers(const char *text, int stages, int *out, int cap);
int cli_unknown(const cli_args *a, const char *command);

/* Options shared by every subcommand that runs on a grid. */
typedef struct {
    const char *grid;   /* --grid */
    int stages;         /* --stages (1: none) */
    const char *trace;  /* --trace FILE.json */
    ff_ctx_options ctx; /* threads: --threads, default 1 per rank */
} cli_run_opts;

void cli_run_opts_default(cli_run_opts *o);
/* Handles --grid, --stages, --trace, --progress, --poll-us, --threads. Returns 1
 * if the option was one of them (0 on success, or sets *bad). */
int cli_run_option(cli_args *a, cli_run_opts *o, int *bad);
extern const char cli_run_help[];

/* Creates the context, parses and builds the grid, enables the trace. On
 * failure prints the (agreed) message once and returns CLI_FAIL. */
int cli_setup(const cli_run_opts *o, ff_ctx **ctx, ff_grid **grid);
/* Writes the trace if requested, destroys the grid and context. Returns the
 * exit code: `code`, or CLI_FAIL if the trace could not be written. */
int cli_teardown(const cli_run_opts *o, ff_ctx *ctx, ff_grid *grid, int code);

/* The collective model a run would use, for the planner: FF_PROFILE's if
 * set (as ff_ctx_create reads it), else ff_coll_model_default. FF_OK, or an
 * error with a message in err. */
int cli_coll_model(ff_coll_model *m, char *err, size_t err_len);

/* The ranks on one node (MPI_COMM_TYPE_SHARED), the minimum over nodes. */
int cli_ranks_per_node(MPI_Comm comm);

/* sample.c: generates n tokens after the prompt in every sequence of the
 * model's micro-batch (each starts with end-of-text, token V-1) and prints
 * the first `show` sequences on rank 0 as they are drawn: the tokens' bytes
 * through bpe (a vocabulary of V tokens; needed on rank 0 only), bytes for
 * a byte-level vocabulary (V = 257), token ids otherwise. Collective. */
int cli_generate_text(ff_gpt *g, const ff_bpe *bpe, const int32_t *prompt, int prompt_len, long n,
                      const ff_sampler *s, int show);
/* The same with the vocabulary of V tokens found by cli_vocab_find in the
 * cache (`train --sample`). */
int cli_generate(ff_gpt *g, const int32_t *prompt, int prompt_len, long n, const ff_sampler *s,
                 int show);
/* The first vocabulary of V tokens among the folders and then
 * scripts/setup.sh gpt2-vocab's cache (${XDG_CACHE_HOME:-~/.cache}/fourfold/gpt2):
 * 1 and *out, or 0 when there is none (a folder without one, or with one of
 * another size or that does not load, is passed over). */
int cli_vocab_find(int V, const char *const *folders, int nfolders, ff_bpe **out);
/* tokenize.c: one line per shard written (path, documents, tokens, bytes). */
void cli_print_shards(const ff_tokenize_report *rep);

/* Subcommands */
int cmd_selftest(int argc, char **argv);
/* bench.c: coll, gemm, profile */
int cmd_bench(int argc, char **argv);
int cmd_plan(int argc, char **argv);     /* runs without MPI */
int cmd_tokenize(int argc, char **argv); /* runs without MPI (tokenize.c) */
int cmd_train(int argc, char **argv);    /* train.c */
int cmd_eval(int argc, char **argv);     /* sample.c */
int cmd_prune(int argc, char **argv);    /* prune.c */
int cmd_sample(int argc, char **argv);   /* sample.c */

#endif
