/* The planner's GEMM curve fitted to measured per-shape rates
 * (plan/profile.h, ff_profile_fit_gemm): what `fourfold bench profile`
 * writes as gemm_half_dim and gemm_call_s, the search bench/gemm_shape_fit.py
 * runs on a published table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fourfold/gemm.h" /* ff_median */
#include "plan/plan_internal.h"
#include "plan/profile.h"

enum { H_STEPS = 1000, CALL_STEPS = 120 }; /* h = 2 i, call = j / 4e6 s */

/* The large-shape rate that makes the curve (h, call) predict shape a
 * exactly; 0 if none does (the call alone outlasts it). */
static double anchored_rate(const double *a, double h, double call)
{
    double flops = 2 * a[0] * a[1] * a[2], left = flops / a[3] - call;
    return left > 0 ? flops * (1 + h / a[0] + h / a[1] + h / a[2]) / left : 0;
}

/* The relative errors of the curve on the shapes into err[n] (its rates
 * into fitted[n], if not NULL); their sum of squared log ratios. */
static double gemm_errors(const double (*shapes)[4], int n, double rate, double h, double call,
                          double *err, double *fitted)
{
    ff_profile p;
    memset(&p, 0, sizeof p);
    p.gemm_half_dim = h, p.gemm_call_s = call;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        const double *s = shapes[i];
        double flops = 2 * s[0] * s[1] * s[2];
        double t = plan_gemm_time(&p, rate, flops, (int64_t)s[0], (int64_t)s[1], (int64_t)s[2], 1);
        double ratio = flops / t / s[3];
        err[i] = ratio - 1;
        if (fitted)
            fitted[i] = flops / t;
        sum += log(ratio) * log(ratio);
    }
    return sum;
}

int ff_profile_fit_gemm(const double (*shapes)[4], int n, int anchor, double *rate,
                        double *half_dim, double *call_s, double *fitted, double *median,
                        double *max)
{
    if (n < 1 || anchor >= n || (anchor < 0 && !(isfinite(*rate) && *rate > 0)))
        return FF_EINVAL;
    for (int i = 0; i < n; i++)
        if (!(shapes[i][0] >= 1 && shapes[i][1] >= 1 && shapes[i][2] >= 1 &&
              isfinite(shapes[i][3]) && shapes[i][3] > 0))
            return FF_EINVAL;
    double *err = malloc((size_t)n * sizeof *err);
    if (!err)
        return FF_ENOMEM;
    double best = INFINITY, bh = 0, bc = 0, br = anchor < 0 ? *rate : 0;
    for (int hi = 0; hi <= H_STEPS; hi++)
        for (int ci = 0; ci <= CALL_STEPS; ci++) {
            double h = 2.0 * hi, call = ci / 4e6;
            double r = anchor < 0 ? *rate : anchored_rate(shapes[anchor], h, call);
            if (!(r > 0))
                continue;
            double s = gemm_errors(shapes, n, r, h, call, err, NULL);
            if (s < best)
                best = s, bh = h, bc = call, br = r;
        }
    if (!(best < INFINITY)) {
        free(err);
        return FF_EINVAL;
    }
    gemm_errors(shapes, n, br, bh, bc, err, fitted);
    for (int i = 0; i < n; i++)
        err[i] = fabs(err[i]);
    double med = ff_median(err, n); /* (sorts err) */
    *rate = br, *half_dim = bh, *call_s = bc;
    if (median)
        *median = med;
    if (max)
        *max = err[n - 1];
    free(err);
    return FF_OK;
}
