/* fourfold bench gemm: the sgemm rate of this machine's OpenBLAS (or the
 * rate of oneDNN's bf16 products), over shapes and thread counts, with
 * every rank of the job computing at once (the sustained per-rank rate is
 * what a training step sees; docs/design.md §8 divides model FLOP/s by it). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "util/text.h"

static const char help_gemm[] =
    "usage: mpirun -np N fourfold bench gemm [options]\n\n"
    "sgemm C(m,n) = A(m,k) B(k,n), row-major, on every rank at once; prints the\n"
    "median, lowest and highest per-rank GFLOP/s over the ranks.\n\n"
    "options:\n"
    "  --shapes LIST     MxNxK or N (square) items, comma-separated (default\n"
    "                    256,512,1024,2048,4096x768x768,4096x3072x768,4096x768x3072)\n"
    "  --threads LIST    OpenBLAS threads per rank (default 1 and the core count)\n"
    "  --seconds S       time per point and rank, at least 3 runs (default 0.5)\n"
    "  --products P      fp32: the BLAS's sgemm (default); bf16: oneDNN's bf16\n"
    "                    matmul, fp32 operands rounded to bf16 in each call,\n"
    "                    fp32 accumulation (the bf16-mixed products)\n"
    "  --json FILE       also append one JSON line per point to FILE\n";

static int parse_shape(const char *tok, int *m, int *n, int *k)
{
    char *end;
    long a = strtol(tok, &end, 10), b = a, c = a;
    if (*end == 'x') {
        b = strtol(end + 1, &end, 10);
        if (*end != 'x')
            return -1;
        c = strtol(end + 1, &end, 10);
    }
    if (*end || a < 1 || b < 1 || c < 1 || a > 65536 || b > 65536 || c > 65536)
        return -1;
    *m = (int)a, *n = (int)b, *k = (int)c;
    return 0;
}

int cmd_bench_gemm(int argc, char **argv)
{
    const char *shapes = "256,512,1024,2048,4096x768x768,4096x3072x768,4096x768x3072";
    const char *json_path = NULL;
    char threads_default[32];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 1)
        snprintf(threads_default, sizeof threads_default, "1,%ld", cores);
    else
        snprintf(threads_default, sizeof threads_default, "1");
    const char *threads = threads_default;
    double seconds = 0.5;
    int bf16 = 0;
    cli_args a;
    cli_args_init(&a, argc, argv);
    while (cli_next(&a)) {
        const char *v;
        if (cli_is(&a, "help")) {
            cli_print("%s", help_gemm);
            return CLI_OK;
        }
        if (!a.name)
            return cli_unknown(&a, "bench gemm");
        if (!(v = cli_value(&a)))
            return CLI_USAGE;
        if (cli_is(&a, "shapes"))
            shapes = v;
        else if (cli_is(&a, "threads"))
            threads = v;
        else if (cli_is(&a, "seconds")) {
            if (cli_parse_double("seconds", v, 0, 3600, &seconds))
                return CLI_USAGE;
        } else if (cli_is(&a, "products")) {
            if (strcmp(v, "fp32") && strcmp(v, "bf16")) {
                cli_error("--products '%s': expected fp32 or bf16", v);
                return CLI_USAGE;
            }
            bf16 = v[0] == 'b';
        } else if (cli_is(&a, "json"))
            json_path = v;
        else
            return cli_unknown(&a, "bench gemm");
    }
    /* validate both lists before measuring anything */
    char sbuf[512], tbuf[128];
    snprintf(sbuf, sizeof sbuf, "%s", shapes);
    snprintf(tbuf, sizeof tbuf, "%s", threads);
    int dims[32][3], nshape = 0, thr[16], nthr = 0;
    for (char *tok = strtok(sbuf, ","); tok; tok = strtok(NULL, ",")) {
        if (nshape == 32 ||
            parse_shape(tok, &dims[nshape][0], &dims[nshape][1], &dims[nshape][2])) {
            cli_error("--shapes: '%s' is not MxNxK or N (at most 32 shapes, sizes 1..65536)", tok);
            return CLI_USAGE;
        }
        nshape++;
    }
    for (char *tok = strtok(tbuf, ","); tok; tok = strtok(NULL, ",")) {
        long t;
        if (nthr == 16 || cli_parse_int("threads", tok, 1, 1024, &t))
            return CLI_USAGE;
        thr[nthr++] = (int)t;
    }
    int rank = cli_world_rank(), size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    FILE *json = NULL;
    int opened = !json_path || rank != 0 || (json = fopen(json_path, "a")) != NULL;
    MPI_Bcast(&opened, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!opened) { /* before anything is timed */
        cli_error("--json %s: cannot open for appending", json_path);
        return CLI_FAIL;
    }
    ff_ctx *ctx = NULL;
    ff_bf16_gemm *h = NULL;
    if (bf16) { /* fails the same way on every rank: a property of the build */
        int rc = ff_ctx_create(&ctx, MPI_COMM_WORLD, NULL);
        if (rc == FF_OK)
            rc = ff_bf16_gemm_create(ctx, &h);
        if (rc != FF_OK) {
            cli_error("--products bf16: %s", ctx ? ff_ctx_error(ctx) : "out of memory");
            ff_ctx_destroy(ctx);
            if (json)
                fclose(json);
            return CLI_FAIL;
        }
    }
    cli_print("# fourfold bench gemm: %d rank(s) computing at once, %ld core(s)\n"
              "# OpenBLAS kernels: %s\n"
              "# products: %s\n"
              "#%21s %7s %10s %10s %10s %12s\n",
              size, cores, ff_blas_kernels(),
              bf16 ? "bf16 on oneDNN (operands rounded in each call, fp32 accumulation)"
                   : "fp32 sgemm",
              "m x n x k", "threads", "GFLOP/s", "min", "max", "sum(ranks)");
    for (int t = 0; t < nthr; t++)
        for (int s = 0; s < nshape; s++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double rate =
                bf16 ? ff_bf16_gemm_rate(h, dims[s][0], dims[s][1], dims[s][2], thr[t], seconds)
                     : ff_sgemm_rate(dims[s][0], dims[s][1], dims[s][2], thr[t], seconds);
            double *all = malloc((size_t)size * sizeof *all);
            if (!all)
                MPI_Abort(MPI_COMM_WORLD, CLI_FAIL);
            MPI_Allgather(&rate, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, MPI_COMM_WORLD);
            double sum = 0;
            for (int i = 0; i < size; i++)
                sum += all[i];
            double med = ff_median(all, size);
            char shape[40];
            snprintf(shape, sizeof shape, "%dx%dx%d", dims[s][0], dims[s][1], dims[s][2]);
            cli_print(" %21s %7d %10.2f %10.2f %10.2f %12.2f\n", shape, thr[t], med * 1e-9,
                      all[0] * 1e-9, all[size - 1] * 1e-9, sum * 1e-9);
            if (json) {
                ff_text core = {0}; /* the BLAS's name, as a JSON string */
                ff_text_json_string(&core, ff_blas_core(), 0);
                fprintf(json,
                        "{\"bench\":\"gemm\",\"m\":%d,\"n\":%d,\"k\":%d,\"threads\":%d,"
                        "\"ranks\":%d,\"gflops_median\":%.3f,\"gflops_min\":%.3f,"
                        "\"gflops_max\":%.3f,\"core\":%s,\"products\":\"%s\"}\n",
                        dims[s][0], dims[s][1], dims[s][2], thr[t], size, med * 1e-9, all[0] * 1e-9,
                        all[size - 1] * 1e-9, core.s ? core.s : "null", bf16 ? "bf16" : "fp32");
                ff_text_free(&core);
            }
            free(all);
        }
    if (bf16)
        cli_print("# oneDNN's kernels: %s\n", ff_bf16_gemm_impl(h));
    ff_bf16_gemm_destroy(h);
    ff_ctx_destroy(ctx);
    if (json)
        fclose(json);
    return CLI_OK;
}
