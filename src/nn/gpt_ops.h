/* The GPT's operations outside the linear layers (src/nn/gpt_ops.c): pairs
 * of forward and backward functions in llm.c's style, shapes in comments,
 * gradients of parameters accumulated (+=), no allocation inside. Rows are
 * the rank's token rows; a layout-Y op sees C/Gy columns and all-reduces its
 * row statistics over Y, a layout-X op (attention, GELU) sees its heads or
 * its slice of the MLP. Internal to the library. */
#ifndef FF_GPT_OPS_H
#define FF_GPT_OPS_H

#include <stdint.h>

#include "device.h"
#include "fourfold/comm.h"
#include "passes.h"

/* out, inp (m, cl); w, b (cl); mean, rstd (m) saved for the backward; the
 * row has C columns in all, split over gy. Two passes (mean, then the sum of
 * squared deviations), each one AllReduce_Y of m floats. */
int ff_ln_forward(ff_group *gy, float *out, float *mean, float *rstd, const float *inp,
                  const float *w, const float *b, int64_t m, int64_t cl, int64_t C);
/* out = the LayerNorm of inp with the mean and rstd ff_ln_forward left
 * (local: no communication; the same bits as its forward). */
void ff_ln_apply(ff_ctx *ctx, float *out, const float *mean, const float *rstd, const float *inp,
                 const float *w, const float *b, int64_t m, int64_t cl);
/* dinp += d LayerNorm; dw, db += their gradients. The two row sums of the
 * gradient formula in one AllReduce_Y of 2m floats (scratch:
 * FF_LN_SCRATCH(m, cl): those, and per block of rows its sums of dw, db). */
#define FF_LN_SCRATCH(m, cl) (2 * (m) + 2 * (cl) * (((m) + FF_LN_BLOCK - 1) / FF_LN_BLOCK))
int ff_ln_backward(ff_group *gy, float *dinp, float *dw, float *db, const float *dout,
                   const float *inp, const float *w, const float *mean, const float *rstd,
                   int64_t m, int64_t cl, int64_t C, float *scratch);

/* The QKV layer's output columns (3C, canonical [Q | K | V], heads
 * contiguous in each) in the order blocks are cut over gx ranks of X:
 * column j is canonical column perm[j], so block x holds [Q | K | V] of its
 * heads. malloc'd (NULL when out of memory); the caller frees it. */
int64_t *ff_qkv_permutation(int64_t C, int gx);

/* Causal self-attention of nh local heads of size hs over B sequences of T:
 * qkv (B*T, 3*nh*hs) as [Q heads | K heads | V heads], out (B*T, nh*hs),
 * att (B, nh, T, T) the softmax probabilities, kept for the backward. */
void ff_attention_forward(ff_ctx *ctx, float *out, float *att, const float *qkv, int B, int T,
                          int nh, int hs);
/* dqkv (B*T, 3*nh*hs) overwritten; dout (B*T, nh*hs); scratch (T, T) per
 * thread of the context. */
void ff_attention_backward(ff_ctx *ctx, float *dqkv, float *scratch, const float *dout,
                           const float *qkv, const float *att, int B, int T, int nh, int hs);
/* bf16-mixed (docs/design.md §13): the same with every product's operands
 * rounded to bf16 and fp32 sums: S = scale bf16(Q) bf16(K)^T, the softmax in
 * fp32 (att keeps fp32 P), O = bf16(P) bf16(V); backward dP = bf16(dO)
 * bf16(V)^T, dS by the softmax's backward in fp32 on fp32 P, dQ = scale
 * bf16(dS) bf16(K), dK = scale bf16(dS)^T bf16(Q), dV = bf16(P)^T bf16(dO).
 * The rounded copies go to bscratch, FF_ATTN_BF16_SCRATCH(T, hs) floats per
 * thread of the context; the products stay on the BLAS on either product
 * path (the exact emulation). */
#define FF_ATTN_BF16_SCRATCH(T, hs) (4 * (int64_t)(T) * (hs) + (int64_t)FF_ATTENTION_ROWS * (T))
void ff_attention_forward_bf16(ff_ctx *ctx, float *out, float *att, const float *qkv, int B, int T,
                               int nh, int hs, float *bscratch);
void ff_attention_backward_bf16(ff_ctx *ctx, float *dqkv, float *scratch, const float *dout,
                                const float *qkv, const float *att, int B, int T, int nh, int hs,
                                float *bscratch);
/* The same without the causal mask: every query sees every key (the U-Net's
 * attention over an image's pixels); on the CPU's team only. */
void ff_attention_full_forward(ff_ctx *ctx, float *out, float *att, const float *qkv, int B, int T,
                               int nh, int hs);
void ff_attention_full_backward(ff_ctx *ctx, float *dqkv, float *scratch, const float *dout,
                                const float *qkv, const float *att, int B, int T, int nh, int hs);

/* GELU, tanh approximation (GPT-2). out, inp (n). */
void ff_gelu_forward(ff_ctx *ctx, float *out, const float *inp, int64_t n);
/* dinp = dout * GELU'(inp), overwritten (may alias dout). */
void ff_gelu_backward(ff_ctx *ctx, float *dinp, const float *inp, const float *dout, int64_t n);
/* out = a + b, elementwise (n; out may alias either). */
void ff_add(ff_ctx *ctx, float *out, const float *a, const float *b, int64_t n);
/* out = a * b, elementwise (n; out may alias either). */
void ff_mul(ff_ctx *ctx, float *out, const float *a, const float *b, int64_t n);
/* out[0..n) = 0. */
void ff_zero(ff_ctx *ctx, float *out, int64_t n);

/* Vocab-parallel embedding, rows (m, cl): out = AllReduce_X(lookup) + wpe.
 * The rank's vocabulary block is [v0, v0 + vl); wte_block (vl, cl) holds its
 * rows; a token outside gives zeros before the all-reduce. wpe (maxT, cl). */
int ff_embed_forward(ff_group *gx, float *out, const int32_t *tokens, const float *wte_block,
                     const float *wpe, int64_t B, int64_t T, int64_t v0, int64_t vl, int64_t cl);
/* The same reading the rows from wte's 2-byte bf16 copy (bf16-mixed). */
int ff_embed_forward_bf16(ff_group *gx, float *out, const int32_t *tokens, const uint16_t *wte16,
                          const float *wpe, int64_t B, int64_t T, int64_t v0, int64_t vl,
                          int64_t cl);
/* dwte_block (vl, cl) += rows of dout for the rank's tokens; dwpe += dout
 * summed over the rank's sequences. */
void ff_embed_backward(ff_ctx *ctx, float *dwte_block, float *dwpe, const float *dout,
                       const int32_t *tokens, int64_t B, int64_t T, int64_t v0, int64_t vl,
                       int64_t cl);

/* Vocab-parallel cross-entropy over X. logits (m, vl): the rank's block
 * [v0, v0 + vl) of the padded vocabulary; columns >= V are padding and take
 * no part. One AllGather_X of 3 floats per row (local max, local sum of
 * exponentials, target logit), combined in rank order, so every X rank gets
 * the same losses (m, each row's -log p(target)). scratch: 3m + gx*3m + vl
 * per thread of the context.
 * With dscale != 0 the logits are overwritten by d(loss)/d(logits) of
 * dscale * sum(losses): dscale * (softmax - onehot), zeros on padding. */
int ff_crossentropy(ff_group *gx, float *losses, float *logits, const int32_t *targets, int64_t m,
                    int64_t v0, int64_t vl, int64_t V, float dscale, float *scratch);

/* A linear layer's bias (linear.c): FF_PASS_BIAS_ADD, out rows [r0, r0 +
 * rows) += b; FF_PASS_BIAS_GRAD, db += dout's column sums in blocks of rows
 * (passes.h). */
void ff_bias_pass(ff_ctx *ctx, ff_pass_id id, const bias_job *j);

#endif
