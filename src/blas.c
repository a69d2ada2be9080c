/* The machine's BLAS (fourfold/gemm.h): its threads, its kernels, and the
 * kernels it should have chosen (docs/design.md §8, "The BLAS's kernels").
 *
 * OpenBLAS built with DYNAMIC_ARCH picks its kernels when it loads, from
 * the CPU's family and model; a CPU newer than the library (Debian 12's
 * 0.3.21 on an Intel family 6 model 207, say) gets its generic kernels
 * (Prescott: SSE3), 3-7 times slower than the AVX-512 ones on the same
 * machine. The choice is made before main() and read from
 * OPENBLAS_CORETYPE, so the only fix from inside the program is to set the
 * variable and execute itself again, before MPI starts (ff_blas_reexec). A
 * variable the user set is never changed: some machines set it on purpose. */
#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fourfold/gemm.h"

/* OpenBLAS's own entry points (not in cblas.h on every distribution). */
void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);
int openblas_get_parallel(void);

void ff_blas_set_threads(int n) { openblas_set_num_threads(n); }
const char *ff_blas_core(void) { return openblas_get_corename(); }

const char *ff_blas_threading(void)
{
    switch (openblas_get_parallel()) {
    case 0: return "sequential";
    case 2: return "openmp";
    default: return "pthreads";
    }
}

/* ---- which kernels ---------------------------------------------------------- */

/* The vector instructions a kernel family of OpenBLAS (0.3.x, x86-64) uses:
 * 3 AVX-512, 2 AVX2 and FMA, 1 AVX, 0 SSE only; -1 a name not listed (a
 * newer library's: left alone). */
static int core_level(const char *core)
{
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Zen"};
    static const char *const avx[] = {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller",
                                      "Excavator"};
    static const char *const sse[] = {"Prescott", "Core2",   "Penryn",    "Dunnington", "Nehalem",
                                      "Atom",     "Opteron", "Barcelona", "Bobcat",     "Nano",
                                      "Opteron(SSE3)", "Katmai", "Coppermine", "Northwood",
                                      "Banias",   "Athlon",  "Generic"};
    const struct {
        const char *const *names;
        size_t n;
        int level;
    } tab[] = {{avx512, 3, 3}, {avx2, 2, 2}, {avx, 5, 1}, {sse, sizeof sse / sizeof *sse, 0}};
    for (size_t t = 0; core && t < sizeof tab / sizeof *tab; t++)
        for (size_t i = 0; i < tab[t].n; i++)
            if (!strcasecmp(core, tab[t].names[i]))
                return tab[t].level;
    return -1;
}

static const char *features_name(const ff_blas_facts *f)
{
    return f->cpu_avx512 ? "AVX-512" : f->cpu_avx2 ? "AVX2 and FMA" : "neither AVX2 nor AVX-512";
}

ff_blas_advice ff_blas_advise(const ff_blas_facts *f)
{
    ff_blas_advice a = {0};
    const int have = f->cpu_avx512 ? 3 : f->cpu_avx2 ? 2 : 0, got = core_level(f->core);
    if (f->user_core && *f->user_core)
        snprintf(a.why, sizeof a.why, "OPENBLAS_CORETYPE=%s set in the environment: kept",
                 f->user_core);
    else if (got < 0)
        snprintf(a.why, sizeof a.why, "OpenBLAS's choice; a kernel family fourfold does not know");
    else if (got <= 1 && have >= 2) {
        /* a fallback: SSE or AVX kernels on a CPU with AVX2 or AVX-512 */
        a.better = have == 3 ? "SkylakeX" : "Haswell";
        snprintf(a.why, sizeof a.why,
                 "OpenBLAS fell back to its %s kernels on this CPU with %s, whose kernels are "
                 "%s",
                 f->core, features_name(f), a.better);
    } else
        snprintf(a.why, sizeof a.why, "OpenBLAS's choice, for a CPU with %s", features_name(f));
    return a;
}

ff_blas_facts ff_blas_facts_here(void)
{
    ff_blas_facts f = {0};
    f.core = ff_blas_core();
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    f.cpu_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    /* what OpenBLAS's SkylakeX kernels need */
    f.cpu_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
    f.user_core = getenv("OPENBLAS_CORETYPE");
    const char *mark = getenv("FF_BLAS_REEXEC");
    if (mark && *mark) /* the variable is ours, set before this process started */
        f.user_core = NULL;
#ifdef FF_TEST_HOOKS
    /* FF_TEST_BLAS_CORE: the BLAS's answer, faked (before any re-execution) */
    const char *fake = getenv("FF_TEST_BLAS_CORE");
    if (fake && *fake && !(mark && *mark))
        f.core = fake;
#endif
    return f;
}

/* A product whose every partial sum is an integer below 2^24 (exact in any
 * order): the kernels must give exactly the reference. 1 if they do. */
static int kernels_compute(void)
{
    enum { M = 61, N = 53, K = 47 };
    static float a[M * K], b[K * N], c[M * N];
    for (int i = 0; i < M * K; i++)
        a[i] = (float)((i * 7) % 9 - 4);
    for (int i = 0; i < K * N; i++)
        b[i] = (float)((i * 5) % 7 - 3);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
    int ok = 1;
    for (int i = 0; i < M && ok; i++)
        for (int j = 0; j < N && ok; j++) {
            float s = 0;
            for (int k = 0; k < K; k++)
                s += a[i * K + k] * b[k * N + j];
            ok = s == c[i * N + j];
        }
#ifdef FF_TEST_HOOKS
    const char *fail = getenv("FF_TEST_BLAS_CHECK");
    if (fail && !strcmp(fail, "fail"))
        ok = 0;
#endif
    return ok;
}

/* what the process's kernels are and why: set by ff_blas_reexec (before any
 * thread starts) or on the first ff_blas_kernels call (not thread-safe) */
static char note[640];

void ff_blas_reexec(char **argv)
{
    const char *mark = getenv("FF_BLAS_REEXEC");
    if (mark && !strncmp(mark, "failed:", 7)) { /* the third process: back on the BLAS's own */
        snprintf(note, sizeof note, "%s (OpenBLAS's choice; %s)", ff_blas_core(), mark + 7);
        return;
    }
    if (mark && *mark) { /* the second: did the library take the variable, and compute? */
        const char *want = getenv("OPENBLAS_CORETYPE");
        char why[256];
        snprintf(why, sizeof why, "%s", mark);
        const char *bad = !want || strcasecmp(ff_blas_core(), want) ? "the library ignored it"
                          : !kernels_compute()                       ? "its product check failed"
                                                                     : NULL;
        if (!bad) {
            snprintf(note, sizeof note, "%s (chosen by fourfold: %s; product check passed)",
                     ff_blas_core(), why);
            return;
        }
        char back[400];
        snprintf(back, sizeof back, "failed:fourfold asked for %s, %s; %s", want ? want : "?", bad,
                 why);
        unsetenv("OPENBLAS_CORETYPE");
        setenv("FF_BLAS_REEXEC", back, 1);
        execv("/proc/self/exe", argv);
        /* not on kernels that failed their check: stop (before MPI starts) */
        fprintf(stderr, "fourfold: error: %s, and the program could not execute itself again "
                "to go back to OpenBLAS's own kernels: %s\n", back + 7, strerror(errno));
        exit(1);
    }
    ff_blas_facts f = ff_blas_facts_here();
    ff_blas_advice a = ff_blas_advise(&f);
    snprintf(note, sizeof note, "%s (%s)", f.core, a.why);
    if (!a.better)
        return;
    setenv("OPENBLAS_CORETYPE", a.better, 1);
    setenv("FF_BLAS_REEXEC", a.why, 1);
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE"); /* exec failed: run on as we are */
    unsetenv("FF_BLAS_REEXEC");
    snprintf(note, sizeof note, "%s (%s; fourfold could not execute itself again: set "
             "OPENBLAS_CORETYPE=%s)", f.core, a.why, a.better);
}

const char *ff_blas_kernels(void)
{
    if (!note[0]) { /* a program that did not call ff_blas_reexec */
        ff_blas_facts f = ff_blas_facts_here();
        ff_blas_advice a = ff_blas_advise(&f);
        if (a.better)
            snprintf(note, sizeof note, "%s (%s: products 3-7x slower than they can be; run with "
                     "OPENBLAS_CORETYPE=%s)", f.core, a.why, a.better);
        else
            snprintf(note, sizeof note, "%s (%s)", f.core, a.why);
    }
    return note;
}

int ff_blas_fallback(void)
{
    const char *mark = getenv("FF_BLAS_REEXEC");
    if (mark && *mark)
        return 0; /* fourfold chose, or tried and said so */
    ff_blas_facts f = ff_blas_facts_here();
    return ff_blas_advise(&f).better != NULL;
}
