/* The draft head's dense pieces (engine/draft/head_net.py) in one call each: float16 weights in our packed
 * layout, float32 inputs, sums and outputs (small_gemm_f32.c built with -DWEIGHT_F16, linked beside it).
 *
 * The weights are float16, or Q8_0 groups for the integer kernel beside a target that runs it (dot = 1).
 *
 * A head step is a few rows through 4.6M parameters: in torch each piece was a dozen calls (norms, concat,
 * split, silu, residual adds) around its linears, 0.4 to 0.8 ms a piece, several times the linears' own
 * time. The pieces stay separate functions because the drafter's Python decides between them (which rows get
 * a query, the tree's frontier, attention over the head's own cache); only what is dense moves here.
 *
 * rms(x) = x / sqrt(mean(x^2) + eps), its sum of squares in 8 lanes in a fixed order, then pairwise: a row gives
 * the same bits in any batch, as the linears do, so the head's tree for a sequence is the one grown alone.
 */
#include <stdlib.h>

#include "row_ops.h"
#include "small_gemm_f32.h"
#include "small_gemm_qdot.h"

/* a head linear: float16 weights (dot 0), or Q8_0 groups times 8-bit inputs (dot 1, small_gemm_qdot.c) */
static int lin(int dot, const float *x, const void *w, float *y, const float *other, int64_t m, int64_t k,
               int64_t n, int post) {
    if (dot) return small_gemm_q8_0_dot(x, w, y, other, m, k, n, post);
    small_gemm_f16w(x, w, y, other, m, k, n, post);
    return 0;
}

/* out [n, d] = clamp((feats - mu) / sigma, -10, 10) Wfc, feats [n, n_in] */
int head_fuse(const float *feats, int64_t n, int64_t n_in, const float *mu, const float *sigma, const void *wfc,
              int64_t d, float *out, int dot) {
    float *z = malloc(sizeof(float) * n * n_in);
    if (!z) return -1;
    for (int64_t i = 0; i < n * n_in; i++) {
        const float v = (feats[i] - mu[i % n_in]) / sigma[i % n_in];
        z[i] = v < -10.0f ? -10.0f : (v > 10.0f ? 10.0f : v);
    }
    const int failed = lin(dot, z, wfc, out, NULL, n, n_in, d, 0);
    free(z);
    return failed ? -1 : 0;
}

/* y [n, n_out] = [rms(emb) * w_emb, rms(feat) * w_feat] W, then rotary embedding over its first n_rope heads of
 * width hd (q's heads then k's: v is not rotated), at cos, sin [n, hd]:
 *     rope(z)[i] = z[i] cos[i] - z[i + hd/2] sin[i] (i < hd/2),  z[i] cos[i] + z[i - hd/2] sin[i] (above) */
int head_qkv(const float *feat, const float *emb, int64_t n, int64_t d, const float *w_emb, const float *w_feat,
             float eps, const void *w, int64_t n_out, int n_rope, int hd, const float *cos, const float *sin,
             float *y, int dot) {
    float *x = malloc(sizeof(float) * n * 2 * d);
    if (!x || hd > 512) {
        free(x);
        return -1;
    }
    for (int64_t r = 0; r < n; r++) {
        rms_row(emb + r * d, w_emb, x + r * 2 * d, d, eps);
        rms_row(feat + r * d, w_feat, x + r * 2 * d + d, d, eps);
    }
    const int failed = lin(dot, x, w, y, NULL, n, 2 * d, n_out, 0);
    free(x);
    if (failed) return -1;
    for (int64_t r = 0; r < n; r++) rope_row(y + r * n_out, n_rope, hd, cos + r * hd, sin + r * hd);
    return 0;
}

/* out [n, d] = h + (silu(a) * b) Wd, [a | b] = (rms(h) * w_post) Wgu (gate then up, mlp each), h = feat + attn Wo */
int head_finish(const float *feat, const float *attn, int64_t n, int64_t d, int64_t nq, int64_t mlp,
                const void *wo, const float *w_post, const void *wgu, const void *wd, float eps, float *out, int dot) {
    float *y = malloc(sizeof(float) * n * d), *gu = malloc(sizeof(float) * n * 2 * mlp);
    float *m = malloc(sizeof(float) * n * mlp);
    if (!y || !gu || !m) {
        free(y), free(gu), free(m);
        return -1;
    }
    int failed = lin(dot, attn, wo, out, feat, n, nq, d, 2);  /* out = attn Wo + feat */
    for (int64_t r = 0; r < n && !failed; r++) rms_row(out + r * d, w_post, y + r * d, d, eps);
    failed = failed || lin(dot, y, wgu, gu, NULL, n, d, 2 * mlp, 0);
    for (int64_t r = 0; r < n && !failed; r++) {
        const float *a = gu + r * 2 * mlp, *b = a + mlp;
        int64_t j = 0;
        for (; j + NB <= mlp; j += NB) VSTORE(m + r * mlp + j, VMULF(silu_vec(VLOAD(a + j)), VLOAD(b + j)));
        for (; j < mlp; j++) m[r * mlp + j] = silu(a[j]) * b[j];
    }
    failed = failed || lin(dot, m, wd, out, out, n, mlp, d, 2);  /* out += m Wd, in place: each output reads its own first */
    free(y), free(gu), free(m);
    return failed ? -1 : 0;
}

/* out [n, n_vocab] = (rms(g) * w_norm) Wlm */
int head_logits(const float *g, int64_t n, int64_t d, const float *w_norm, float eps, const void *wlm,
                int64_t n_vocab, float *out, int dot) {
    float *y = malloc(sizeof(float) * n * d);
    if (!y) return -1;
    for (int64_t r = 0; r < n; r++) rms_row(g + r * d, w_norm, y + r * d, d, eps);
    const int failed = lin(dot, y, wlm, out, NULL, n, d, n_vocab, 0);
    free(y);
    return failed ? -1 : 0;
}
