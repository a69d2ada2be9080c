/* Machine profiles: the JSON schema `fourfold bench profile` writes, `bench
 * tune` rewrites and the planner and the collective layer read
 * (docs/planner.md), all through one module (src/plan/profile.h). Good files
 * (the schema's example, a file with unknown nested keys, the minimum),
 * every kind of corrupt file with the message it must give, files on disk,
 * the round trip of every preset through JSON; the picks and the second
 * regimes (every malformed pick refused with a message naming the pick),
 * the round trip of a full profile with picks, both regimes, a "fit" and
 * unknown keys, 96 picks, and the merge into a collective model. Runs
 * without MPI. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fourfold/plan.h"
#include "plan/profile.h"
#include "test_util.h"

static int parse(const char *text, ff_profile *p, char *err, size_t len)
{
    return ff_profile_parse(text, strlen(text), "t.json", p, err, len);
}

static void good(const char *label, const char *text, ff_profile *p)
{
    char err[512] = "";
    int rc = parse(text, p, err, sizeof err);
    CHECK(rc == FF_OK, "%s: refused: %s", label, err);
    printf("good   %-40s ok\n", label);
}

static void bad(const char *label, const char *text, int code, const char *needle)
{
    ff_profile p;
    char err[512] = "";
    int rc = parse(text, &p, err, sizeof err);
    CHECK(rc == code, "%s: rc %d, want %d (%s)", label, rc, code, err);
    CHECK(strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", label, err, needle);
    CHECK(strstr(err, "t.json") != NULL, "%s: message '%s' does not name the file", label, err);
    printf("bad    %-40s %s\n", label, err);
}

#define HEAD "{\"format\":\"fourfold-profile\",\"version\":1,"
#define REQ                                                                                        \
    "\"ranks_per_node\":2,\"memory_bytes\":2.5e10,\"gemm_flops\":1.0e11,"                          \
    "\"alpha_intra_s\":2e-6,\"beta_intra_Bps\":5e9,\"alpha_inter_s\":5e-5,"                        \
    "\"beta_inter_Bps\":1.25e8"

static void test_good(void)
{
    ff_profile p;
    /* the schema's example, as the brief of both sides states it */
    good("schema example",
         HEAD "\"name\":\"vm\"," REQ ",\"peak_flops\":1.0e11,"
              "\"intra_bw\":[{\"inner\":1,\"size\":2,\"Bps\":7.6e10}]}",
         &p);
    CHECK(!strcmp(p.name, "vm") && p.ranks_per_node == 2 && p.memory_bytes == 2.5e10 &&
              p.gemm_flops == 1e11 && p.peak_flops == 1e11 && p.alpha_intra_s == 2e-6 &&
              p.beta_intra_Bps == 5e9 && p.alpha_inter_s == 5e-5 && p.beta_inter_Bps == 1.25e8,
          "schema example: fields differ");
    CHECK(p.n_intra_bw == 1 && p.intra_bw[0].inner == 1 && p.intra_bw[0].size == 2 &&
              p.intra_bw[0].Bps == 7.6e10,
          "intra_bw: %d entries", p.n_intra_bw);
    /* defaults of the optional keys */
    CHECK(p.mem_Bps == 1e11 / 16 && p.gemm_half_dim == 32 && p.cores_per_node == 0 &&
              p.intra_overlap == 0 && p.axonn_table == FF_AXONN_TABLE_NONE &&
              p.precision == FF_PLAN_FP32,
          "defaults: mem %g half %g cores %d overlap %g", p.mem_Bps, p.gemm_half_dim,
          p.cores_per_node, p.intra_overlap);

    /* unknown keys of any shape are skipped, keys in any order, whitespace */
    good("unknown nested keys",
         "\n  {\"fit\": {\"method\": \"least squares\", \"intra\": {\"measured\": true, "
         "\"samples\": 12, \"rms_rel\": 0.05, \"max_rel\": 0.11},\n \"list\": [1, -2.5e-3, "
         "null, false, \"a\\\"b\\u00e9\", [], {}]},\n"
         " \"beta_inter_Bps\": 1.25e8, \"alpha_inter_s\": 0, \"beta_intra_Bps\": 5E9,"
         " \"alpha_intra_s\": 0.0, \"gemm_flops\": 1e11, \"memory_bytes\": 1073741824,"
         " \"ranks_per_node\": 4, \"version\": 1, \"format\": \"fourfold-profile\","
         " \"intra_bw\": [], \"cores_per_node\": 2, \"intra_overlap\": 0.5, \"mem_Bps\": 2e10,"
         " \"gemm_half_dim\": 0, \"future_key\": 3}\n",
         &p);
    CHECK(p.ranks_per_node == 4 && p.memory_bytes == 1073741824.0 && p.n_intra_bw == 0 &&
              p.cores_per_node == 2 && p.intra_overlap == 0.5 && p.mem_Bps == 2e10 &&
              p.gemm_half_dim == 0 && p.peak_flops == 1e11,
          "unknown keys: fields differ");
    CHECK(!strcmp(p.name, "t.json"), "a profile without a name takes the file's: '%s'", p.name);
    good("minimum", HEAD REQ "}", &p);
    /* the runs' precision, which the planner's automatic precision takes */
    good("precision", HEAD REQ ",\"precision\":\"bf16-mixed\"}", &p);
    CHECK(p.precision == FF_PLAN_BF16_MIXED, "precision: %d", p.precision);
    good("precision fp32", HEAD REQ ",\"precision\":\"fp32\"}", &p);
    CHECK(p.precision == FF_PLAN_FP32, "precision fp32: %d", p.precision);
    /* the GEMM call time and the fused attention kernel (default 0, 0) */
    CHECK(p.gemm_call_s == 0 && p.attention_fused == 0, "defaults: call %g s, fused %d",
          p.gemm_call_s, p.attention_fused);
    good("call time, fused attention", HEAD REQ ",\"gemm_call_s\":6e-6,\"attention_fused\":1}", &p);
    CHECK(p.gemm_call_s == 6e-6 && p.attention_fused == 1, "call %g s, fused %d", p.gemm_call_s,
          p.attention_fused);
    /* the GPU presets plan bf16-mixed, this machine fp32 */
    const char *const presets[] = {"perlmutter", "frontier", "alps", "this"};
    for (int i = 0; i < 4; i++) {
        ff_profile_preset(presets[i], &p, NULL, 0);
        CHECK(p.precision == (i < 3 ? FF_PLAN_BF16_MIXED : FF_PLAN_FP32), "preset %s: precision %d",
              presets[i], p.precision);
    }
}

static void test_bad(void)
{
    bad("empty text", "", FF_ECORRUPT, "found the end of the file");
    bad("not JSON", "hello", FF_ECORRUPT, "expected '{'");
    bad("an array", "[1,2]", FF_ECORRUPT, "expected '{'");
    bad("truncated", HEAD "\"ranks_per_node\":2,", FF_ECORRUPT, "end of the file");
    bad("unterminated string", HEAD "\"name\":\"abc", FF_ECORRUPT, "unterminated string");
    bad("missing colon", "{\"format\" \"fourfold-profile\"}", FF_ECORRUPT, "expected ':'");
    bad("missing key",
        HEAD "\"ranks_per_node\":2,\"memory_bytes\":1,\"alpha_intra_s\":0,"
             "\"beta_intra_Bps\":1,\"alpha_inter_s\":0,\"beta_inter_Bps\":1}",
        FF_EINVAL, "required key \"gemm_flops\" is missing");
    bad("no format", "{\"version\":1," REQ "}", FF_EINVAL, "required key \"format\"");
    bad("other format", "{\"format\":\"fourfold-trace\",\"version\":1," REQ "}", FF_EINVAL,
        "\"format\" is \"fourfold-trace\"");
    bad("version 2", "{\"format\":\"fourfold-profile\",\"version\":2," REQ "}", FF_EINVAL,
        "version 2 is not supported");
    bad("duplicate key", HEAD REQ ",\"gemm_flops\":2e11}", FF_EINVAL,
        "key \"gemm_flops\" appears twice");
    bad("string for a number", HEAD REQ ",\"peak_flops\":\"fast\"}", FF_EINVAL,
        "\"peak_flops\" must be a number");
    bad("number for a string", HEAD REQ ",\"name\":3}", FF_EINVAL, "\"name\" must be a string");
    bad("NaN", HEAD REQ ",\"peak_flops\":NaN}", FF_EINVAL, "must be a number");
    bad("negative bandwidth",
        "{\"format\":\"fourfold-profile\",\"version\":1,"
        "\"ranks_per_node\":2,\"memory_bytes\":1,\"gemm_flops\":1,"
        "\"alpha_intra_s\":0,\"beta_intra_Bps\":-5,\"alpha_inter_s\":0,"
        "\"beta_inter_Bps\":1}",
        FF_EINVAL, "\"beta_intra_Bps\" is -5");
    bad("zero memory", HEAD REQ ",\"mem_Bps\":0}", FF_EINVAL, "\"mem_Bps\" is 0");
    bad("fractional ranks",
        "{\"format\":\"fourfold-profile\",\"version\":1,"
        "\"ranks_per_node\":2.5,\"memory_bytes\":1,\"gemm_flops\":1,"
        "\"alpha_intra_s\":0,\"beta_intra_Bps\":1,\"alpha_inter_s\":0,"
        "\"beta_inter_Bps\":1}",
        FF_EINVAL, "expected an integer");
    bad("overlap above 1", HEAD REQ ",\"intra_overlap\":1.5}", FF_EINVAL, "\"intra_overlap\"");
    bad("negative call time", HEAD REQ ",\"gemm_call_s\":-1e-6}", FF_EINVAL, "\"gemm_call_s\"");
    bad("fused attention 2", HEAD REQ ",\"attention_fused\":2}", FF_EINVAL, "\"attention_fused\"");
    bad("fused attention 0.5", HEAD REQ ",\"attention_fused\":0.5}", FF_EINVAL,
        "expected an integer");
    bad("precision fp16", HEAD REQ ",\"precision\":\"fp16\"}", FF_EINVAL,
        "\"precision\" \"fp16\": expected \"fp32\" or \"bf16-mixed\"");
    bad("precision a number", HEAD REQ ",\"precision\":16}", FF_EINVAL,
        "\"precision\" must be a string");
    bad("huge number", HEAD REQ ",\"peak_flops\":1e999}", FF_EINVAL, "out of range");
    bad("leading plus", HEAD REQ ",\"peak_flops\":+1}", FF_EINVAL, "must be a number");
    bad("trailing dot", HEAD REQ ",\"peak_flops\":1.}", FF_ECORRUPT, "malformed number");
    bad("trailing comma", HEAD REQ ",}", FF_ECORRUPT, "expected a string");
    bad("text after the object", HEAD REQ "} x", FF_ECORRUPT, "unexpected text after");
    bad("two objects", HEAD REQ "}{}", FF_ECORRUPT, "unexpected text after");
    bad("bad escape", HEAD REQ ",\"name\":\"a\\qb\"}", FF_ECORRUPT, "bad escape");
    bad("control character", HEAD REQ ",\"name\":\"a\tb\"}", FF_ECORRUPT, "control character");
    bad("bad literal in unknown key", HEAD REQ ",\"future\":tru}", FF_ECORRUPT, "expected a value");
    bad("nan in unknown key", HEAD REQ ",\"future\":{\"rms\":nan}}", FF_ECORRUPT,
        "expected a value");
    bad("fit not an object", HEAD REQ ",\"fit\":3}", FF_EINVAL, "\"fit\" must be an object");
    bad("nan in fit", HEAD REQ ",\"fit\":{\"rms\":nan}}", FF_ECORRUPT, "expected a value");
    bad("reduce_Bps negative", HEAD REQ ",\"reduce_Bps\":-1}", FF_EINVAL, "\"reduce_Bps\" is -1");
    bad("intra_bw not a list", HEAD REQ ",\"intra_bw\":{}}", FF_ECORRUPT, "expected '['");
    bad("intra_bw entry lacks Bps", HEAD REQ ",\"intra_bw\":[{\"inner\":1,\"size\":2}]}", FF_EINVAL,
        "lacks \"Bps\"");
    bad("intra_bw size 1", HEAD REQ ",\"intra_bw\":[{\"inner\":1,\"size\":1,\"Bps\":1}]}",
        FF_EINVAL, "\"size\" is 1");
    bad("intra_bw repeated key",
        HEAD REQ ",\"intra_bw\":[{\"inner\":1,\"inner\":2,\"size\":2,\"Bps\":1}]}", FF_EINVAL,
        "repeats \"inner\"");
    /* the line of the problem: the bad value is on line 3 */
    bad("line number",
        "{\"format\": \"fourfold-profile\",\n \"version\": 1,\n \"gemm_flops\": x\n}", FF_EINVAL,
        "line 3");
    char deep[512];
    memset(deep, '[', sizeof deep);
    memcpy(deep, HEAD REQ ",\"future\":", strlen(HEAD REQ ",\"future\":"));
    deep[sizeof deep - 1] = '\0';
    bad("nested too deep", deep, FF_ECORRUPT, "nested more than");
    ff_profile p;
    char err[256] = "";
    const char with_nul[] = HEAD "\0" REQ "}";
    CHECK(ff_profile_parse(with_nul, sizeof with_nul - 1, "n.json", &p, err, sizeof err) ==
                  FF_ECORRUPT &&
              strstr(err, "NUL"),
          "NUL byte: '%s'", err);
}

static void test_files(void)
{
    char dir[] = "/tmp/ff_plan_profileXXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[256], err[512] = "";
    ff_profile p;
    snprintf(path, sizeof path, "%s/missing.json", dir);
    CHECK(ff_profile_load(path, &p, err, sizeof err) == FF_EIO && strstr(err, "missing.json") &&
              strstr(err, "cannot open"),
          "missing file: '%s'", err);
    snprintf(path, sizeof path, "%s/empty.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (f)
        fclose(f);
    CHECK(ff_profile_load(path, &p, err, sizeof err) == FF_ECORRUPT && strstr(err, "empty"),
          "empty file: '%s'", err);
    /* every preset survives the round trip through a file */
    for (size_t i = 0; ff_profile_preset_name(i); i++) {
        ff_profile a, b;
        CHECK(ff_profile_preset(ff_profile_preset_name(i), &a, err, sizeof err) == FF_OK, "%s",
              err);
        char json[8192];
        size_t n = ff_profile_to_json(&a, json, sizeof json);
        CHECK(n < sizeof json, "preset %s: JSON of %zu bytes", a.name, n);
        snprintf(path, sizeof path, "%s/%s.json", dir, a.name);
        f = fopen(path, "w");
        if (f) {
            fputs(json, f);
            fclose(f);
        }
        int rc = ff_profile_load(path, &b, err, sizeof err);
        CHECK(rc == FF_OK, "preset %s: its own JSON is refused: %s", a.name, err);
        /* a file has no AxoNN table; everything else must come back exactly */
        int same = !strcmp(a.name, b.name) && a.ranks_per_node == b.ranks_per_node &&
                   a.memory_bytes == b.memory_bytes && a.gemm_flops == b.gemm_flops &&
                   a.peak_flops == b.peak_flops && a.alpha_intra_s == b.alpha_intra_s &&
                   a.beta_intra_Bps == b.beta_intra_Bps && a.alpha_inter_s == b.alpha_inter_s &&
                   a.beta_inter_Bps == b.beta_inter_Bps && a.n_intra_bw == b.n_intra_bw &&
                   a.mem_Bps == b.mem_Bps && a.gemm_half_dim == b.gemm_half_dim &&
                   a.cores_per_node == b.cores_per_node && a.intra_overlap == b.intra_overlap &&
                   a.precision == b.precision && a.gemm_call_s == b.gemm_call_s &&
                   a.attention_fused == b.attention_fused && b.axonn_table == FF_AXONN_TABLE_NONE;
        for (int k = 0; same && k < a.n_intra_bw; k++)
            same = a.intra_bw[k].inner == b.intra_bw[k].inner &&
                   a.intra_bw[k].size == b.intra_bw[k].size &&
                   a.intra_bw[k].Bps == b.intra_bw[k].Bps;
        CHECK(rc != FF_OK || same, "preset %s: the round trip changed it", a.name);
        printf("round trip %-12s %zu bytes of JSON\n", a.name, n);
        remove(path);
    }
    snprintf(path, sizeof path, "%s/empty.json", dir);
    remove(path);
    rmdir(dir);
    CHECK(ff_profile_preset("summit", &p, err, sizeof err) == FF_EINVAL &&
              strstr(err, "unknown machine 'summit'"),
          "unknown preset: '%s'", err);
}

/* ---- the whole file: picks, regimes, fit, unknown keys (plan/profile.h) ---- */

#define COLL_HEAD  "{\"format\":\"fourfold-profile\","
#define PICK(body) "{\"coll\":\"allreduce\",\"nodes\":2,\"per_node\":2," body "}"
#define GOOD_PICK  PICK("\"min_B\":0,\"max_B\":8,\"algo\":\"ring\"")

/* A document the collective layer would read (no planner keys needed). */
static int parse_doc(const char *text, ff_profile_doc *d, char *err, size_t len)
{
    return ff_profile_doc_parse(text, strlen(text), "c.json", FF_PROFILE_FOR_COLL, d, err, len);
}

static void bad_doc(const char *label, const char *text, int code, const char *needle)
{
    ff_profile_doc d;
    char err[512] = "";
    int rc = parse_doc(text, &d, err, sizeof err);
    CHECK(rc == code, "%s: rc %d, want %d (%s)", label, rc, code, err);
    CHECK(strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", label, err, needle);
    CHECK(strstr(err, "c.json: line ") != NULL, "%s: message '%s' names no file and line", label,
          err);
    CHECK(d.n_picks == 0 && !d.fit && !d.extra, "%s: a refused document is not empty", label);
    ff_profile_doc_free(&d);
    printf("bad    %-40s %s\n", label, err);
}

static void test_picks(void)
{
    ff_profile_doc d;
    char err[512] = "";
    /* the picks of a profile written by bench tune, and an extra key in a pick */
    const char *good = COLL_HEAD
        "\"picks\":[\n"
        "  " PICK("\"min_B\":8192,\"max_B\":32768,\"algo\":\"rec-whole\","
                  "\"model_algo\":\"hier-ring\",\"sizes\":1") ",\n"
                                                              "  "
                                                              "{\"algo\":\"ring\",\"max_B\":1e15,"
                                                              "\"min_B\":2048,\"note\":\"a ] "
                                                              "b\",\"per_node\":1,\"nodes\":3,"
                                                              "\"coll\":\"allgather\"}]}";
    int rc = parse_doc(good, &d, err, sizeof err);
    CHECK(rc == FF_OK && d.n_picks == 2, "good picks: rc %d, %d picks: %s", rc, d.n_picks, err);
    const ff_profile_pick *q = &d.picks[0], *q2 = &d.picks[1];
    CHECK(q->rule.coll == FF_COLL_ALLREDUCE && q->rule.nodes == 2 && q->rule.per_node == 2 &&
              q->rule.min_B == 8192 && q->rule.max_B == 32768 &&
              q->rule.algo == FF_ALGO_REC_WHOLE && q->model_algo == FF_ALGO_HIER_RING &&
              q->sizes == 1,
          "pick 1 read wrongly");
    CHECK(q2->rule.coll == FF_COLL_ALLGATHER && q2->rule.nodes == 3 && q2->rule.per_node == 1 &&
              q2->rule.min_B == 2048 && q2->rule.max_B == 1e15 && q2->rule.algo == FF_ALGO_RING &&
              q2->model_algo == -1 && q2->sizes == -1,
          "pick 2 (keys in another order, no model_algo or sizes) read wrongly");
    ff_profile_doc_free(&d);
    printf("good   %-40s ok\n", "picks");

    bad_doc("picks not a list", COLL_HEAD "\"picks\":{}}", FF_EINVAL, "\"picks\" must be a list");
    bad_doc("pick not an object", COLL_HEAD "\"picks\":[3]}", FF_ECORRUPT, "pick 1: expected '{'");
    bad_doc("pick lacks min_B", COLL_HEAD "\"picks\":[" PICK("\"max_B\":8,\"algo\":\"ring\"") "]}",
            FF_EINVAL, "pick 1: lacks \"min_B\"");
    bad_doc("pick lacks algo", COLL_HEAD "\"picks\":[" PICK("\"min_B\":0,\"max_B\":8") "]}",
            FF_EINVAL, "pick 1: lacks \"algo\"");
    bad_doc("second pick bad",
            COLL_HEAD "\"picks\":[" GOOD_PICK
                      "," PICK("\"min_B\":0,\"max_B\":8,\"algo\":\"x\"") "]}",
            FF_EINVAL, "pick 2: \"algo\" is \"x\"");
    bad_doc("pick of mpi",
            COLL_HEAD "\"picks\":[" PICK("\"min_B\":0,\"max_B\":8,\"algo\":\"mpi\"") "]}",
            FF_EINVAL, "pick 1: \"algo\" is \"mpi\", expected one of fourfold's");
    bad_doc("pick of auto",
            COLL_HEAD "\"picks\":[" PICK("\"min_B\":0,\"max_B\":8,\"algo\":\"auto\"") "]}",
            FF_EINVAL, "\"algo\" is \"auto\"");
    bad_doc("rec-whole all-gather",
            COLL_HEAD "\"picks\":[{\"coll\":\"allgather\",\"nodes\":2,\"per_node\":2,\"min_B\":0,"
                      "\"max_B\":8,\"algo\":\"rec-whole\"}]}",
            FF_EINVAL, "pick 1: \"algo\" rec-whole does not implement allgather");
    bad_doc("direct all-to-all",
            COLL_HEAD "\"picks\":[{\"coll\":\"alltoall\",\"nodes\":2,\"per_node\":2,\"min_B\":0,"
                      "\"max_B\":8,\"algo\":\"direct\"}]}",
            FF_EINVAL, "does not implement alltoall");
    bad_doc("unknown collective",
            COLL_HEAD "\"picks\":[{\"coll\":\"gather\",\"nodes\":2,\"per_node\":2,\"min_B\":0,"
                      "\"max_B\":8,\"algo\":\"ring\"}]}",
            FF_EINVAL, "pick 1: \"coll\" is \"gather\"");
    bad_doc("coll a number",
            COLL_HEAD "\"picks\":[{\"coll\":3,\"nodes\":2,\"per_node\":2,\"min_B\":0,"
                      "\"max_B\":8,\"algo\":\"ring\"}]}",
            FF_EINVAL, "\"coll\" must be a string");
    bad_doc("one rank",
            COLL_HEAD "\"picks\":[{\"coll\":\"allreduce\",\"nodes\":1,\"per_node\":1,\"min_B\":0,"
                      "\"max_B\":8,\"algo\":\"ring\"}]}",
            FF_EINVAL, "\"nodes\" x \"per_node\" = 1, expected 2 to");
    bad_doc("too many ranks",
            COLL_HEAD "\"picks\":[{\"coll\":\"allreduce\",\"nodes\":65536,\"per_node\":512,"
                      "\"min_B\":0,\"max_B\":8,\"algo\":\"ring\"}]}",
            FF_EINVAL, "expected 2 to 16777216 ranks");
    bad_doc("fractional nodes",
            COLL_HEAD "\"picks\":[{\"coll\":\"allreduce\",\"nodes\":1.5,\"per_node\":2,\"min_B\":0,"
                      "\"max_B\":8,\"algo\":\"ring\"}]}",
            FF_EINVAL, "pick 1: \"nodes\" is 1.5, expected an integer");
    bad_doc("huge nodes",
            COLL_HEAD
            "\"picks\":[{\"coll\":\"allreduce\",\"nodes\":1e30,\"per_node\":2,\"min_B\":0,"
            "\"max_B\":8,\"algo\":\"ring\"}]}",
            FF_EINVAL, "\"nodes\" is 1e+30");
    bad_doc("empty size range",
            COLL_HEAD "\"picks\":[" PICK("\"min_B\":8,\"max_B\":8,\"algo\":\"ring\"") "]}",
            FF_EINVAL, "\"max_B\" 8 is not above \"min_B\" 8");
    bad_doc("negative min_B",
            COLL_HEAD "\"picks\":[" PICK("\"min_B\":-1,\"max_B\":8,\"algo\":\"ring\"") "]}",
            FF_EINVAL, "\"min_B\" is -1");
    bad_doc("repeated key in a pick",
            COLL_HEAD "\"picks\":[" PICK("\"min_B\":0,\"max_B\":8,\"algo\":\"ring\",\"algo\":"
                                         "\"rec\"") "]}",
            FF_EINVAL, "pick 1: \"algo\" appears twice");
    bad_doc("unknown model_algo",
            COLL_HEAD "\"picks\":[" PICK("\"min_B\":0,\"max_B\":8,\"algo\":\"ring\","
                                         "\"model_algo\":\"fastest\"") "]}",
            FF_EINVAL, "\"model_algo\" is \"fastest\"");
    bad_doc("negative sizes",
            COLL_HEAD
            "\"picks\":[" PICK("\"min_B\":0,\"max_B\":8,\"algo\":\"ring\",\"sizes\":-2") "]}",
            FF_EINVAL, "\"sizes\" is -2");
    bad_doc("no comma between picks", COLL_HEAD "\"picks\":[" GOOD_PICK " {}]}", FF_ECORRUPT,
            "\"picks\" after pick 1: expected ']'");
    bad_doc("trailing comma", COLL_HEAD "\"picks\":[" GOOD_PICK ",]}", FF_ECORRUPT,
            "pick 2: expected '{', found ']'");
    bad_doc("two picks lists", COLL_HEAD "\"picks\":[],\"picks\":[]}", FF_EINVAL,
            "key \"picks\" appears twice");
    bad_doc("line of the pick",
            COLL_HEAD "\n \"picks\":[\n  " GOOD_PICK
                      ",\n  " PICK("\"min_B\":9,\"max_B\":8,\"algo\":\"ring\"") "]}",
            FF_EINVAL, "line 4: pick 2:");
    /* picks of any length are read (the old reader's 511-character buffer is gone) */
    for (int len = 511; len <= 1500; len += 989) {
        char text[2048];
        const char *pk = PICK("\"min_B\":0,\"max_B\":8,\"algo\":\"ring\"");
        int k = snprintf(text, sizeof text, COLL_HEAD "\"picks\":[");
        memcpy(text + k, pk, strlen(pk) - 1);
        k += (int)strlen(pk) - 1;
        for (int i = 0; i < len - (int)strlen(pk); i++)
            text[k++] = ' ';
        snprintf(text + k, sizeof text - (size_t)k, "}]}");
        rc = parse_doc(text, &d, err, sizeof err);
        CHECK(rc == FF_OK && d.n_picks == 1, "a pick of %d characters: rc %d, %s", len, rc, err);
        ff_profile_doc_free(&d);
    }

    /* a second regime needs its alpha and a beta > 0 */
    bad_doc("regime without beta",
            COLL_HEAD "\"small_max_inter_B\":16384,\"alpha_inter_small_s\":3e-5}", FF_EINVAL,
            "\"small_max_inter_B\" is 16384 but \"beta_inter_small_Bps\" is missing");
    bad_doc("regime with beta 0",
            COLL_HEAD "\"small_max_intra_B\":2048,\"alpha_intra_small_s\":1e-6,"
                      "\"beta_intra_small_Bps\":0}",
            FF_EINVAL, "\"beta_intra_small_Bps\" is 0 where \"small_max_intra_B\" is 2048");
    bad_doc("no format", "{\"picks\":[]}", FF_EINVAL, "required key \"format\" is missing");
    rc = parse_doc(COLL_HEAD "\"alpha_intra_small_s\":1e-6,\"beta_intra_small_Bps\":0}", &d, err,
                   sizeof err);
    CHECK(rc == FF_OK, "a small pair without small_max (one regime): %s", err);
    ff_profile_doc_free(&d);
    /* the planner needs its keys; the collective layer does not */
    rc = ff_profile_doc_parse(GOOD_PICK, 0, "c.json", FF_PROFILE_FOR_COLL, &d, err, sizeof err);
    CHECK(rc == FF_ECORRUPT, "empty text: rc %d", rc);
    const char *coll_only = COLL_HEAD "\"alpha_inter_s\":1e-4,\"picks\":[" GOOD_PICK "]}";
    rc = ff_profile_doc_parse(coll_only, strlen(coll_only), "c.json", FF_PROFILE_FOR_PLANNER, &d,
                              err, sizeof err);
    CHECK(rc == FF_EINVAL && strstr(err, "required key \"version\" is missing"),
          "a collective-only profile for the planner: rc %d, %s", rc, err);
}

static int same_rule(const ff_coll_pick_rule *a, const ff_coll_pick_rule *b)
{
    return a->coll == b->coll && a->nodes == b->nodes && a->per_node == b->per_node &&
           a->min_B == b->min_B && a->max_B == b->max_B && a->algo == b->algo;
}

/* Every field of two documents. */
static int same_doc(const ff_profile_doc *a, const ff_profile_doc *b, const char *label)
{
    int same = 1;
    for (int k = 0; k < FF_PK_COUNT; k++) {
        if (a->has[k] != b->has[k] || a->num[k] != b->num[k]) {
            printf("  %s: key %s differs: %d %.17g, %d %.17g\n", label, ff_profile_key_name(k),
                   a->has[k], a->num[k], b->has[k], b->num[k]);
            same = 0;
        }
    }
    same &= !strcmp(a->name, b->name) && a->n_intra_bw == b->n_intra_bw &&
            a->n_picks == b->n_picks && !a->fit == !b->fit && !a->extra == !b->extra &&
            (!a->fit || !strcmp(a->fit, b->fit)) && (!a->extra || !strcmp(a->extra, b->extra));
    for (int i = 0; same && i < a->n_intra_bw; i++)
        same = a->intra_bw[i].inner == b->intra_bw[i].inner &&
               a->intra_bw[i].size == b->intra_bw[i].size &&
               a->intra_bw[i].Bps == b->intra_bw[i].Bps;
    for (int i = 0; same && i < a->n_picks; i++) {
        const ff_profile_pick *p = &a->picks[i], *q = &b->picks[i];
        same =
            same_rule(&p->rule, &q->rule) && p->model_algo == q->model_algo && p->sizes == q->sizes;
        if (!same)
            printf("  %s: pick %d differs\n", label, i + 1);
    }
    return same;
}

static int same_model(const ff_coll_model *a, const ff_coll_model *b)
{
    int same = a->alpha_intra_s == b->alpha_intra_s && a->beta_intra_Bps == b->beta_intra_Bps &&
               a->alpha_inter_s == b->alpha_inter_s && a->beta_inter_Bps == b->beta_inter_Bps &&
               a->small_max_intra_B == b->small_max_intra_B &&
               a->alpha_intra_small_s == b->alpha_intra_small_s &&
               a->beta_intra_small_Bps == b->beta_intra_small_Bps &&
               a->small_max_inter_B == b->small_max_inter_B &&
               a->alpha_inter_small_s == b->alpha_inter_small_s &&
               a->beta_inter_small_Bps == b->beta_inter_small_Bps &&
               a->reduce_Bps == b->reduce_Bps && a->strict_volume == b->strict_volume &&
               a->n_picks == b->n_picks;
    for (int i = 0; same && i < a->n_picks; i++)
        same = same_rule(&a->picks[i], &b->picks[i]);
    return same;
}

/* Writes the document, reads it back, writes again: the same document and
 * the same text. Returns the text's length. */
static size_t round_trip(const ff_profile_doc *a, ff_profile_need need, const char *label)
{
    size_t n = 0, n2 = 0;
    char *text = ff_profile_doc_to_json(a, &n), *again = NULL, err[512] = "";
    CHECK(text != NULL, "%s: no text", label);
    if (!text)
        return 0;
    ff_profile_doc *b = malloc(sizeof *b);
    CHECK(b != NULL, "out of memory");
    if (!b) {
        free(text);
        return 0;
    }
    int rc = ff_profile_doc_parse(text, n, "rt.json", need, b, err, sizeof err);
    CHECK(rc == FF_OK, "%s: its own text is refused: %s\n%s", label, err, text);
    if (rc == FF_OK) {
        CHECK(same_doc(a, b, label), "%s: load -> write -> load changed the document:\n%s", label,
              text);
        again = ff_profile_doc_to_json(b, &n2);
        CHECK(again && n2 == n && !strcmp(again, text), "%s: the second write differs:\n%s\n%s",
              label, text, again ? again : "(none)");
    }
    ff_profile_doc_free(b);
    free(b), free(text), free(again);
    return n;
}

static void test_round_trip(void)
{
    const char *full =
        "{\"format\":\"fourfold-profile\",\"version\":1,\"name\":\"full \\\"one\\\"\\n\",\n"
        " \"ranks_per_node\":2,\"cores_per_node\":2,\"memory_bytes\":1.2638e10,\n"
        " \"gemm_flops\":1.02082e11,\"peak_flops\":1.1e11,\"alpha_intra_s\":5.65277e-06,\n"
        " \"beta_intra_Bps\":7.59714e9,\"alpha_inter_s\":0.00015291,\"beta_inter_Bps\":6.01568e7,\n"
        " \"intra_bw\":[{\"inner\":1,\"size\":2,\"Bps\":5.22255e9},{\"inner\":2,\"size\":2,"
        "\"Bps\":0.1}],\n"
        " \"mem_Bps\":1e10,\"gemm_half_dim\":32,\"intra_overlap\":0.25,\"reduce_Bps\":2.20238e10,\n"
        " \"small_max_intra_B\":2048,\"alpha_intra_small_s\":1.02748e-06,"
        "\"beta_intra_small_Bps\":2.11122e9,\n"
        " \"small_max_inter_B\":16384,\"alpha_inter_small_s\":3e-05,\"beta_inter_small_Bps\":6e8,\n"
        " \"fit\": {\"method\": \"m\", \"intra\": {\"measured\": true, \"rms_rel\": 0.2013},\n"
        "   \"list\": [1, null, \"x\\u00e9\"]},\n"
        " \"future_key\": {\"a\": [1, 2]}, \"notes\":\"kept\",\n"
        " \"picks\":[\n"
        "  {\"coll\":\"allreduce\",\"nodes\":2,\"per_node\":2,\"min_B\":8192,\"max_B\":32768,"
        "\"algo\":\"rec-whole\",\"model_algo\":\"hier-ring\",\"sizes\":1},\n"
        "  {\"coll\":\"allgather\",\"nodes\":4,\"per_node\":1,\"min_B\":11585.237502960395,"
        "\"max_B\":1e15,\"algo\":\"rec\"},\n"
        "  {\"coll\":\"reduce_scatter\",\"nodes\":1,\"per_node\":3,\"min_B\":0,\"max_B\":2048,"
        "\"algo\":\"direct\",\"sizes\":0,\"note\":\"dropped\"}]}\n";
    ff_profile_doc d;
    char err[512] = "";
    int rc = ff_profile_doc_parse(full, strlen(full), "full.json", FF_PROFILE_FOR_PLANNER, &d, err,
                                  sizeof err);
    CHECK(rc == FF_OK, "the full profile is refused: %s", err);
    if (rc != FF_OK)
        return;
    CHECK(d.n_picks == 3 && d.has[FF_PK_SMALL_MAX_INTRA] && d.has[FF_PK_SMALL_MAX_INTER] && d.fit &&
              strstr(d.fit, "\"rms_rel\": 0.2013") && d.extra &&
              !strcmp(d.extra, "\"future_key\": {\"a\": [1, 2]},\n \"notes\":\"kept\"") &&
              !strcmp(d.name, "full \"one\"\n"),
          "the full profile read wrongly: fit '%s', extra '%s', name '%s'", d.fit ? d.fit : "",
          d.extra ? d.extra : "", d.name);
    size_t n = round_trip(&d, FF_PROFILE_FOR_PLANNER, "full profile");
    printf("round trip %-12s %zu bytes of JSON\n", "full", n);
    /* the two views of it survive too */
    ff_profile a;
    ff_coll_model ma, mb;
    ff_coll_model_default(&ma);
    CHECK(ff_profile_doc_machine(&d, &a, err, sizeof err) == FF_OK, "machine: %s", err);
    CHECK(a.peak_flops == 1.1e11 && a.intra_overlap == 0.25 && a.n_intra_bw == 2 &&
              a.cores_per_node == 2,
          "the planner's view");
    CHECK(ff_profile_doc_coll_model(&d, &ma, err, sizeof err) == FF_OK, "model: %s", err);
    CHECK(ma.small_max_intra_B == 2048 && ma.beta_inter_small_Bps == 6e8 &&
              ma.reduce_Bps == 2.20238e10 && ma.n_picks == 3 &&
              ma.picks[1].min_B == 11585.237502960395,
          "the collective model's view");
    /* through a file: saved, then read by both public readers */
    char dir[] = "/tmp/ff_profile_rtXXXXXX", path[256];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/full.json", dir);
    CHECK(ff_profile_doc_save(path, &d, err, sizeof err) == FF_OK, "save: %s", err);
    ff_profile b;
    CHECK(ff_profile_load(path, &b, err, sizeof err) == FF_OK && b.peak_flops == a.peak_flops &&
              b.intra_bw[1].Bps == 0.1,
          "ff_profile_load of the saved file: %s", err);
    ff_coll_model_default(&mb);
    CHECK(ff_coll_model_read(path, &mb, err, sizeof err) == FF_OK && same_model(&ma, &mb),
          "ff_coll_model_read of the saved file differs: %s", err);
    /* a value out of range is not written */
    ff_profile_doc_set(&d, FF_PK_BETA_INTRA, -1);
    snprintf(path, sizeof path, "%s/bad.json", dir);
    rc = ff_profile_doc_save(path, &d, err, sizeof err);
    CHECK(rc == FF_EINVAL && strstr(err, "not written") &&
              strstr(err, "\"beta_intra_Bps\" is -1") && access(path, F_OK) != 0,
          "an out-of-range value was saved: rc %d, %s", rc, err);
    printf("save   %-40s %s\n", "beta_intra_Bps -1", err);
    snprintf(path, sizeof path, "%s/full.json", dir);
    remove(path);
    rmdir(dir);
    ff_profile_doc_free(&d);

    /* ff_profile_to_json is snprintf-like */
    ff_profile p;
    CHECK(ff_profile_preset("frontier", &p, err, sizeof err) == FF_OK, "%s", err);
    char small[16];
    size_t need = ff_profile_to_json(&p, small, sizeof small),
           whole = ff_profile_to_json(&p, NULL, 0);
    CHECK(need == whole && need > sizeof small && strlen(small) == sizeof small - 1 &&
              !strncmp(small, "{\"format\"", 9),
          "ff_profile_to_json into 16 bytes: %zu, %zu, '%s'", need, whole, small);
}

/* 96 picks (FF_COLL_MAX_PICKS) fit in a file, and are read back; 97 do not. */
static void test_capacity(void)
{
    ff_profile_doc *d = malloc(sizeof *d);
    ff_profile_pick *picks = malloc((FF_COLL_MAX_PICKS + 1) * sizeof *picks);
    CHECK(d && picks, "out of memory");
    if (!d || !picks) {
        free(d), free(picks);
        return;
    }
    ff_profile_doc_init(d);
    ff_profile_doc_set_name(d, "96 picks");
    ff_profile_doc_set(d, FF_PK_ALPHA_INTER, 1e-4);
    for (int i = 0; i <= FF_COLL_MAX_PICKS; i++) {
        ff_coll c = (ff_coll)(i % 3);
        ff_algo a = i % 2                    ? FF_ALGO_REC
                    : c == FF_COLL_ALLREDUCE ? FF_ALGO_REC_WHOLE
                                             : FF_ALGO_DIRECT;
        double lo = 4096.0 * (i / 3) * 1.4142135623730951;
        picks[i] = (ff_profile_pick){
            {c, 1 + i % 5, 2 + i % 3, lo, lo * 2 + 1, a}, i % 4 ? FF_ALGO_RING : -1, i % 7};
    }
    CHECK(ff_profile_doc_set_picks(d, picks, FF_COLL_MAX_PICKS + 1) == FF_EINVAL,
          "97 picks were set");
    CHECK(ff_profile_doc_set_picks(d, picks, FF_COLL_MAX_PICKS) == FF_OK, "96 picks not set");
    size_t n = round_trip(d, FF_PROFILE_FOR_COLL, "96 picks");
    CHECK(n > 8192, "96 picks in %zu bytes: the test does not pass 8 KiB", n);
    printf("round trip %-12s %zu bytes of JSON\n", "96 picks", n);
    /* through a file into the collective model */
    char path[] = "/tmp/ff_profile_96XXXXXX";
    int fd = mkstemp(path);
    char err[512] = "";
    if (fd >= 0)
        close(fd);
    CHECK(fd >= 0 && ff_profile_doc_save(path, d, err, sizeof err) == FF_OK, "save: %s", err);
    ff_coll_model m;
    ff_coll_model_default(&m);
    int rc = ff_coll_model_read(path, &m, err, sizeof err);
    CHECK(rc == FF_OK && m.n_picks == FF_COLL_MAX_PICKS && m.alpha_inter_s == 1e-4,
          "ff_coll_model_read of 96 picks: rc %d, %d picks, %s", rc, m.n_picks, err);
    for (int i = 0; rc == FF_OK && i < FF_COLL_MAX_PICKS; i++)
        CHECK(same_rule(&m.picks[i], &picks[i].rule), "pick %d differs", i + 1);
    remove(path);
    /* 97 in a file: refused */
    size_t len = 0;
    char *text = ff_profile_doc_to_json(d, &len);
    char *more = text ? malloc(len + 256) : NULL;
    if (more) {
        char *end = strrchr(text, ']');
        size_t head = (size_t)(end - text);
        memcpy(more, text, head);
        snprintf(more + head, len + 256 - head, ",\n  " GOOD_PICK "]}\n");
        bad_doc("97 picks", more, FF_EINVAL, "pick 97: more than 96 picks in \"picks\"");
    }
    free(more), free(text), free(picks);
    ff_profile_doc_free(d);
    free(d);
}

/* The collective model from a profile: keys it lacks keep the model's
 * values, a level without small_max has one regime, reduce_Bps 0 keeps the
 * model's, the picks are the file's. */
static void test_merge(void)
{
    ff_profile_doc d;
    char err[512] = "";
    ff_coll_model m, base;
    ff_coll_model_default(&base);
    base.small_max_intra_B = 4096, base.alpha_intra_small_s = 1e-6, base.beta_intra_small_Bps = 1e9;
    base.n_picks = 1;
    base.picks[0] = (ff_coll_pick_rule){FF_COLL_ALLREDUCE, 2, 2, 0, 8, FF_ALGO_RING};
    const char *text = COLL_HEAD "\"alpha_inter_s\":2e-4,\"reduce_Bps\":0,"
                                 "\"small_max_inter_B\":1024,\"alpha_inter_small_s\":1e-5,"
                                 "\"beta_inter_small_Bps\":5e8}";
    int rc = parse_doc(text, &d, err, sizeof err);
    CHECK(rc == FF_OK, "merge profile: %s", err);
    m = base;
    CHECK(ff_profile_doc_coll_model(&d, &m, err, sizeof err) == FF_OK, "merge: %s", err);
    CHECK(m.alpha_inter_s == 2e-4 && m.beta_inter_Bps == base.beta_inter_Bps &&
              m.alpha_intra_s == base.alpha_intra_s && m.reduce_Bps == base.reduce_Bps &&
              m.small_max_intra_B == 0 && m.small_max_inter_B == 1024 &&
              m.beta_inter_small_Bps == 5e8 && m.n_picks == 0 &&
              m.strict_volume == base.strict_volume,
          "merge: alpha_inter %g, reduce %g, small_max intra %g inter %g, %d picks",
          m.alpha_inter_s, m.reduce_Bps, m.small_max_intra_B, m.small_max_inter_B, m.n_picks);
    ff_profile_doc_free(&d);
    printf("merge  %-40s ok\n", "absent keys, reduce_Bps 0, regimes, picks");
}

/* ff_profile_fit_gemm recovers a curve it could fit exactly: rates made by
 * the planner's own time (plan_gemm_time's formula, written out here) for
 * h = 40 and 3 us per call at 1e12 FLOP/s on 9 shapes, then for h = 0 and
 * no call time (a flat CPU), each to the grid's exactness (relative 1e-12):
 * at the given rate, and with the rate found from the 1024^3 shape, as
 * `bench profile` fits. Bad input is refused. */
static void test_gemm_fit(void)
{
    const double truth[2][2] = {{40, 3e-6}, {0, 0}};
    const int dims[9][3] = {{64, 1024, 1024},  {1024, 64, 1024},  {1024, 1024, 64},
                            {64, 64, 64},      {256, 1024, 1024}, {1024, 256, 1024},
                            {1024, 1024, 256}, {256, 256, 256},   {1024, 1024, 1024}};
    double shapes[9][4], fitted[9], rate, h, call, med, max;
    for (int c = 0; c < 4; c++) {
        const double *t = truth[c / 2];
        for (int i = 0; i < 9; i++) {
            double m = dims[i][0], n = dims[i][1], k = dims[i][2], w = 2 * m * n * k;
            double eff = 1 / (1 + t[0] / m + t[0] / n + t[0] / k);
            shapes[i][0] = m, shapes[i][1] = n, shapes[i][2] = k;
            shapes[i][3] = w / (t[1] + w / (1e12 * eff));
        }
        int anchor = c % 2 ? 8 : -1;
        rate = anchor < 0 ? 1e12 : 0;
        int rc = ff_profile_fit_gemm((const double(*)[4])shapes, 9, anchor, &rate, &h, &call,
                                     fitted, &med, &max);
        printf("gemm fit: made with h %g, call %g s, rate 1e12%s: h %g, call %g s, rate %.12g, "
               "largest error %.2g (tolerance 1e-12)\n",
               t[0], t[1], anchor < 0 ? " (given)" : " (found from 1024^3)", h, call, rate, max);
        CHECK(rc == FF_OK && h == t[0] && fabs(call - t[1]) < 1e-15 &&
                  fabs(rate / 1e12 - 1) < 1e-12 && max < 1e-12 && med <= max,
              "fit of h %g, call %g: got rc %d, h %g, call %g, rate %g, median %g, max %g", t[0],
              t[1], rc, h, call, rate, med, max);
        for (int i = 0; rc == FF_OK && i < 9; i++)
            CHECK(fabs(fitted[i] / shapes[i][3] - 1) < 1e-12, "shape %d: fitted %g, made %g", i,
                  fitted[i], shapes[i][3]);
    }
    rate = 1e12;
    CHECK(ff_profile_fit_gemm((const double(*)[4])shapes, 0, -1, &rate, &h, &call, NULL, NULL,
                              NULL) == FF_EINVAL,
          "no shapes accepted");
    shapes[3][3] = 0; /* a failed measurement */
    CHECK(ff_profile_fit_gemm((const double(*)[4])shapes, 9, 8, &rate, &h, &call, NULL, NULL,
                              NULL) == FF_EINVAL,
          "a rate of 0 accepted");
    shapes[3][3] = 1e11, shapes[3][1] = 0;
    CHECK(ff_profile_fit_gemm((const double(*)[4])shapes, 9, 8, &rate, &h, &call, NULL, NULL,
                              NULL) == FF_EINVAL,
          "a side of 0 accepted");
    rate = NAN, shapes[3][1] = 64;
    CHECK(ff_profile_fit_gemm((const double(*)[4])shapes, 9, -1, &rate, &h, &call, NULL, NULL,
                              NULL) == FF_EINVAL,
          "a rate of NaN accepted");
}

int main(void)
{
    test_good();
    test_bad();
    test_files();
    test_picks();
    test_round_trip();
    test_capacity();
    test_merge();
    test_gemm_fit();
    return test_finish("test_plan_profile");
}
