/* The BLAS's kernels against the CPU (src/blas.c, docs/design.md §8): the
 * decision on a table of cases (the BLAS's kernel family, the CPU's
 * features, OPENBLAS_CORETYPE), and this process's facts against
 * /proc/cpuinfo. The re-execution itself: tests/blas_reexec.sh. No test
 * sets or unsets OPENBLAS_CORETYPE. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/gemm.h"
#include "test_util.h"

static void decide(const char *core, int avx2, int avx512, const char *user, const char *better,
                   const char *why_has)
{
    ff_blas_facts f = {.core = core, .cpu_avx2 = avx2, .cpu_avx512 = avx512, .user_core = user};
    ff_blas_advice a = ff_blas_advise(&f);
    int ok = (better ? a.better && !strcmp(a.better, better) : !a.better) &&
             strstr(a.why, why_has) != NULL;
    printf("  %-12s avx2 %d avx512 %d OPENBLAS_CORETYPE %-8s -> %-9s (%s)\n", core, avx2, avx512,
           user ? user : "unset", a.better ? a.better : "keep", a.why);
    CHECK(ok, "%s avx2 %d avx512 %d user %s: got %s (%s), expected %s with '%s'", core, avx2,
          avx512, user ? user : "unset", a.better ? a.better : "keep", a.why,
          better ? better : "keep", why_has);
}

/* 1 if /proc/cpuinfo's first flags line lists every flag in `want` */
static int cpuinfo_has(const char *const *want, int n)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    int found = -1;
    while (f && found < 0 && fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            found = 1;
            for (int i = 0; i < n; i++) {
                char w[64];
                snprintf(w, sizeof w, " %s", want[i]);
                const char *p = strstr(line, w);
                int end = p && (p[strlen(w)] == ' ' || p[strlen(w)] == '\n');
                found &= end;
            }
        }
    if (f)
        fclose(f);
    return found;
}

int main(void)
{
    printf("the decision:\n");
    /* fallbacks on a CPU with more: switch */
    decide("Prescott", 1, 1, NULL, "SkylakeX", "fell back to its Prescott kernels");
    decide("Prescott", 1, 0, NULL, "Haswell", "AVX2 and FMA");
    decide("prescott", 1, 1, NULL, "SkylakeX", "AVX-512");
    decide("Sandybridge", 1, 1, NULL, "SkylakeX", "Sandybridge");
    decide("Nehalem", 1, 0, "", "Haswell", "Nehalem"); /* an empty variable is unset */
    /* the user's variable wins, whatever the kernels */
    decide("Prescott", 1, 1, "Prescott", NULL, "OPENBLAS_CORETYPE=Prescott set");
    decide("Haswell", 1, 1, "Haswell", NULL, "kept");
    /* kernels that fit, or a CPU without AVX2: keep */
    decide("Haswell", 1, 1, NULL, NULL, "OpenBLAS's choice");
    decide("Zen", 1, 0, NULL, NULL, "OpenBLAS's choice");
    decide("Cooperlake", 1, 1, NULL, NULL, "AVX-512");
    decide("SkylakeX", 1, 1, NULL, NULL, "AVX-512");
    decide("Prescott", 0, 0, NULL, NULL, "neither AVX2 nor AVX-512");
    decide("Sandybridge", 0, 0, NULL, NULL, "neither");
    /* a family this code does not know (a newer library's): keep */
    decide("Zen5", 1, 1, NULL, NULL, "does not know");

    ff_blas_facts f = ff_blas_facts_here();
    static const char *const avx2[] = {"avx2", "fma"};
    static const char *const avx512[] = {"avx512f", "avx512bw", "avx512dq", "avx512vl"};
    int c2 = cpuinfo_has(avx2, 2), c512 = cpuinfo_has(avx512, 4);
    printf("this process: BLAS kernels %s; cpuid: AVX2+FMA %d, AVX-512 %d; /proc/cpuinfo: %d, %d; "
           "%s\n",
           f.core, f.cpu_avx2, f.cpu_avx512, c2, c512, ff_blas_kernels());
    if (c2 >= 0) {
        CHECK(f.cpu_avx2 == c2, "cpuid says AVX2+FMA %d, /proc/cpuinfo %d", f.cpu_avx2, c2);
        CHECK(f.cpu_avx512 == (c512 && c2), "cpuid says AVX-512 %d, /proc/cpuinfo %d",
              f.cpu_avx512, c512);
    }
    CHECK(f.core && *f.core, "the BLAS names no kernels");
    return test_finish("blas");
}
