/* Per-layer plans (include/fourfold/layerplan.h) and the planner's model of
 * them (docs/planner.md, "Per-layer plans"). Runs without MPI.
 *
 *   file        to_json -> parse and write -> read give the same plan;
 *               malformed, other-format, other-version, duplicated,
 *               unknown, missing and out-of-range keys, and a block count
 *               other than "layers", are refused with their codes and a
 *               message naming the file
 *   match       another model or grid is refused, every difference named
 *   uniform     a plan with the uniform configuration's options predicts
 *               the same step (every field, ==) and traffic (every rank)
 *   traffic     decomposition into k chunks: k calls of the chunks' rows,
 *               the ring's bytes derived here again
 *   sign        decomposition loses on a tiny model on one node with a high
 *               latency (a lower bound on the loss from the model's
 *               formula) and wins on large matrices over a slow link
 *               between nodes (the exact difference from the formula)
 *   search      coordinate descent finds the exhaustive optimum of a small
 *               space; Metropolis-Hastings is deterministic and never worse
 *               than its start; ff_plan_per_layer fills the plan */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fourfold/plan.h"
#include "plan/plan_internal.h"
#include "test_util.h"
#include "util/file.h" /* ff_write_file_atomic */

static char dir[64];

/* ---- helpers ---- */

static int same_opts(const ff_layer_opts *a, const ff_layer_opts *b)
{
    return a->decompose == b->decompose && a->oar == b->oar && a->ors == b->ors &&
           a->oag == b->oag && a->ag_cache == b->ag_cache && a->wire_bytes == b->wire_bytes &&
           a->rs_cmm == b->rs_cmm;
}

static int same_plan(const ff_layer_plan *a, const ff_layer_plan *b)
{
    if (a->layers != b->layers || a->heads != b->heads || a->hidden != b->hidden ||
        a->vocab != b->vocab || a->grid.x != b->grid.x || a->grid.y != b->grid.y ||
        a->grid.z != b->grid.z || a->grid.d != b->grid.d || a->batch != b->batch ||
        a->seq != b->seq || a->micro_batches != b->micro_batches ||
        a->predicted_step_s != b->predicted_step_s || a->progress != b->progress ||
        !same_opts(&a->head, &b->head))
        return 0;
    for (int l = 0; l < a->layers; l++) {
        if (a->blocks[l].checkpoint != b->blocks[l].checkpoint)
            return 0;
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            if (!same_opts(&a->blocks[l].layer[i], &b->blocks[l].layer[i]))
                return 0;
    }
    return 1;
}

/* A plan of `layers` blocks whose options all differ from block to block. */
static void varied_plan(ff_layer_plan *p, int layers)
{
    static const int dec[] = {0, 1, 2, 3, 8, 64};
    ff_layer_opts o;
    ff_layer_opts_default(&o);
    int rc = ff_layer_plan_uniform(p, layers, &o, 0, NULL, 0);
    CHECK(rc == FF_OK, "ff_layer_plan_uniform: %d", rc);
    p->heads = 4, p->hidden = 64, p->vocab = 500;
    p->grid = (ff_dims){2, 1, 2, 2};
    p->batch = 16, p->seq = 32, p->micro_batches = 2;
    p->predicted_step_s = 0.1234567890123456789;
    p->head.decompose = 3, p->head.wire_bytes = 2, p->head.oag = 0;
    for (int l = 0; l < layers; l++) {
        p->blocks[l].checkpoint = l % 2;
        for (int i = 0; i < FF_BLOCK_LAYERS; i++) {
            ff_layer_opts *x = &p->blocks[l].layer[i];
            int v = 4 * l + i;
            x->decompose = dec[v % 6];
            x->oar = v % 2, x->ors = v / 2 % 2, x->oag = v / 3 % 2, x->ag_cache = v / 5 % 2;
            x->wire_bytes = v % 3 ? 4 : 2;
        }
    }
}

/* text with the first `from` replaced by `to` (malloc'd) */
static char *replaced(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    CHECK(at, "'%s' is not in the plan's text", from);
    if (!at)
        at = text + strlen(text);
    size_t a = (size_t)(at - text), n = strlen(text), f = at < text + n ? strlen(from) : 0;
    char *s = malloc(n - f + strlen(to) + 1);
    memcpy(s, text, a);
    strcpy(s + a, to);
    strcat(s, at + f);
    return s;
}

static void refused(const char *label, const char *text, int code, const char *needle)
{
    ff_layer_plan p;
    char err[512] = "";
    int rc = ff_layer_plan_parse(text, strlen(text), "bad.json", &p, err, sizeof err);
    CHECK(rc == code, "%s: code %d, want %d (%s)", label, rc, code, err);
    CHECK(strstr(err, "bad.json") && strstr(err, needle), "%s: '%s' lacks the file or '%s'", label,
          err, needle);
    CHECK(p.blocks == NULL, "%s: blocks left allocated", label);
    printf("  refused %-28s %3d  %s\n", label, rc, err);
}

/* ---- the file ---- */

static void test_file(void)
{
    printf("file: round trip, then refusals\n");
    ff_layer_plan a, b;
    char err[512];
    varied_plan(&a, 5);
    char *text = ff_layer_plan_to_json(&a);
    CHECK(text != NULL, "to_json: NULL");
    int rc = ff_layer_plan_parse(text, strlen(text), "text", &b, err, sizeof err);
    CHECK(rc == FF_OK && same_plan(&a, &b), "to_json -> parse: rc %d (%s), same %d", rc, err,
          rc == FF_OK && same_plan(&a, &b));
    ff_layer_plan_free(&b);
    printf("  to_json -> parse: the same plan (%zu bytes, 5 blocks)\n", strlen(text));

    char path[128], tmp[160];
    snprintf(path, sizeof path, "%s/plan.json", dir);
    CHECK(ff_write_file_atomic(path, "old", 3) == 0, "cannot write %s", path);
    rc = ff_layer_plan_write(&a, path, err, sizeof err);
    CHECK(rc == FF_OK, "write: %s", err);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(access(tmp, F_OK) != 0, "write left %s", tmp);
    rc = ff_layer_plan_read(path, &b, err, sizeof err);
    CHECK(rc == FF_OK && same_plan(&a, &b), "write -> read: rc %d (%s)", rc, err);
    ff_layer_plan_free(&b);
    printf("  write (over an old file) -> read: the same plan, no temporary file left\n");

    /* a plan that does not check is not written, and the old file stays */
    a.blocks[1].layer[2].oar = 2;
    rc = ff_layer_plan_write(&a, path, err, sizeof err);
    CHECK(rc == FF_EINVAL && strstr(err, "block 1 fc") && strstr(err, "oar is 2"),
          "write of a bad plan: %d %s", rc, err);
    rc = ff_layer_plan_read(path, &b, err, sizeof err);
    CHECK(rc == FF_OK, "the old file after a refused write: %s", err);
    ff_layer_plan_free(&b);
    a.blocks[1].layer[2].oar = 0;

    /* the refusals: an edit of the valid text each */
    struct {
        const char *label, *from, *to;
        int code;
        const char *needle;
    } cases[] = {
        {"other format", "fourfold-layer-plan", "fourfold-profile", FF_ECORRUPT, "format"},
        {"version 4", "\"version\": 1", "\"version\": 4", FF_ECORRUPT, "version 4"},
        {"no version", "\"version\": 1,", "", FF_ECORRUPT, "version"},
        {"version as a string", "\"version\": 1", "\"version\": \"1\"", FF_ECORRUPT, "version"},
        {"duplicate key", "\"batch\": 16,", "\"batch\": 16, \"batch\": 16,", FF_EINVAL,
         "\"batch\" appears twice"},
        {"duplicate layer key", "\"oar\": 0,", "\"oar\": 0, \"oar\": 0,", FF_EINVAL,
         "\"oar\" appears twice"},
        {"duplicate block", "\"checkpoint\": 0,", "\"checkpoint\": 0, \"checkpoint\": 1,",
         FF_EINVAL, "appears twice"},
        {"unknown key", "\"seq\": 32", "\"sequence\": 32", FF_EINVAL, "unknown key"},
        {"missing key", "\"micro_batches\": 2, ", "", FF_EINVAL, "lacks \"micro_batches\""},
        {"missing layer key", "\"ag_cache\": 0, ", "", FF_EINVAL, "lacks \"ag_cache\""},
        {"decompose 65", "\"decompose\": 64", "\"decompose\": 65", FF_EINVAL, "decompose"},
        {"decompose -1", "\"decompose\": 0", "\"decompose\": -1", FF_EINVAL, "decompose"},
        {"oar 2", "\"oar\": 1", "\"oar\": 2", FF_EINVAL, "\"oar\" is 2"},
        {"oar as a string", "\"oar\": 1", "\"oar\": \"1\"", FF_EINVAL, "must be a number"},
        {"checkpoint 0.5", "\"checkpoint\": 1", "\"checkpoint\": 0.5", FF_EINVAL,
         "expected an integer"},
        {"wire fp16", "\"wire\": \"fp32\"", "\"wire\": \"fp16\"", FF_EINVAL, "fp16"},
        {"wire as a number", "\"wire\": \"fp32\"", "\"wire\": 4", FF_EINVAL, "wire"},
        {"grid with a 0", "[2, 1, 2, 2]", "[2, 0, 2, 2]", FF_EINVAL, "grid"},
        {"grid of three", "[2, 1, 2, 2]", "[2, 1, 2]", FF_EINVAL, "3 sizes"},
        {"0 layers", "\"layers\": 5", "\"layers\": 0", FF_EINVAL, "layers"},
        {"6 layers, 5 blocks", "\"layers\": 5", "\"layers\": 6", FF_EINVAL,
         "\"blocks\" has 5 entries but the model has 6 layers"},
        {"4 layers, 5 blocks", "\"layers\": 5", "\"layers\": 4", FF_EINVAL, "5 entries"},
        {"hidden % heads", "\"hidden\": 64", "\"hidden\": 66", FF_EINVAL, "divisible by heads"},
        {"negative step", "\"predicted_step_s\": 0.", "\"predicted_step_s\": -0.", FF_EINVAL,
         "predicted_step_s"},
        {"malformed", "\"head\": {", "\"head\" {", FF_ECORRUPT, "expected ':'"},
        {"text after", "]}\n", "]} x", FF_ECORRUPT, "after the plan"},
        {"blocks not a list", "\"blocks\": [", "\"blocks\": 5, \"more\": [", FF_EINVAL,
         "must be a list"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *t = replaced(text, cases[i].from, cases[i].to);
        refused(cases[i].label, t, cases[i].code, cases[i].needle);
        free(t);
    }
    /* version 2: the progress mode the plan was searched for; a plan
     * without one (progress -1, as above) is written as version 1 */
    CHECK(strstr(text, "\"version\": 1,") && !strstr(text, "progress"),
          "a plan without a progress mode is not written as version 1");
    a.progress = FF_PROGRESS_THREAD;
    char *text2 = ff_layer_plan_to_json(&a);
    CHECK(text2 && strstr(text2, "\"version\": 2,") && strstr(text2, "\"progress\": \"thread\""),
          "version 2 text: %.120s", text2 ? text2 : "(null)");
    rc = ff_layer_plan_parse(text2, strlen(text2), "text2", &b, err, sizeof err);
    CHECK(rc == FF_OK && same_plan(&a, &b) && b.progress == FF_PROGRESS_THREAD,
          "version 2 round trip: rc %d (%s)", rc, err);
    ff_layer_plan_free(&b);
    printf("  version 2 (progress thread) -> parse: the same plan\n");
    struct {
        const char *label, *from, *to;
        const char *needle;
    } cases2[] = {
        {"no progress", "\"progress\": \"thread\", ", "", "lacks \"progress\""},
        {"progress fast", "\"thread\"", "\"fast\"", "expected wait, poll or thread"},
        {"progress as a number", "\"thread\"", "2", "must be a string"},
        {"progress in version 1", "\"version\": 2", "\"version\": 1", "not a key of version 1"},
    };
    for (size_t i = 0; i < sizeof cases2 / sizeof cases2[0]; i++) {
        char *t = replaced(text2, cases2[i].from, cases2[i].to);
        refused(cases2[i].label, t, FF_EINVAL, cases2[i].needle);
        free(t);
    }
    free(text2);
    a.progress = -1;

    /* version 3: the reduce-scatter collective matmul per layer, written
     * only when a layer has it on; "progress" optional there */
    a.blocks[a.layers - 1].layer[FF_BLOCK_FC].rs_cmm = 1;
    char *text3 = ff_layer_plan_to_json(&a);
    CHECK(text3 && strstr(text3, "\"version\": 3,") && strstr(text3, "\"rs_cmm\": 1") &&
              !strstr(text3, "progress"),
          "version 3 text: %.120s", text3 ? text3 : "(null)");
    rc = ff_layer_plan_parse(text3, strlen(text3), "text3", &b, err, sizeof err);
    CHECK(rc == FF_OK && same_plan(&a, &b) && b.blocks[a.layers - 1].layer[FF_BLOCK_FC].rs_cmm,
          "version 3 round trip: rc %d (%s)", rc, err);
    ff_layer_plan_free(&b);
    printf("  version 3 (rs_cmm on in one layer) -> parse: the same plan\n");
    struct {
        const char *label, *from, *to;
        const char *needle;
    } cases3[] = {
        {"no rs_cmm", ", \"rs_cmm\": 0}", "}", "lacks \"rs_cmm\""},
        {"rs_cmm 2", "\"rs_cmm\": 1", "\"rs_cmm\": 2", "rs_cmm"},
        {"rs_cmm in version 2", "\"version\": 3", "\"version\": 2", "not a key of version 2"},
    };
    for (size_t i = 0; i < sizeof cases3 / sizeof cases3[0]; i++) {
        char *t = replaced(text3, cases3[i].from, cases3[i].to);
        refused(cases3[i].label, t, FF_EINVAL, cases3[i].needle);
        free(t);
    }
    free(text3);
    a.blocks[a.layers - 1].layer[FF_BLOCK_FC].rs_cmm = 0;

    /* cut short, and a NUL inside */
    char *cut = strdup(text);
    cut[strlen(cut) / 2] = '\0';
    refused("cut in half", cut, FF_ECORRUPT, "bad.json: line");
    free(cut);
    char nul[] = "{\"format\": \"fourfold-layer-plan\"\0}";
    ff_layer_plan p;
    rc = ff_layer_plan_parse(nul, sizeof nul - 1, "bad.json", &p, err, sizeof err);
    CHECK(rc == FF_ECORRUPT && strstr(err, "NUL"), "NUL byte: %d %s", rc, err);
    /* files: none, empty */
    snprintf(path, sizeof path, "%s/none.json", dir);
    rc = ff_layer_plan_read(path, &p, err, sizeof err);
    CHECK(rc == FF_EIO && strstr(err, "none.json"), "missing file: %d %s", rc, err);
    snprintf(path, sizeof path, "%s/empty.json", dir);
    ff_write_file_atomic(path, "", 0);
    rc = ff_layer_plan_read(path, &p, err, sizeof err);
    CHECK(rc == FF_ECORRUPT && strstr(err, "empty"), "empty file: %d %s", rc, err);
    printf("  refused a file that does not exist (%d) and an empty one (%d)\n", FF_EIO,
           FF_ECORRUPT);
    free(text);
    ff_layer_plan_free(&a);
}

static void test_match(void)
{
    printf("match\n");
    ff_layer_plan p;
    char err[512];
    varied_plan(&p, 3); /* layers 3, heads 4, hidden 64, vocab 500, grid 2x1x2x2 */
    int rc = ff_layer_plan_match(&p, 3, 4, 64, 500, (ff_dims){2, 1, 2, 2}, err, sizeof err);
    CHECK(rc == FF_OK, "the plan's own model and grid: %d %s", rc, err);
    rc = ff_layer_plan_match(&p, 12, 4, 768, 500, (ff_dims){2, 1, 2, 2}, err, sizeof err);
    CHECK(rc == FF_EINVAL && strstr(err, "layers=3 hidden=64;") &&
              strstr(err, "layers=12 hidden=768") && !strstr(err, "heads") && !strstr(err, "grid"),
          "another model: %d '%s'", rc, err);
    printf("  another model: %s\n", err);
    rc = ff_layer_plan_match(&p, 3, 4, 64, 500, (ff_dims){1, 2, 2, 2}, err, sizeof err);
    CHECK(rc == FF_EINVAL && strstr(err, "grid 2x1x2x2;") && strstr(err, "grid 1x2x2x2") &&
              !strstr(err, "layers"),
          "another grid: %d '%s'", rc, err);
    printf("  another grid: %s\n", err);
    rc = ff_layer_plan_match(&p, 3, 8, 64, 50257, (ff_dims){2, 1, 2, 1}, err, sizeof err);
    CHECK(rc == FF_EINVAL && strstr(err, "heads=4 vocab=500 grid 2x1x2x2;") &&
              strstr(err, "heads=8 vocab=50257 grid 2x1x2x1"),
          "three differences: %d '%s'", rc, err);
    printf("  three differences: %s\n", err);

    /* the planner takes a plan for its model and grid only */
    ff_plan_config cfg;
    ff_plan_config_default(&cfg);
    cfg.model = (ff_model){.name = "t", .layers = 3, .heads = 4, .hidden = 64, .vocab = 500};
    cfg.batch = 16, cfg.seq = 32;
    cfg.layers = &p;
    ff_plan_result r;
    rc = ff_plan_evaluate(&cfg, (ff_dims){2, 1, 2, 2}, &r, err, sizeof err);
    CHECK(rc == FF_OK && !r.rejected, "evaluate on the plan's grid: %d %s %s", rc, err, r.reason);
    rc = ff_plan_evaluate(&cfg, (ff_dims){1, 1, 2, 4}, &r, err, sizeof err);
    CHECK(rc == FF_EINVAL && strstr(err, "grid 2x1x2x2; this run has grid 1x1x2x4"),
          "evaluate on another grid: %d %s", rc, err);
    ff_plan_coll t[FF_PLAN_NGROUPS][FF_NCOLL];
    rc = ff_plan_traffic(&cfg, (ff_dims){1, 1, 2, 4}, (ff_dims){0, 0, 0, 0}, t, err, sizeof err);
    CHECK(rc == FF_EINVAL, "traffic on another grid: %d %s", rc, err);
    cfg.ranks = 8;
    ff_plan *plan;
    rc = ff_plan_create(&plan, &cfg);
    CHECK(rc == FF_EINVAL && strstr(ff_plan_error(plan), "one grid"), "ranking with a plan: %d %s",
          rc, ff_plan_error(plan));
    ff_plan_destroy(plan);
    cfg.cost = FF_COST_PAPER;
    rc = ff_plan_evaluate(&cfg, (ff_dims){2, 1, 2, 2}, &r, err, sizeof err);
    CHECK(rc == FF_EINVAL && strstr(err, "full cost model"), "paper with a plan: %d %s", rc, err);
    ff_layer_plan_free(&p);
}

/* ---- the uniform plan predicts the uniform configuration ---- */

/* The plan that says what cfg says on grid g (r: cfg's evaluation there):
 * checkpointing as resolved, the last r->ag_cache blocks cached and wte
 * when all are, the overlap bits, the wire, no decomposition. */
static void mirror(const ff_plan_config *cfg, ff_dims g, const ff_plan_result *r, ff_layer_plan *p)
{
    int L = cfg->model.layers;
    ff_layer_opts o = {0,
                       !!(cfg->overlap & FF_OVERLAP_OAR),
                       !!(cfg->overlap & FF_OVERLAP_ORS),
                       !!(cfg->overlap & FF_OVERLAP_OAG),
                       1,
                       cfg->wire_bytes,
                       cfg->rs_cmm};
    ff_layer_plan_uniform(p, L, &o, r->checkpoint, NULL, 0);
    p->heads = cfg->model.heads, p->hidden = cfg->model.hidden, p->vocab = cfg->model.vocab;
    p->grid = g;
    p->head.ag_cache = r->ag_cache >= L;
    for (int l = 0; l < L; l++)
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            p->blocks[l].layer[i].ag_cache = l >= L - r->ag_cache;
}

static int same_result(const ff_plan_result *a, const ff_plan_result *b)
{
    const double x[] = {a->step_s,
                        a->compute_s,
                        a->exposed_s,
                        a->hidden_s,
                        a->comm_s,
                        a->gemm_s,
                        a->attention_s,
                        a->elementwise_s,
                        a->optimizer_s,
                        a->mem_params,
                        a->mem_grads,
                        a->mem_optimizer,
                        a->mem_weight_buffers,
                        a->mem_activations,
                        a->mem_total,
                        a->flops_per_rank_s};
    const double y[] = {b->step_s,
                        b->compute_s,
                        b->exposed_s,
                        b->hidden_s,
                        b->comm_s,
                        b->gemm_s,
                        b->attention_s,
                        b->elementwise_s,
                        b->optimizer_s,
                        b->mem_params,
                        b->mem_grads,
                        b->mem_optimizer,
                        b->mem_weight_buffers,
                        b->mem_activations,
                        b->mem_total,
                        b->flops_per_rank_s};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
        if (x[i] != y[i])
            return 0;
    if (a->rejected != b->rejected || a->bytes_recv != b->bytes_recv)
        return 0;
    for (int k = 0; k < FF_NGROUPS; k++)
        for (int c = 0; c < FF_NCOLL; c++)
            if (memcmp(&a->coll[k][c], &b->coll[k][c], sizeof a->coll[k][c]))
                return 0;
    return 1;
}

static void test_uniform(void)
{
    printf("uniform: a plan of the configuration's own options predicts it exactly\n");
    const ff_dims grids[] = {{2, 2, 2, 1}, {1, 2, 2, 2}, {2, 1, 2, 2}, {2, 2, 1, 2}};
    struct {
        int checkpoint, ag_cache, micro, wire;
        unsigned overlap;
    } v[] = {
        {0, FF_PLAN_AUTO, 1, 4, FF_OVERLAP_ALL},
        {1, FF_PLAN_AUTO, 2, 4, FF_OVERLAP_ALL},
        {1, 1, 2, 2, FF_OVERLAP_ALL},
        {0, 0, 1, 4, FF_OVERLAP_OAR | FF_OVERLAP_DP},
        {1, 0, 1, 2, 0},
        {0, 2, 2, 4, FF_OVERLAP_OAG | FF_OVERLAP_ORS},
    };
    int runs = 0;
    /* in fp32, and in bf16-mixed (perlmutter's default), where everything
     * is sent bf16: the mirrored plan's fp32 wire changes nothing */
    for (int prec = 0; prec < 2; prec++)
        for (size_t gi = 0; gi < sizeof grids / sizeof grids[0]; gi++)
            for (size_t vi = 0; vi < sizeof v / sizeof v[0]; vi++) {
                ff_plan_config cfg;
                ff_plan_config_default(&cfg);
                cfg.model = (ff_model){
                    .name = "small", .layers = 3, .heads = 2, .hidden = 16, .vocab = 100};
                cfg.batch = 8, cfg.seq = 4;
                cfg.precision = prec ? FF_PLAN_BF16_MIXED : FF_PLAN_FP32;
                ff_profile_preset("perlmutter", &cfg.machine, NULL, 0);
                cfg.machine.ranks_per_node = 4;
                cfg.checkpoint = v[vi].checkpoint, cfg.ag_cache = v[vi].ag_cache;
                cfg.micro_batches = v[vi].micro, cfg.wire_bytes = v[vi].wire;
                cfg.overlap = v[vi].overlap;
                ff_dims g = grids[gi];
                ff_plan_result r0, r1;
                char err[256];
                int rc = ff_plan_evaluate(&cfg, g, &r0, err, sizeof err);
                CHECK(rc == FF_OK && !r0.rejected, "uniform: %s %s", err, r0.reason);
                ff_layer_plan p;
                mirror(&cfg, g, &r0, &p);
                cfg.layers = &p;
                rc = ff_plan_evaluate(&cfg, g, &r1, err, sizeof err);
                CHECK(rc == FF_OK && same_result(&r0, &r1),
                      "grid %dx%dx%dx%d variant %zu: the plan's step %.17g, the configuration's "
                      "%.17g (%s)",
                      g.x, g.y, g.z, g.d, vi, r1.step_s, r0.step_s, err);
                /* the traffic of every rank */
                for (int rank = 0; rank < g.x * g.y * g.z * g.d; rank++) {
                    ff_dims c = ff_grid_coords_of(g, rank);
                    ff_plan_coll t0[FF_PLAN_NGROUPS][FF_NCOLL], t1[FF_PLAN_NGROUPS][FF_NCOLL];
                    cfg.layers = NULL;
                    ff_plan_traffic(&cfg, g, c, t0, err, sizeof err);
                    cfg.layers = &p;
                    rc = ff_plan_traffic(&cfg, g, c, t1, err, sizeof err);
                    CHECK(rc == FF_OK && !memcmp(t0, t1, sizeof t0),
                          "grid %dx%dx%dx%d variant %zu rank %d: traffic differs", g.x, g.y, g.z,
                          g.d, vi, rank);
                }
                ff_layer_plan_free(&p);
                runs++;
            }
    /* ff_layer_plan_uniform's default options are the configuration's
     * defaults (every overlap, every layer cached, fp32) */
    ff_plan_config cfg;
    ff_plan_config_default(&cfg);
    cfg.model = (ff_model){.name = "small", .layers = 3, .heads = 2, .hidden = 16, .vocab = 100};
    cfg.batch = 8, cfg.seq = 4, cfg.checkpoint = 0;
    ff_layer_opts o;
    ff_layer_opts_default(&o);
    ff_layer_plan p;
    ff_layer_plan_uniform(&p, 3, &o, 0, NULL, 0);
    p.heads = 2, p.hidden = 16, p.vocab = 100, p.grid = (ff_dims){2, 1, 2, 1};
    ff_plan_result r0, r1;
    char err[256];
    ff_plan_evaluate(&cfg, p.grid, &r0, err, sizeof err);
    cfg.layers = &p;
    int rc = ff_plan_evaluate(&cfg, p.grid, &r1, err, sizeof err);
    CHECK(rc == FF_OK && same_result(&r0, &r1), "default options: %.17g vs %.17g", r1.step_s,
          r0.step_s);
    ff_layer_plan_free(&p);
    printf("  %d (precision, grid, variant) triples and the default options: every field and "
           "every rank's traffic equal\n",
           runs);
    CHECK(runs == 2 * 4 * 6, "%d runs", runs);
}

/* ---- traffic of decomposed all-reduces ---- */

/* The ring's volume of an all-reduce of n over p ranks at rank r, derived
 * as in test_plan_bytes: chunk i of floor(n/p) + (i < n mod p) elements;
 * the reduce-scatter phase sends all chunks but r's, receives all but
 * r-1's; the all-gather phase sends all but r+1's, receives all but r's. */
static long ring_chunk(long n, int p, int i) { return n / p + (i < n % p ? 1 : 0); }

static void ring(long n, int p, int r, long *sent, long *recv)
{
    *sent = *recv = 0;
    for (int i = 0; p > 1 && i < p; i++) {
        *sent += (i != r ? ring_chunk(n, p, i) : 0) + (i != (r + 1) % p ? ring_chunk(n, p, i) : 0);
        *recv +=
            (i != (r - 1 + p) % p ? ring_chunk(n, p, i) : 0) + (i != r ? ring_chunk(n, p, i) : 0);
    }
}

typedef struct {
    long calls, sent, recv;
} delta;

/* One all-reduce of `rows` x n decomposed into k: its k chunks' calls and
 * volume minus the whole one's. */
static void add_split(delta *d, long rows, long n, int k, int p, int r)
{
    if (p == 1)
        return;
    long s, v;
    ring(rows * n, p, r, &s, &v);
    d->calls -= 1, d->sent -= s, d->recv -= v;
    for (int i = 0; i < k; i++) {
        long c = rows * (i + 1) / k - rows * i / k; /* the rows of chunk i */
        ring(c * n, p, r, &s, &v);
        d->calls += 1, d->sent += s, d->recv += v;
    }
}

static void test_traffic(void)
{
    printf("traffic: decompose = k is k calls of the chunks' rows (ring volumes derived here)\n");
    /* grid 2x3x1x1, C = 12, V = 100 padded to 128: the LM head's logits,
     * rows x 64 over Y's 3 ranks, cut unevenly by the ring; micro-batches
     * of 9 rows (3 sequences of 3 tokens): k = 4 cuts them 2, 2, 2, 3 */
    ff_plan_config cfg;
    ff_plan_config_default(&cfg);
    cfg.model = (ff_model){.name = "small", .layers = 2, .heads = 2, .hidden = 12, .vocab = 100};
    cfg.seq = 3;
    cfg.checkpoint = 1, cfg.ag_cache = 0;
    cfg.panel_rows = 1; /* chunks of whole rows: chunk i is [rows i/k, rows (i+1)/k) */
    /* no latency and one bandwidth: AUTO keeps the ring (test_plan_bytes) */
    cfg.coll.alpha_intra_s = cfg.coll.alpha_inter_s = 0;
    cfg.coll.beta_intra_Bps = cfg.coll.beta_inter_Bps;
    const ff_dims g = {2, 3, 1, 1};
    const long C = 12, Vp = 128;
    const int ks[] = {2, 3, 4, 7};
    for (int micro = 1; micro <= 2; micro++)
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            const int k = ks[ki], L = 2;
            cfg.micro_batches = micro;
            cfg.batch = 3 * micro;
            const long m = 9; /* rows per micro-batch */
            ff_plan_result r0;
            char err[256];
            cfg.layers = NULL;
            ff_plan_evaluate(&cfg, g, &r0, err, sizeof err);
            ff_layer_plan p;
            mirror(&cfg, g, &r0, &p);
            p.head.decompose = k;
            for (int l = 0; l < L; l++)
                for (int i = 0; i < FF_BLOCK_LAYERS; i++)
                    p.blocks[l].layer[i].decompose = k;
            for (int rank = 0; rank < 6; rank++) {
                ff_dims c = ff_grid_coords_of(g, rank);
                ff_plan_coll t0[FF_PLAN_NGROUPS][FF_NCOLL], tk[FF_PLAN_NGROUPS][FF_NCOLL];
                cfg.layers = NULL;
                ff_plan_traffic(&cfg, g, c, t0, err, sizeof err);
                cfg.layers = &p;
                int rc = ff_plan_traffic(&cfg, g, c, tk, err, sizeof err);
                CHECK(rc == FF_OK, "traffic: %s", err);
                /* per micro-batch: the forward (and, checkpointed, the
                 * recompute of QKV, projection, MLP up) and the backward dI
                 * of each layer, and the LM head's two */
                delta dx = {0, 0, 0}, dy = {0, 0, 0};
                for (int u = 0; u < micro; u++) {
                    for (int l = 0; l < L; l++)
                        for (int pass = 0; pass < 2; pass++) {
                            add_split(&dy, m, 3 * C / g.x, k, g.y, c.y); /* QKV forward */
                            add_split(&dx, m, C / g.y, k, g.x, c.x);     /* projection */
                            add_split(&dy, m, 4 * C / g.x, k, g.y, c.y); /* MLP up */
                            if (pass == 0)
                                add_split(&dx, m, C / g.y, k, g.x, c.x); /* MLP down */
                        }
                    for (int l = 0; l < L; l++) {
                        add_split(&dy, m, 4 * C / g.x, k, g.y, c.y); /* MLP down dI */
                        add_split(&dx, m, C / g.y, k, g.x, c.x);     /* MLP up dI */
                        add_split(&dy, m, C / g.x, k, g.y, c.y);     /* projection dI */
                        add_split(&dx, m, C / g.y, k, g.x, c.x);     /* QKV dI */
                    }
                    add_split(&dy, m, Vp / g.x, k, g.y, c.y); /* LM head forward */
                    add_split(&dx, m, C / g.y, k, g.x, c.x);  /* LM head dI */
                }
                const ff_plan_coll *x0 = &t0[FF_GROUP_X][FF_COLL_ALLREDUCE],
                                   *xk = &tk[FF_GROUP_X][FF_COLL_ALLREDUCE],
                                   *y0 = &t0[FF_GROUP_Y][FF_COLL_ALLREDUCE],
                                   *yk = &tk[FF_GROUP_Y][FF_COLL_ALLREDUCE];
                CHECK((long)xk->calls == (long)x0->calls + dx.calls &&
                          (long)xk->bytes_sent == (long)x0->bytes_sent + 4 * dx.sent &&
                          (long)xk->bytes_recv == (long)x0->bytes_recv + 4 * dx.recv,
                      "k=%d u=%d rank %d: X all-reduce %llu calls %llu/%llu B, want %ld %ld/%ld", k,
                      micro, rank, (unsigned long long)xk->calls,
                      (unsigned long long)xk->bytes_sent, (unsigned long long)xk->bytes_recv,
                      (long)x0->calls + dx.calls, (long)x0->bytes_sent + 4 * dx.sent,
                      (long)x0->bytes_recv + 4 * dx.recv);
                CHECK((long)yk->calls == (long)y0->calls + dy.calls &&
                          (long)yk->bytes_sent == (long)y0->bytes_sent + 4 * dy.sent &&
                          (long)yk->bytes_recv == (long)y0->bytes_recv + 4 * dy.recv,
                      "k=%d u=%d rank %d: Y all-reduce %llu calls %llu/%llu B, want %ld %ld/%ld", k,
                      micro, rank, (unsigned long long)yk->calls,
                      (unsigned long long)yk->bytes_sent, (unsigned long long)yk->bytes_recv,
                      (long)y0->calls + dy.calls, (long)y0->bytes_sent + 4 * dy.sent,
                      (long)y0->bytes_recv + 4 * dy.recv);
                /* k - 1 more calls per decomposed all-reduce; per
                 * micro-batch 11 on X (per block the projection twice, the
                 * MLP down, QKV's and MLP up's dI; the head's dI) and 13 on
                 * Y (QKV and MLP up twice, MLP down's and the projection's
                 * dI; the head's forward) */
                CHECK(dx.calls == 11L * micro * (k - 1) && dy.calls == 13L * micro * (k - 1),
                      "k=%d: %ld and %ld more calls", k, dx.calls, dy.calls);
                for (int gr = 0; gr < FF_NGROUPS; gr++)
                    for (int cc = 0; cc < FF_NCOLL; cc++)
                        if (!(cc == FF_COLL_ALLREDUCE && (gr == FF_GROUP_X || gr == FF_GROUP_Y)))
                            CHECK(!memcmp(&t0[gr][cc], &tk[gr][cc], sizeof t0[gr][cc]),
                                  "k=%d rank %d: group %d collective %d changed", k, rank, gr, cc);
                if (rank == 4)
                    printf("  k=%d u=%d rank (0,2): X %llu calls %llu B (none: %llu, %llu B), Y "
                           "%llu calls %llu B (none: %llu, %llu B)\n",
                           k, micro, (unsigned long long)xk->calls,
                           (unsigned long long)xk->bytes_sent, (unsigned long long)x0->calls,
                           (unsigned long long)x0->bytes_sent, (unsigned long long)yk->calls,
                           (unsigned long long)yk->bytes_sent, (unsigned long long)y0->calls,
                           (unsigned long long)y0->bytes_sent);
            }
            ff_layer_plan_free(&p);
        }
}

/* ---- when decomposition wins and loses ---- */

static void bare_machine(ff_profile *p, int rpn)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "test");
    p->ranks_per_node = rpn;
    p->memory_bytes = 1e15;
    p->gemm_flops = p->peak_flops = 1e13;
    p->alpha_intra_s = 1e-6, p->beta_intra_Bps = 1e11;
    p->alpha_inter_s = 1e-5, p->beta_inter_Bps = 1e9;
    p->mem_Bps = 1e12;
    p->gemm_half_dim = 128;
    p->intra_overlap = 1;
}

/* The step of cfg on g with every linear layer decomposed into k (0: the
 * uniform configuration). */
static ff_plan_result step_with(ff_plan_config *cfg, ff_dims g, int k)
{
    ff_plan_result r;
    char err[256];
    cfg->layers = NULL;
    ff_plan_evaluate(cfg, g, &r, err, sizeof err);
    if (k == 0)
        return r;
    ff_layer_plan p;
    mirror(cfg, g, &r, &p);
    p.head.decompose = k;
    for (int l = 0; l < p.layers; l++)
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            p.blocks[l].layer[i].decompose = k;
    cfg->layers = &p;
    int rc = ff_plan_evaluate(cfg, g, &r, err, sizeof err);
    CHECK(rc == FF_OK && !r.rejected, "decompose %d: %s %s", k, err, r.reason);
    cfg->layers = NULL;
    ff_layer_plan_free(&p);
    return r;
}

/* The model's formulas, again: a GEMM (m x k)(k x n) at rate/efficiency,
 * and a ring all-reduce of n floats on 2 ranks, 2 steps of ceil(n/2). */
static double gemm_s(const ff_profile *p, double m, double n, double k)
{
    double h = p->gemm_half_dim;
    return 2 * m * n * k / p->gemm_flops * (1 + h / m + h / n + h / k);
}

static double ar2_s(double alpha, double beta, long n)
{
    return 2 * (alpha + (double)((n + 1) / 2) * 4 / beta);
}

/* Decomposition into k = 2 of a layer whose all-reduce crosses the slow
 * link (R or C = X of 2 ranks, on two nodes), the other's group of one
 * rank. With G the GEMM on m rows, G0 = G1 = G/2 its halves (whole panels:
 * the same BLAS calls, so the same rate), A and A0 = A1 the
 * all-reduces, e and e0 = e1 the bias passes, W the dW GEMM, and the link
 * slower than the GEMMs (A0 >= G1, A1 >= e0; backward A >= W, A0 >= D1,
 * A0 + A1 >= D1 + W), the timeline gives
 *   forward  none: G + A + e             k = 2: G0 + A0 + A1 + e1
 *   backward none: D + max(A, W) = D + A k = 2: D0 + A0 + A1
 * (the chunks' all-reduces back to back; GEMM 1 and bias 0 beside them),
 * and on the side of the group of one rank the chunked GEMMs alone,
 * G0 + G1 - G. */
typedef struct {
    double delta; /* the step's change */
    int bound;    /* the link-bound conditions held */
    double late;  /* with progress poll and chunks of one panel, the step's change is
                     delta + late (below) */
    double wait;  /* with progress wait, delta + late + wait */
} layer_change;

static void fwd_on_link(layer_change *c, const ff_profile *p, long m, long nl, long kl,
                        double passes)
{
    double a = p->alpha_inter_s, b = p->beta_inter_Bps;
    /* a chunk of whole panels runs at the whole product's rate: G0 = G / 2 */
    double G = gemm_s(p, m, nl, kl), G0 = G / 2;
    double A = ar2_s(a, b, m * nl), Ac = ar2_s(a, b, m / 2 * nl);
    double e = passes * m * nl * 4 / p->mem_Bps;
    c->delta += (G0 - G) + (2 * Ac - A) + (e / 2 - e);
    c->bound &= Ac >= G0 && Ac >= e / 2;
    /* polling, chunks of one panel: all-reduce 0 starts only in its wait,
     * after GEMM 1, and all-reduce 1 right after it, beside bias 0
     * (G0 + G1 + A0 + A1 + e1): G1 later. Waiting: all-reduce 1 starts in
     * its own wait, after bias 0 (G + A0 + e0 + A1 + e1): e0 more. */
    c->late += G0;
    c->wait += e / 2;
}

static void bwd_on_link(layer_change *c, const ff_profile *p, long m, long nl, long kl)
{
    double a = p->alpha_inter_s, b = p->beta_inter_Bps;
    double D = gemm_s(p, m, kl, nl), D0 = D / 2, W = gemm_s(p, kl, nl, m);
    double A = ar2_s(a, b, m * kl), Ac = ar2_s(a, b, m / 2 * kl);
    c->delta += (D0 - D) + (2 * Ac - A);
    c->bound &= A >= W && Ac >= D0 && 2 * Ac >= D0 + W;
    /* polling, chunks and dW GEMM of one panel: the chunks start in the
     * wait after the dW GEMM (D0 + D1 + W + A0 + A1): D1 + W later; the
     * same waiting (nothing runs between the two waits) */
    c->late += D0 + W;
}

static void chunked_gemm(layer_change *c, const ff_profile *p, long m, long n, long k)
{
    double G = gemm_s(p, m, n, k);
    c->delta += 2 * (G / 2) - G; /* the same BLAS calls: no change */
}

static void test_sign(void)
{
    printf("sign: decomposition on a tiny model on one node with a high latency, and on large "
           "matrices over a slow link\n");
    ff_plan_config cfg;
    char err[256];
    ff_plan_config_default(&cfg);
    cfg.coll.alpha_intra_s = cfg.coll.alpha_inter_s = 0; /* AUTO keeps the ring */
    cfg.coll.beta_intra_Bps = cfg.coll.beta_inter_Bps;
    cfg.checkpoint = 0;
    cfg.panel_rows = 1; /* chunks of whole rows, [m i/k, m (i+1)/k) */
    /* the formulas below: chunks advance from their post (a progress
     * thread); polling is checked at the end */
    cfg.progress = FF_PROGRESS_THREAD;
    ff_dims g = {2, 1, 1, 1};

    /* Loses: L=2, C=16, 16 rows, both ranks on one node whose transfers
     * run beside compute (intra_overlap 1, the case most favourable to
     * decomposition) and alpha 1 ms. Each chunk's all-reduce costs at least
     * its 2 alpha (ring on 2 ranks), so a layer's k chunks cost at least
     * 2 (k - 1) alpha more than its one all-reduce, and overlap can hide
     * at most the layer's GEMMs and elementwise work: over the step, the
     * change is at least 2 alpha x (the extra calls) - (the uniform
     * step's GEMM and elementwise time). */
    cfg.model = (ff_model){.name = "tiny", .layers = 2, .heads = 2, .hidden = 16, .vocab = 100};
    cfg.batch = 2, cfg.seq = 8;
    bare_machine(&cfg.machine, 2);
    cfg.machine.alpha_intra_s = 1e-3;
    ff_plan_result r0 = step_with(&cfg, g, 0), r4 = step_with(&cfg, g, 4);
    long extra = (long)r4.coll[FF_GROUP_X][FF_COLL_ALLREDUCE].calls -
                 (long)r0.coll[FF_GROUP_X][FF_COLL_ALLREDUCE].calls;
    double bound = 2 * cfg.machine.alpha_intra_s * (double)extra - (r0.gemm_s + r0.elementwise_s);
    CHECK(extra == 27 && bound > 0, "tiny: %ld extra calls, bound %g", extra, bound);
    CHECK(r4.step_s - r0.step_s >= bound,
          "tiny: decomposition changes the step by %g s, the "
          "formula says at least %g s",
          r4.step_s - r0.step_s, bound);
    printf("  tiny, one node, alpha 1 ms, k=4: step %.6g s -> %.6g s (%+.4g s; at least %+.4g s "
           "from %ld extra calls)\n",
           r0.step_s, r4.step_s, r4.step_s - r0.step_s, bound, extra);
    /* and the search keeps every layer whole */
    ff_layer_plan p;
    ff_plan_result rs;
    int rc = ff_plan_per_layer(&cfg, g, 0, 1, &p, &rs, err, sizeof err);
    int any = p.head.decompose > 1;
    for (int l = 0; rc == FF_OK && l < p.layers; l++)
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            any |= p.blocks[l].layer[i].decompose > 1;
    CHECK(rc == FF_OK && !any, "tiny: the search decomposes a layer (%s)", err);
    ff_layer_plan_free(&p);

    /* Wins: L=2, C=1024, V=1000 (padded 1024), 4096 rows, the two ranks of
     * X on two nodes (1 GB/s, alpha 10 us), Y of one rank. Each layer has
     * one all-reduce on X (forward of the projection and MLP down,
     * backward of QKV, MLP up and the LM head) and a GEMM whose product
     * stays local (the other use); the difference is the sum of the
     * formulas above. */
    cfg.model = (ff_model){.name = "large", .layers = 2, .heads = 8, .hidden = 1024, .vocab = 1000};
    cfg.batch = 8, cfg.seq = 512;
    bare_machine(&cfg.machine, 1);
    const ff_profile *mp = &cfg.machine;
    const long m = 4096, C = 1024, Vp = 1024;
    layer_change block = {0, 1, 0, 0}, head = {0, 1, 0, 0};
    chunked_gemm(&block, mp, m, 3 * C / 2, C); /* QKV forward, Y */
    bwd_on_link(&block, mp, m, 3 * C / 2, C);  /* QKV dI, X */
    fwd_on_link(&block, mp, m, C, C / 2, 2);   /* projection forward, X */
    chunked_gemm(&block, mp, m, C / 2, C);     /* projection dI, Y */
    chunked_gemm(&block, mp, m, 2 * C, C);     /* MLP up forward, Y */
    bwd_on_link(&block, mp, m, 2 * C, C);      /* MLP up dI, X */
    fwd_on_link(&block, mp, m, C, 2 * C, 2);   /* MLP down forward, X */
    chunked_gemm(&block, mp, m, 2 * C, C);     /* MLP down dI, Y */
    chunked_gemm(&head, mp, m, Vp / 2, C);     /* LM head forward, Y */
    bwd_on_link(&head, mp, m, Vp / 2, C);      /* LM head dI, X */
    double want = 2 * block.delta + head.delta;
    CHECK(block.bound && head.bound, "large: the link-bound conditions do not hold");
    r0 = step_with(&cfg, g, 0);
    ff_plan_result r2 = step_with(&cfg, g, 2);
    double got = r2.step_s - r0.step_s;
    CHECK(want < 0 && got < 0, "large: the formula says %g s, the planner %g s", want, got);
    CHECK(fabs(got - want) <= 1e-9 * r0.step_s,
          "large: the planner's change %.12g s, the "
          "formula's %.12g s",
          got, want);
    printf("  large, two nodes, k=2: step %.6g s -> %.6g s (%+.6g s; the formula %+.6g s)\n",
           r0.step_s, r2.step_s, got, want);
    rc = ff_plan_per_layer(&cfg, g, 0, 1, &p, &rs, err, sizeof err);
    CHECK(rc == FF_OK && rs.step_s <= r2.step_s, "large: the search finds %g s, worse than %g",
          rs.step_s, r2.step_s);
    ff_layer_plan_free(&p);

    /* The run's default progress, polling, with GEMM panels of 2048 rows:
     * each chunk (2048 rows) and each dW GEMM (the engine's dW^T: nl <=
     * 2048 rows) is one panel, so no GEMM polls and the chunks start in
     * the waits; the chunks are the same (whole panels either way), so the
     * change is the formula's plus each layer's `late`; waiting (progress
     * only inside each chunk's own wait) adds each layer's `wait`, with
     * chunks of one panel or of two. */
    const double want_poll = want + 2 * block.late + head.late;
    const double want_wait = want_poll + 2 * block.wait + head.wait;
    const struct {
        int progress, panel_rows;
        double want;
        const char *what;
    } cases[] = {{FF_PROGRESS_POLL, 2048, want_poll, "poll, one-panel chunks"},
                 {FF_PROGRESS_WAIT, 2048, want_wait, "wait, one-panel chunks"},
                 {FF_PROGRESS_WAIT, 1024, want_wait, "wait, two-panel chunks"}};
    for (int i = 0; i < 3; i++) {
        cfg.progress = cases[i].progress;
        cfg.panel_rows = cases[i].panel_rows;
        r0 = step_with(&cfg, g, 0);
        r2 = step_with(&cfg, g, 2);
        got = r2.step_s - r0.step_s;
        CHECK(fabs(got - cases[i].want) <= 1e-9 * r0.step_s,
              "large, progress %s: the planner's change %.12g s, the formula's %.12g s",
              cases[i].what, got, cases[i].want);
        printf("  large, two nodes, k=2, progress %s: %+.6g s (the formula %+.6g s)\n",
               cases[i].what, got, cases[i].want);
    }
    /* with panels of 1024 rows the chunks' GEMMs poll (two panels each):
     * the change lies between the progress thread's and the one-panel
     * case's */
    cfg.progress = FF_PROGRESS_POLL;
    cfg.panel_rows = 1024;
    r0 = step_with(&cfg, g, 0);
    r2 = step_with(&cfg, g, 2);
    got = r2.step_s - r0.step_s;
    CHECK(got > want + 1e-9 * r0.step_s && got < want_poll - 1e-9 * r0.step_s,
          "large, progress poll, two-panel chunks: %.12g s, not between %.12g and %.12g", got, want,
          want_poll);
    printf("  large, progress poll, two-panel chunks: %+.6g s (between %+.6g and %+.6g)\n", got,
           want, want_poll);
    cfg.progress = FF_PROGRESS_THREAD;
    cfg.panel_rows = 1;
}

/* ---- the search ---- */

static void test_search(void)
{
    printf("search: coordinate descent against exhaustive enumeration\n");
    /* L=2 and C=256 on 2x2x1x1: X inside a node (fast), Y across nodes
     * (slow), so decomposition pays on some layers and not on others */
    ff_plan_config cfg;
    char err[256];
    ff_plan_config_default(&cfg);
    cfg.model = (ff_model){.name = "small", .layers = 2, .heads = 4, .hidden = 256, .vocab = 1000};
    cfg.batch = 4, cfg.seq = 64;
    cfg.panel_rows = 1; /* 256 rows: one default panel, which no chunking could cut */
    bare_machine(&cfg.machine, 2);
    cfg.machine.gemm_flops = cfg.machine.peak_flops = 1e12;
    cfg.machine.alpha_inter_s = 2e-5;
    cfg.machine.beta_inter_Bps = 1e10;
    cfg.machine.intra_overlap = 0;
    ff_dims g = {2, 2, 1, 1};
    plan_search_space sp;
    plan_search_space_default(&sp);
    sp.vary = PLAN_VARY_CHECKPOINT | PLAN_VARY_DECOMPOSE;
    sp.n_decompose = 2;
    sp.decompose[0] = 0, sp.decompose[1] = 2;
    ff_layer_plan found, p;
    ff_plan_result res, r;
    long evals = 0;
    int rc = plan_search(&cfg, g, 0, 1, &sp, &found, &res, &evals, err, sizeof err);
    CHECK(rc == FF_OK, "descent: %s", err);

    /* exhaustive: 2 checkpoints and 9 decompositions, 2^11 plans */
    ff_plan_evaluate(&cfg, g, &r, err, sizeof err);
    double start = r.step_s;
    mirror(&cfg, g, &r, &p);
    cfg.layers = &p;
    double best = INFINITY;
    unsigned best_bits = 0;
    for (unsigned bits = 0; bits < 1u << 11; bits++) {
        p.blocks[0].checkpoint = bits & 1, p.blocks[1].checkpoint = bits >> 1 & 1;
        p.head.decompose = bits >> 2 & 1 ? 2 : 0;
        for (int l = 0; l < 2; l++)
            for (int i = 0; i < FF_BLOCK_LAYERS; i++)
                p.blocks[l].layer[i].decompose = bits >> (3 + 4 * l + i) & 1 ? 2 : 0;
        rc = ff_plan_evaluate(&cfg, g, &r, err, sizeof err);
        if (rc == FF_OK && !r.rejected && r.step_s < best)
            best = r.step_s, best_bits = bits;
    }
    cfg.layers = NULL;
    int n_dec = 0;
    for (int b = 2; b < 11; b++)
        n_dec += best_bits >> b & 1;
    CHECK(res.step_s == best, "descent %.17g s, exhaustive %.17g s", res.step_s, best);
    CHECK(n_dec > 0 && n_dec < 9, "a trivial optimum: %d of 9 layers decomposed", n_dec);
    printf("  descent: %.9g s in %ld evaluations; exhaustive (2048): %.9g s, %d of 9 layers "
           "decomposed, checkpoints %u %u; uniform %.9g s\n",
           res.step_s, evals, best, n_dec, best_bits & 1, best_bits >> 1 & 1, start);
    ff_layer_plan_free(&p);
    ff_layer_plan_free(&found);

    /* Metropolis-Hastings: deterministic, never worse than its start, and
     * no better than the optimum */
    ff_layer_plan m1, m2;
    ff_plan_result q1, q2;
    sp.mh_iters = 600;
    rc = plan_search(&cfg, g, 1, 7, &sp, &m1, &q1, &evals, err, sizeof err);
    CHECK(rc == FF_OK, "mh: %s", err);
    rc = plan_search(&cfg, g, 1, 7, &sp, &m2, &q2, NULL, err, sizeof err);
    CHECK(rc == FF_OK && same_plan(&m1, &m2), "mh: two runs with one seed differ");
    CHECK(q1.step_s <= start && q1.step_s >= best, "mh: %.17g s, start %.17g, optimum %.17g",
          q1.step_s, start, best);
    printf("  Metropolis-Hastings (600 proposals, seed 7): %.9g s%s, the same plan twice\n",
           q1.step_s, q1.step_s == best ? " (the optimum)" : "");
    ff_layer_plan_free(&m1);
    ff_layer_plan_free(&m2);

    /* the public search: identification, prediction, candidates */
    cfg.wire_bytes = 4;
    rc = ff_plan_per_layer(&cfg, g, 0, 1, &p, &r, err, sizeof err);
    CHECK(rc == FF_OK, "ff_plan_per_layer: %s", err);
    CHECK(p.layers == 2 && p.heads == 4 && p.hidden == 256 && p.vocab == 1000 && p.grid.x == 2 &&
              p.grid.y == 2 && p.grid.z == 1 && p.grid.d == 1 && p.batch == 4 && p.seq == 64 &&
              p.micro_batches == 1 && p.predicted_step_s == r.step_s,
          "the plan's identification or prediction");
    CHECK(r.step_s <= start, "the search is slower than its start: %g > %g", r.step_s, start);
    int bf16 = p.head.wire_bytes == 2;
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            bf16 |= p.blocks[l].layer[i].wire_bytes == 2;
    CHECK(!bf16, "bf16 chosen though the configuration's wire is fp32");
    cfg.layers = &p;
    ff_plan_result again;
    rc = ff_plan_evaluate(&cfg, g, &again, err, sizeof err);
    CHECK(rc == FF_OK && again.step_s == p.predicted_step_s, "evaluating the plan: %g vs %g",
          again.step_s, p.predicted_step_s);
    cfg.layers = NULL;
    ff_layer_plan_free(&p);
    cfg.wire_bytes = 2; /* bf16 allowed: the search uses it where it pays */
    rc = ff_plan_per_layer(&cfg, g, 0, 1, &p, &r, err, sizeof err);
    bf16 = p.head.wire_bytes == 2;
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            bf16 |= p.blocks[l].layer[i].wire_bytes == 2;
    CHECK(rc == FF_OK && bf16, "bf16 allowed but not chosen (%s)", err);
    printf("  ff_plan_per_layer: %.9g s (fp32 only), %.9g s with bf16 allowed\n", again.step_s,
           r.step_s);
    ff_layer_plan_free(&p);
    rc = ff_plan_per_layer(&cfg, g, 2, 1, &p, &r, err, sizeof err);
    CHECK(rc == FF_EINVAL && p.blocks == NULL, "method 2: %d", rc);
    rc = ff_plan_per_layer(&cfg, (ff_dims){8, 1, 1, 1}, 0, 1, &p, &r, err, sizeof err);
    CHECK(rc == FF_EDIVIDE && strstr(err, "heads"), "a grid that does not divide: %d %s", rc, err);
}

/* The search over the reduce-scatter collective matmul alone, against
 * exhaustive enumeration: L=2, C=256 on 1x1x4x1, Z across nodes, ORS off
 * (each dW reduce-scatter waited at once, so feeding it from the dW GEMM's
 * slices can pay). Descent must find the optimum of the 2^8 plans (the
 * head has no rs_cmm coordinate: its dW goes to the embedding's
 * gradient), and that optimum must turn it on somewhere (else the test
 * shows nothing). */
static void test_search_rs_cmm(void)
{
    printf("search: the reduce-scatter collective matmul per layer\n");
    ff_plan_config cfg;
    char err[256];
    ff_plan_config_default(&cfg);
    cfg.model = (ff_model){.name = "small", .layers = 2, .heads = 4, .hidden = 256, .vocab = 1000};
    cfg.batch = 4, cfg.seq = 64;
    cfg.overlap = FF_OVERLAP_ALL & ~FF_OVERLAP_ORS;
    bare_machine(&cfg.machine, 1);
    cfg.machine.gemm_flops = cfg.machine.peak_flops = 1e11;
    cfg.machine.intra_overlap = 0;
    ff_dims g = {1, 1, 4, 1};
    plan_search_space sp;
    plan_search_space_default(&sp);
    sp.vary = PLAN_VARY_RS_CMM;
    ff_layer_plan found, p;
    ff_plan_result res, r;
    long evals = 0;
    int rc = plan_search(&cfg, g, 0, 1, &sp, &found, &res, &evals, err, sizeof err);
    CHECK(rc == FF_OK, "descent: %s", err);
    ff_plan_evaluate(&cfg, g, &r, err, sizeof err);
    const double start = r.step_s;
    mirror(&cfg, g, &r, &p);
    cfg.layers = &p;
    double best = INFINITY;
    unsigned best_bits = 0;
    for (unsigned bits = 0; bits < 1u << 8; bits++) {
        for (int l = 0; l < 2; l++)
            for (int i = 0; i < FF_BLOCK_LAYERS; i++)
                p.blocks[l].layer[i].rs_cmm = bits >> (4 * l + i) & 1;
        rc = ff_plan_evaluate(&cfg, g, &r, err, sizeof err);
        if (rc == FF_OK && !r.rejected && r.step_s < best)
            best = r.step_s, best_bits = bits;
    }
    cfg.layers = NULL;
    int n_on = 0, n_found = found.head.rs_cmm;
    for (int b = 0; b < 8; b++)
        n_on += best_bits >> b & 1;
    for (int l = 0; l < 2; l++)
        for (int i = 0; i < FF_BLOCK_LAYERS; i++)
            n_found += found.blocks[l].layer[i].rs_cmm;
    CHECK(res.step_s == best, "descent %.17g s, exhaustive %.17g s", res.step_s, best);
    CHECK(n_on > 0 && n_found > 0 && best < start,
          "the optimum turns it on in %d of 8 layers (descent %d): %.9g s, without %.9g s", n_on,
          n_found, best, start);
    printf("  descent: %.9g s in %ld evaluations, rs_cmm in %d layers; exhaustive (256): %.9g "
           "s, %d of 8; without %.9g s\n",
           res.step_s, evals, n_found, best, n_on, start);
    ff_layer_plan_free(&p);
    ff_layer_plan_free(&found);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/ff-layerplan-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_file();
    test_match();
    test_uniform();
    test_traffic();
    test_sign();
    test_search();
    test_search_rs_cmm();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return test_finish("layerplan");
}
