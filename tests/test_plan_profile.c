/* Machine profiles: the JSON schema `fourfold bench profile` writes and the
 * planner reads (docs/planner.md). Good files (the schema's example, a file
 * with an unknown nested "fit" object, the minimum), every kind of corrupt
 * file with the message it must give, files on disk, and the round trip of
 * every preset through JSON. Runs without MPI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fourfold/plan.h"
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
              p.intra_overlap == 0 && p.axonn_table == FF_AXONN_TABLE_NONE,
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
    bad("huge number", HEAD REQ ",\"peak_flops\":1e999}", FF_EINVAL, "out of range");
    bad("leading plus", HEAD REQ ",\"peak_flops\":+1}", FF_EINVAL, "must be a number");
    bad("trailing dot", HEAD REQ ",\"peak_flops\":1.}", FF_ECORRUPT, "malformed number");
    bad("trailing comma", HEAD REQ ",}", FF_ECORRUPT, "expected a string");
    bad("text after the object", HEAD REQ "} x", FF_ECORRUPT, "unexpected text after");
    bad("two objects", HEAD REQ "}{}", FF_ECORRUPT, "unexpected text after");
    bad("bad escape", HEAD REQ ",\"name\":\"a\\qb\"}", FF_ECORRUPT, "bad escape");
    bad("control character", HEAD REQ ",\"name\":\"a\tb\"}", FF_ECORRUPT, "control character");
    bad("bad literal in unknown key", HEAD REQ ",\"fit\":tru}", FF_ECORRUPT, "expected a value");
    bad("nan in unknown key", HEAD REQ ",\"fit\":{\"rms\":nan}}", FF_ECORRUPT, "expected a value");
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
    memcpy(deep, HEAD REQ ",\"fit\":", strlen(HEAD REQ ",\"fit\":"));
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
                   b.axonn_table == FF_AXONN_TABLE_NONE;
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

int main(void)
{
    test_good();
    test_bad();
    test_files();
    return test_finish("test_plan_profile");
}
