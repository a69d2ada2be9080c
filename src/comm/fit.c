/* ff_coll_fit: the least-squares fit behind `fourfold bench profile`
 * (AutoDDL §3: alpha-beta per level, here with an optional second regime).
 *
 * Every sample is a collective that ran `steps` messages of `msg_bytes` one
 * after another and added `add_bytes` of received partial sums, in t_s
 * seconds. One regime: t = steps*alpha + steps*msg/beta + add/reduce. Two
 * regimes: messages of at most small_max bytes use (alpha_small,
 * beta_small), larger ones (alpha, beta); reduce is shared (it is the CPU's,
 * not the link's).
 *
 * Why a second regime: on the emulated cluster (and on real networks at the
 * eager/rendezvous switch) the cost is not linear in the message size: a
 * `tc tbf` shaper lets messages below its burst through at wire speed and
 * only larger ones at the shaped rate, so 16 KiB costs 65 us and 64 KiB
 * 900 us on a 1 Gbit/s link of docs/coll-bench.md. One line through both
 * misprices both and ranks recursive doubling (one step of 2 blocks) against
 * the ring (two steps of 1) wrongly exactly where it matters.
 *
 * Method: least squares on the relative error (each equation divided by its
 * measured time, so microseconds and seconds count alike) with every
 * parameter >= 0, enforced by solving on every subset of the optional
 * parameters (alphas, reduce) and keeping the best feasible one. The
 * threshold is searched over the measured sizes (at least two distinct sizes
 * on each side, so each regime's alpha and beta are resolvable), and the two
 * regimes are kept only if they lower the Bayesian information criterion
 * n ln(SS/n) + k ln n (k = parameters, the threshold counting as one): a
 * split that only chases noise is refused (tests/test_coll_fit.c: 10 noisy
 * one-line data sets, none split). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { NPAR = 5 }; /* alpha, 1/beta, alpha_small, 1/beta_small, 1/reduce */

/* The equation of one sample: its coefficients for (alpha, 1/beta,
 * alpha_small, 1/beta_small, 1/reduce). With `tied`, both regimes share
 * the alpha column (the small regime's alpha is then the large one's). */
static void row_of_tied(const ff_coll_sample *s, double small_max, int tied, double *x)
{
    int small = s->msg_bytes <= small_max;
    memset(x, 0, NPAR * sizeof *x);
    x[small && !tied ? 2 : 0] = s->steps;
    x[small ? 3 : 1] = s->steps * s->msg_bytes;
    x[4] = s->add_bytes;
}

static void row_of(const ff_coll_sample *s, double small_max, double *x)
{
    row_of_tied(s, small_max, 0, x);
}

/* Solves the k x k system A x = y (Gaussian elimination, partial pivoting);
 * -1 if singular. */
static int solve(int k, double A[NPAR][NPAR], double *y, double *x)
{
    for (int c = 0; c < k; c++) {
        int piv = c;
        for (int r = c + 1; r < k; r++)
            if (fabs(A[r][c]) > fabs(A[piv][c]))
                piv = r;
        if (fabs(A[piv][c]) < 1e-300)
            return -1;
        for (int j = 0; j < k; j++) {
            double t = A[c][j];
            A[c][j] = A[piv][j];
            A[piv][j] = t;
        }
        double t = y[c];
        y[c] = y[piv];
        y[piv] = t;
        for (int r = c + 1; r < k; r++) {
            double f = A[r][c] / A[c][c];
            for (int j = c; j < k; j++)
                A[r][j] -= f * A[c][j];
            y[r] -= f * y[c];
        }
    }
    for (int c = k - 1; c >= 0; c--) {
        double v = y[c];
        for (int j = c + 1; j < k; j++)
            v -= A[c][j] * x[j];
        x[c] = v / A[c][c];
    }
    return 0;
}

static double rel_residual(const ff_coll_sample *s, double small_max, const double *theta)
{
    double x[NPAR], pred = 0;
    row_of(s, small_max, x);
    for (int j = 0; j < NPAR; j++)
        pred += x[j] * theta[j];
    return (pred - s->t_s) / s->t_s;
}

/* The best non-negative fit for one threshold: theta and its sum of squared
 * relative residuals (-1 if no subset has a feasible solution); *k gets the
 * number of parameters it uses.
 *
 * With two regimes, the large messages' alpha is at least the small ones':
 * a fixed cost per message does not shrink because the message is larger
 * (at an eager/rendezvous switch it grows by a round trip). Unconstrained,
 * noise at large sizes, where alpha is a sliver of the time, can drive it
 * to 0 (the 4x1 emulated cluster of docs/coll-bench.md did), and a zero
 * alpha prices the ring's p-1 steps like recursive doubling's log2 p, so the
 * selector cannot tell them apart where the fewer steps measure faster. A
 * solution that breaks the order is refused; the tied one (one alpha for
 * both regimes) is always among the candidates. */
static double fit_cut(const ff_coll_sample *s, int n, double small_max, double *best, int *k_used)
{
    int has_small = 0, has_large = 0;
    for (int i = 0; i < n; i++) {
        has_small |= s[i].msg_bytes <= small_max;
        has_large |= s[i].msg_bytes > small_max;
    }
    /* a regime with samples needs its 1/beta; one without gets nothing */
    int need = (has_large ? 1 << 1 : 0) | (has_small ? 1 << 3 : 0);
    int allow = need | (has_large ? 1 << 0 : 0) | (has_small ? 1 << 2 : 0) | 1 << 4;
    double best_ss = -1;
    int two = has_small && has_large;
    for (int cand = 0; cand < 2 << NPAR; cand++) {
        int mask = cand & ((1 << NPAR) - 1), tied = cand >> NPAR;
        if ((mask & need) != need || (mask & ~allow))
            continue;
        if (tied && (!two || (mask & 1 << 2))) /* tied: alpha_small is alpha */
            continue;
        int idx[NPAR], k = 0;
        for (int j = 0; j < NPAR; j++)
            if (mask & (1 << j))
                idx[k++] = j;
        double A[NPAR][NPAR] = {{0}}, y[NPAR] = {0}, sol[NPAR] = {0}, x[NPAR];
        for (int i = 0; i < n; i++) {
            row_of_tied(&s[i], small_max, tied, x);
            for (int a = 0; a < k; a++) {
                y[a] += x[idx[a]] / s[i].t_s;
                for (int b = 0; b < k; b++)
                    A[a][b] += x[idx[a]] * x[idx[b]] / (s[i].t_s * s[i].t_s);
            }
        }
        if (solve(k, A, y, sol) != 0)
            continue;
        double theta[NPAR] = {0}, ss = 0;
        int ok = 1;
        for (int a = 0; a < k; a++) {
            theta[idx[a]] = sol[a];
            ok &= sol[a] > 0;
        }
        if (tied)
            theta[2] = theta[0];
        if (!ok || (two && theta[0] < theta[2]))
            continue;
        for (int i = 0; i < n; i++) {
            double r = rel_residual(&s[i], small_max, theta);
            ss += r * r;
        }
        if (best_ss < 0 || ss < best_ss) {
            best_ss = ss;
            memcpy(best, theta, sizeof theta);
            *k_used = k;
        }
    }
    return best_ss;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int ff_coll_fit(const ff_coll_sample *samples, int n, int two_regimes, ff_coll_fit_result *out)
{
    memset(out, 0, sizeof *out);
    ff_coll_sample *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s);
    double *sizes = malloc((size_t)(n > 0 ? n : 1) * sizeof *sizes);
    if (!s || !sizes) {
        free(s), free(sizes);
        return FF_ENOMEM;
    }
    int m = 0, d = 0;
    for (int i = 0; i < n; i++) /* usable samples only */
        if (samples[i].t_s > 0 && isfinite(samples[i].t_s) && samples[i].steps > 0 &&
            samples[i].msg_bytes >= 0)
            s[m++] = samples[i];
    out->n = m;
    for (int i = 0; i < m; i++)
        sizes[i] = s[i].msg_bytes;
    qsort(sizes, (size_t)m, sizeof *sizes, cmp_double);
    for (int i = 0; i < m; i++) /* distinct sizes, ascending */
        if (d == 0 || sizes[i] != sizes[d - 1])
            sizes[d++] = sizes[i];

    double theta[NPAR] = {0}, cut = 0, best_bic = 0;
    int found = 0, best_c = 1;
    /* one regime (threshold below every sample), then every split that
     * leaves two distinct sizes on each side */
    for (int c = 1; c <= d - 2 || c == 1; c++) {
        int split = c > 1;
        if (split && !two_regimes)
            break;
        double small_max = split ? sizes[c - 1] : -1, th[NPAR] = {0};
        int k = 0;
        double ss = m >= 3 ? fit_cut(s, m, small_max, th, &k) : -1;
        if (ss < 0)
            continue;
        /* residuals below 1e-6 are rounding: equal, so the parameters decide */
        double floor_ss = m * 1e-12;
        double bic = m * log((ss > floor_ss ? ss : floor_ss) / m) + (k + split) * log((double)m);
        if (!found || bic < best_bic) {
            found = 1;
            best_bic = bic;
            cut = small_max;
            best_c = c;
            memcpy(theta, th, sizeof theta);
        }
    }
    /* When in doubt, large: while some sample of the largest small size is
     * closer to the large regime's price than to the small one's, that size
     * moves to the large side (as long as two sizes stay small). A gradual
     * transition (a shaper's burst shared by several streams) then never
     * prices as cheap a message that is sometimes not, which is what ranks
     * the ring (many small messages) against recursive doubling (fewer,
     * larger ones) correctly. */
    while (found && best_c > 2) {
        int doubt = 0;
        for (int i = 0; i < m && !doubt; i++) {
            if (s[i].msg_bytes != cut)
                continue;
            ff_coll_sample as_large = s[i];
            double x[NPAR], p_small = 0, p_large = 0;
            row_of(&s[i], cut, x); /* small */
            for (int j = 0; j < NPAR; j++)
                p_small += x[j] * theta[j];
            row_of(&as_large, -1, x); /* large */
            for (int j = 0; j < NPAR; j++)
                p_large += x[j] * theta[j];
            doubt = fabs(p_large - s[i].t_s) < fabs(p_small - s[i].t_s);
        }
        if (!doubt)
            break;
        double th[NPAR] = {0};
        int k = 0;
        if (fit_cut(s, m, sizes[best_c - 2], th, &k) < 0)
            break;
        best_c--;
        cut = sizes[best_c - 1];
        memcpy(theta, th, sizeof theta);
    }
    if (!found) {
        free(s), free(sizes);
        return FF_OK; /* out->ok = 0: too few samples, or nothing fits */
    }
    out->ok = 1;
    out->alpha_s = theta[0];
    out->beta_Bps = theta[1] > 0 ? 1.0 / theta[1] : 0;
    if (cut >= 0) {
        out->small_max_B = cut;
        out->alpha_small_s = theta[2];
        out->beta_small_Bps = 1.0 / theta[3];
    }
    out->reduce_Bps = theta[4] > 0 ? 1.0 / theta[4] : 0;
    double ss = 0;
    for (int i = 0; i < m; i++) {
        double r = rel_residual(&s[i], cut, theta);
        ss += r * r;
        if (fabs(r) > out->max_rel)
            out->max_rel = fabs(r);
    }
    out->rms_rel = m > 0 ? sqrt(ss / m) : 0;
    free(s), free(sizes);
    return FF_OK;
}

double ff_coll_fit_predict(const ff_coll_fit_result *f, const ff_coll_sample *s)
{
    int small = f->small_max_B > 0 && s->msg_bytes <= f->small_max_B;
    double alpha = small ? f->alpha_small_s : f->alpha_s;
    double beta = small ? f->beta_small_Bps : f->beta_Bps;
    double t = s->steps * alpha + (beta > 0 ? s->steps * s->msg_bytes / beta : 0);
    return t + (f->reduce_Bps > 0 ? s->add_bytes / f->reduce_Bps : 0);
}
