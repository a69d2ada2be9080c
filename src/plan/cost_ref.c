/* The two reference cost models, kept literal so results can be compared
 * with the literature (docs/planner.md has the worked examples):
 *
 * paper: equations 5.1-5.7 of the dissertation (§5.1.2; equations 4-10 of the
 *   4D paper's §V): ring collectives, no latency, no compute, placement-aware
 *   bandwidth, summed over the four linear layers of a block times L.
 *
 * axonn: AxoNN's published tool (Megatron-AxoNN's communication model) as
 *   the planner issue states its rules: powers of two, its own nesting (Gc
 *   innermost, then Gr, Gd, Gdata), 2-byte activations and weights, 4-byte
 *   data-parallel gradients, the forward all-reduce counted twice
 *   (recompute), three Z collectives per layer per micro-batch, volumes in
 *   GiB over bandwidths in GB/s. */
#include <string.h>

#include "plan/plan_internal.h"

/* ---- paper ---- */

void plan_eval_paper(const ff_plan_config *cfg, ff_dims g, ff_plan_result *r)
{
    ff_plan_link link[FF_PLAN_NGROUPS];
    plan_links(&cfg->machine, g, 1, 1, link); /* the paper's own placement rule */
    memcpy(r->link, link, sizeof link);
    const double C = (double)cfg->model.hidden, es = cfg->wire_bytes;
    /* m: the rows of the input of one data-parallel replica */
    const double m = (double)cfg->batch * (double)cfg->seq / g.d;
    const double gz = g.z, gd = g.d;
    const double bz = link[FF_GROUP_Z].beta_Bps, bd = link[FF_GROUP_D].beta_Bps;
    const struct {
        double k, n;
        int transposed;
    } layer[4] = {{C, 3 * C, 0}, {C, C, 1}, {C, 4 * C, 0}, {4 * C, C, 1}};
    for (int i = 0; i < 4; i++) {
        double k = layer[i].k, n = layer[i].n;
        /* a transposed layer swaps Gx and Gy, and their bandwidths */
        int T = layer[i].transposed;
        double gx = T ? g.y : g.x, gy = T ? g.x : g.y;
        double bx = link[T ? FF_GROUP_Y : FF_GROUP_X].beta_Bps;
        double by = link[T ? FF_GROUP_X : FF_GROUP_Y].beta_Bps;
        double t_ag = (gz - 1) * (k * n / (gx * gy * gz)) * es / bz;           /* 5.1 */
        double t_rs = (gz - 1) / gz * (k * n / (gx * gy)) * es / bz;           /* 5.2 */
        double t_ary = 2 * (gy - 1) / gy * (m * n / (gz * gx)) * es / by;      /* 5.3 */
        double t_arx = 2 * (gx - 1) / gx * (m * k / (gz * gy)) * es / bx;      /* 5.4 */
        double t_ard = 2 * (gd - 1) / gd * (k * n / (gx * gy * gz)) * es / bd; /* 5.5 */
        /* booked on the group that physically carries it */
        r->coll[FF_GROUP_Z][FF_COLL_ALLGATHER].time_s += t_ag;
        r->coll[FF_GROUP_Z][FF_COLL_REDUCE_SCATTER].time_s += t_rs;
        r->coll[T ? FF_GROUP_X : FF_GROUP_Y][FF_COLL_ALLREDUCE].time_s += t_ary;
        r->coll[T ? FF_GROUP_Y : FF_GROUP_X][FF_COLL_ALLREDUCE].time_s += t_arx;
        r->coll[FF_GROUP_D][FF_COLL_ALLREDUCE].time_s += t_ard;
    }
    double total = 0;
    for (int k = 0; k < FF_NGROUPS; k++)
        for (int c = 0; c < FF_NCOLL; c++) {
            r->coll[k][c].time_s *= cfg->model.layers; /* 5.6 over every block */
            total += r->coll[k][c].time_s;
        }
    r->comm_s = r->step_s = r->exposed_s = total;
}

/* ---- axonn ---- */

/* The tool's tables (GB/s) by stride `inner` and group size; for a machine
 * without one, the profile's links by the paper's rule, in GB/s. */
double plan_axonn_bw(const ff_profile *p, int inner, int size)
{
    switch (p->axonn_table) {
    case FF_AXONN_TABLE_PERLMUTTER:
        if (inner == 1)
            return size == 2 ? 76 : size == 4 ? 225 : 80;
        if (inner == 2)
            return size == 2 ? 76 : 40;
        return 20;
    case FF_AXONN_TABLE_FRONTIER:
        if (inner == 1)
            return size == 2 ? 129 : size == 4 ? 52 : size == 8 ? 135 : 40;
        if (inner == 2)
            return size == 2 ? 50 : size == 4 ? 72 : 20;
        if (inner == 4)
            return size == 2 ? 36 : 10;
        return 5;
    default: {
        ff_plan_link l = plan_link(p, 0, inner, size, 1);
        return l.beta_Bps / 1e9;
    }
    }
}

double ff_plan_axonn_bandwidth(const ff_profile *p, int inner, int size)
{
    return plan_axonn_bw(p, inner, size);
}

typedef struct {
    double col, row, depth, data;
} axonn_terms;

/* One layer of width factor K (weight K H^2), in GiB / (GB/s). The order of
 * the arithmetic follows the tool's, so sums (and ties) come out bit for bit
 * as it computes them. */
static axonn_terms axonn_layer(const ff_plan_config *cfg, double K, int transposed, int corrected,
                               int gr, int gc, int gd, int gdata)
{
    const ff_profile *p = &cfg->machine;
    const double B = (double)cfg->batch, S = (double)cfg->seq, H = (double)cfg->model.hidden;
    double dp =
        4.0 * (gdata - 1) / gdata * K * H * H / (double)(gc * gr * gd) * 2 / 1024 / 1024 / 1024;
    double depth =
        3.0 / 2 * 2 * (gd - 1) / gd * K * H * H / (double)(gc * gr) * 2 / 1024 / 1024 / 1024;
    depth *= cfg->grad_acc;
    double row, col;
    if (!transposed) {
        /* forward output all-reduced over Gc (twice: recompute), input
         * gradient over Gr */
        row = 2.0 * (gr - 1) / gr * (B / gdata / gd * S * H / gc) * 2 / 1024 / 1024 / 1024;
        col = 2.0 * 2 * (gc - 1) / gc * (B / gdata / gd * S * K * H / gr) * 2 / 1024 / 1024 / 1024;
    } else if (!corrected) {
        /* the tool's transposed layer: K on the Gr term */
        row = 2.0 * 2 * (gr - 1) / gr * (B / gdata / gd * S * K * H / gc) * 2 / 1024 / 1024 / 1024;
        col = 2.0 * (gc - 1) / gc * (B / gdata / gd * S * H / gr) * 2 / 1024 / 1024 / 1024;
    } else {
        /* what a transposed layer (K H in, H out) sends: its forward output
         * (H wide, split over Gc) all-reduced over Gr twice, its input
         * gradient (K H wide, split over Gr) over Gc */
        row = 2.0 * 2 * (gr - 1) / gr * (B / gdata / gd * S * H / gc) * 2 / 1024 / 1024 / 1024;
        col = 2.0 * (gc - 1) / gc * (B / gdata / gd * S * K * H / gr) * 2 / 1024 / 1024 / 1024;
    }
    axonn_terms t = {0, 0, 0, 0};
    int ip = 1; /* Gc innermost, then Gr, Gd, Gdata */
    if (gc > 1)
        t.col = col / plan_axonn_bw(p, ip, gc);
    ip *= gc;
    if (gr > 1)
        t.row = row / plan_axonn_bw(p, ip, gr);
    ip *= gr;
    if (gd > 1)
        t.depth = depth / plan_axonn_bw(p, ip, gd);
    ip *= gd;
    if (gdata > 1)
        t.data = dp / plan_axonn_bw(p, ip, gdata);
    return t;
}

double plan_eval_axonn(const ff_plan_config *cfg, int gr, int gc, int gd, int gdata, int corrected,
                       ff_plan_result *r)
{
    /* QKV (3h, normal), projection (h, transposed), MLP up (4h, normal),
     * MLP down (4h, transposed) */
    static const struct {
        double K;
        int transposed;
    } layer[4] = {{3, 0}, {1, 1}, {4, 0}, {4, 1}};
    double block = 0;
    double L = cfg->model.layers;
    for (int i = 0; i < 4; i++) {
        axonn_terms t =
            axonn_layer(cfg, layer[i].K, layer[i].transposed, corrected, gr, gc, gd, gdata);
        block += t.col + t.row + t.depth + t.data;
        r->axonn_col_s += t.col * L;
        r->axonn_row_s += t.row * L;
        r->axonn_depth_s += t.depth * L;
        r->axonn_data_s += t.data * L;
    }
    r->grid = (ff_dims){gr, gc, gd, gdata};
    r->comm_s = r->step_s = r->exposed_s = block * L;
    return block; /* the tool ranks by this sum and multiplies by L to print */
}
