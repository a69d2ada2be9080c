/* Model shapes the planner knows by name, and their parameter counts. */
#include <stdio.h>
#include <string.h>

#include "plan/plan_internal.h"

typedef struct {
    const char *name;
    int layers, heads;
    int64_t hidden, vocab, max_seq;
    int axonn_min_tp; /* the tool's minimum Gx*Gy*Gz for this model */
} preset;

/* The GPT-5B ... GPT-640B shapes are table 5.1 of the dissertation (table I
 * of the 4D paper has 5B-80B); their vocabulary is GPT-2's, as in the
 * Megatron-LM code the paper trained. GPT-2's sizes are OpenAI's (llm.c's
 * gpt2_*.bin, 1024 positions). `tiny` is the small model of the GPT issue's
 * tests (L=2, C=64, NH=4, V=512); `mini` the default model of `fourfold
 * train` (L=4, C=128, NH=4, the byte-level vocabulary of `fourfold tokenize`),
 * `mini-moe` it with 4 experts in every second block (ff_model_moe). */
/* clang-format off */
static const preset presets[] = {
    {"gpt-5b", 24, 32, 4096, 50257, 0, 4},
    {"gpt-10b", 32, 40, 5120, 50257, 0, 8},
    {"gpt-20b", 32, 56, 7168, 50257, 0, 16},
    {"gpt-40b", 38, 72, 9216, 50257, 0, 32},
    {"gpt-60b", 56, 72, 9216, 50257, 0, 64},
    {"gpt-80b", 42, 96, 12288, 50257, 0, 64},
    {"gpt-160b", 84, 96, 12288, 50257, 0, 128},
    {"gpt-320b", 96, 128, 16384, 50257, 0, 256},
    {"gpt-640b", 192, 128, 16384, 50257, 0, 512},
    {"gpt2", 12, 12, 768, 50257, 1024, 1},
    {"gpt2-medium", 24, 16, 1024, 50257, 1024, 1},
    {"gpt2-large", 36, 20, 1280, 50257, 1024, 1},
    {"gpt2-xl", 48, 25, 1600, 50257, 1024, 1},
    {"gpt2-124m", 12, 12, 768, 50257, 1024, 1},
    {"gpt2-350m", 24, 16, 1024, 50257, 1024, 1},
    {"gpt2-774m", 36, 20, 1280, 50257, 1024, 1},
    {"gpt2-1558m", 48, 25, 1600, 50257, 1024, 1},
    {"tiny", 2, 4, 64, 512, 0, 1},
    {"mini", 4, 4, 128, 257, 0, 1},
    {"mini-moe", 4, 4, 128, 257, 0, 1},
};
/* clang-format on */
enum { NPRESETS = sizeof presets / sizeof presets[0] };

/* The U-Nets: "unet-" and a name of ff_unet_preset (src/nn/unet.c, the one
 * table of U-Net shapes). */
static const char *const unet_names[] = {"unet-tiny", "unet-fmnist", "unet-50m", "unet-250m",
                                         "unet-500m", "unet-1b",     "unet-2b",  "unet-4b"};
enum { NUNET = sizeof unet_names / sizeof unet_names[0] };

const char *ff_model_preset_name(size_t i)
{
    return i < NPRESETS ? presets[i].name : i < NPRESETS + NUNET ? unet_names[i - NPRESETS] : NULL;
}

int ff_model_preset(const char *name, ff_model *out, char *err, size_t err_len)
{
    if (name && !strncmp(name, "unet-", 5)) {
        memset(out, 0, sizeof *out);
        if (ff_unet_preset(name + 5, &out->unet) == FF_OK) {
            out->kind = FF_MODEL_UNET;
            snprintf(out->name, sizeof out->name, "%s", name);
            return FF_OK;
        }
    }
    for (size_t i = 0; name && i < NPRESETS; i++) {
        if (strcmp(name, presets[i].name) != 0)
            continue;
        memset(out, 0, sizeof *out);
        snprintf(out->name, sizeof out->name, "%s", presets[i].name);
        out->layers = presets[i].layers;
        out->heads = presets[i].heads;
        out->hidden = presets[i].hidden;
        out->vocab = presets[i].vocab;
        out->max_seq = presets[i].max_seq;
        if (!strcmp(name, "mini-moe")) /* `fourfold train --model mini-moe` */
            ff_model_moe(out, 4);
        return FF_OK;
    }
    char names[512] = "";
    size_t used = 0;
    for (size_t i = 0; ff_model_preset_name(i) && used < sizeof names; i++)
        used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                                 ff_model_preset_name(i));
    return ff_format_error(err, err_len, FF_EINVAL, "unknown model '%s' (known: %s)",
                           name ? name : "", names);
}

void ff_model_moe(ff_model *m, int E)
{
    m->experts = E;
    m->expert_every = 2;
    m->top_k = 1;
    m->capacity_factor = 1.25;
}

int ff_model_block_is_moe(const ff_model *m, int l)
{
    return m->experts > 0 && m->expert_every > 0 && (l + 1) % m->expert_every == 0;
}

int ff_model_axonn_min_tp(const ff_model *m)
{
    for (size_t i = 0; i < NPRESETS; i++)
        if (!strcmp(m->name, presets[i].name) && m->layers == presets[i].layers &&
            m->hidden == presets[i].hidden && m->heads == presets[i].heads)
            return presets[i].axonn_min_tp;
    return 1;
}

int ff_model_check(const ff_model *m, char *err, size_t err_len)
{
    if (m->kind == FF_MODEL_UNET)
        return plan_unet_model_check(&m->unet, err, err_len);
    if (m->kind != FF_MODEL_GPT)
        return ff_format_error(err, err_len, FF_EINVAL, "unknown model kind %d", (int)m->kind);
    if (m->layers < 1 || m->layers > 100000)
        return ff_format_error(err, err_len, FF_EINVAL, "layers %d: expected 1 to 100000",
                               m->layers);
    if (m->heads < 1)
        return ff_format_error(err, err_len, FF_EINVAL, "heads %d: expected a positive number",
                               m->heads);
    /* bounds keep every product below 2^63: C^2 * L * 12 and V * C */
    if (m->hidden < 1 || m->hidden > ((int64_t)1 << 20))
        return ff_format_error(err, err_len, FF_EINVAL, "hidden size %lld: expected 1 to 1048576",
                               (long long)m->hidden);
    if (m->vocab < 1 || m->vocab > ((int64_t)1 << 30))
        return ff_format_error(err, err_len, FF_EINVAL, "vocabulary %lld: expected 1 to 2^30",
                               (long long)m->vocab);
    if (m->hidden % m->heads)
        return ff_format_error(err, err_len, FF_EINVAL,
                               "hidden size %lld is not divisible by the %d heads",
                               (long long)m->hidden, m->heads);
    if (m->max_seq < 0 || m->max_seq > ((int64_t)1 << 24))
        return ff_format_error(err, err_len, FF_EINVAL, "positions %lld: expected 0 to 2^24",
                               (long long)m->max_seq);
    /* the training program's limits (src/nn/moe.c) */
    if (m->experts < 0 || m->experts > 4096)
        return ff_format_error(err, err_len, FF_EINVAL, "%d experts: expected 0 (dense) to 4096",
                               m->experts);
    if (m->experts > 0 && (m->expert_every < 1 || m->expert_every > m->layers))
        return ff_format_error(err, err_len, FF_EINVAL,
                               "experts in one block of every %d: expected 1 to the %d blocks",
                               m->expert_every, m->layers);
    if (m->experts > 0 && (m->top_k < 1 || m->top_k > 2 || m->top_k > m->experts))
        return ff_format_error(err, err_len, FF_EINVAL,
                               "top-%d routing with %d experts: expected top-1 or top-2, at most "
                               "the number of experts",
                               m->top_k, m->experts);
    if (m->experts > 0 && !(m->capacity_factor > 0 && m->capacity_factor <= 1e6))
        return ff_format_error(err, err_len, FF_EINVAL,
                               "capacity factor %g: expected a number above 0, at most 1e6",
                               m->capacity_factor);
    return FF_OK;
}

int64_t ff_model_padded_vocab(const ff_model *m) { return (m->vocab + 127) / 128 * 128; }

/* Per block: four weights (3C^2 + C^2 + 4C^2 + 4C^2 = 12C^2), their biases
 * (3C + C + 4C + C = 9C) and two LayerNorms (4C). */
static int64_t block_params(int64_t c) { return 12 * c * c + 13 * c; }

/* An MoE block: the router (C E) and E experts, each the MLP's weights and
 * biases (8C^2 + 5C), in place of the MLP; `experts` of them counted. */
static int64_t moe_block_params(const ff_model *m, int experts)
{
    int64_t c = m->hidden;
    return block_params(c) - (8 * c * c + 5 * c) + c * m->experts + experts * (8 * c * c + 5 * c);
}

static int64_t params_with(const ff_model *m, int experts)
{
    int64_t c = m->hidden, n = ff_model_padded_vocab(m) * c + 2 * c;
    for (int l = 0; l < m->layers; l++)
        n += ff_model_block_is_moe(m, l) ? moe_block_params(m, experts) : block_params(c);
    return n;
}

int64_t ff_model_matmul_params(const ff_model *m)
{
    return m->kind == FF_MODEL_UNET ? plan_unet_params(&m->unet) : params_with(m, m->top_k);
}

int64_t ff_model_params(const ff_model *m, int64_t seq)
{
    if (m->kind == FF_MODEL_UNET)
        return plan_unet_params(&m->unet);
    int64_t positions = m->max_seq > 0 ? m->max_seq : seq;
    return params_with(m, m->experts) + positions * m->hidden;
}
