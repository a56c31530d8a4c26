/* Every decoder layer of a lean-forward model in one call: float32 weights in our packed layout (or a GGUF's blocks),
 * float32 residual stream, the cell cache and the row attention of cell_attention.c.
 *
 * The lean forward (engine/forward/lean.py) spends about 40 small torch operations a layer between its linears: norms,
 * rotary embedding, copies into the cache, reshapes, dtype round trips. At one to a few rows each costs its
 * dispatch, not its arithmetic, and on the embedded model (30 layers) they come to 10 to 15 ms of a 55 ms
 * forward. Here they are a few loops over a few rows, and the linears and the attention are the same kernels
 * the Python path calls (linked beside it), so a layer's output differs from it only where the norms sum: a
 * row's sum of squares runs in 8 lanes in a fixed order, then pairwise, whatever the batch. Each row is still
 * computed alone: a row gets the same bits in any batch, and plain decoding and verification agree.
 *
 * Per layer l, x [t, D] (a row per batch row), with N(z) = rms(z) * w where the layer has that norm, else z
 * (engine/forward/layer_spec.py's layouts: pre-norm has N_in and N_mlp, Gemma all four, OLMo 2 N_ao and N_mo):
 *     h = N_in(x);  q = h Wq, k = h Wk, v = h Wv;  q, k = rope(qn(q)), rope(kn(k))  (q, k norms if given)
 *     cache cells[r] of layer l <- k[r], v[r];  a = attention of q over each row's cells in the layer's layout
 *     x = N_ao(a Wo) + x;  h = N_mlp(x);  x = N_mo((act(h Wg) * (h Wu)) Wd) + x
 * act: SiLU, or GELU in its tanh form (Gemma). Gemma's norm weights come as (1 + w).
 * rope(z)[i] = z[i] cos[i] - z[i + hd/2] sin[i] for i < hd/2, z[i] cos[i] + z[i - hd/2] sin[i] above
 * (transformers' rotate_half), cos and sin [t, hd] from the model's own rotary module, one table per rotary
 * kind (Gemma 3's local and global bases).
 */
#include <stdlib.h>

#include "cell_attention.h"
#include "row_ops.h"
#include "small_gemm_f32.h"
#include "small_gemm_q.h"
#include "small_gemm_qdot.h"

/* one linear: kind 0 float32 (packed [N/NB][K][NB]), 1 Q4_1 and 2 Q8_0 blocks read as float32 (small_gemm_q.c),
 * 3 Q4_1, 4 Q8_0, 5 Q4_0, 6 Q5_0 and 7 Q6_K blocks by integer dot products (small_gemm_qdot.c); nonzero where it could
 * not run */
static int linear(int kind, const float *x, const void *w, float *y, const float *other, int64_t t, int64_t k,
                  int64_t n, int post) {
    if (kind == 1) small_gemm_q4_1(x, w, y, other, t, k, n, post);
    else if (kind == 2) small_gemm_q8_0(x, w, y, other, t, k, n, post);
    else if (kind == 3) return small_gemm_q4_1_dot(x, w, y, other, t, k, n, post);
    else if (kind == 4) return small_gemm_q8_0_dot(x, w, y, other, t, k, n, post);
    else if (kind == 5) return small_gemm_q4_0_dot(x, w, y, other, t, k, n, post);
    else if (kind == 6) return small_gemm_q5_0_dot(x, w, y, other, t, k, n, post);
    else if (kind == 7) return small_gemm_q6_k_dot(x, w, y, other, t, k, n, post);
    else small_gemm_f32(x, w, y, other, t, k, n, post);
    return 0;
}

#define GELU 1     /* flags: GELU (tanh form) on the gate instead of SiLU */
#define QK_WHOLE 2 /* the q and k norms span the whole projection (OLMo 2), not each head */

/* gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), transformers' gelu_pytorch_tanh */
static void gelu_tanh(float *g, int64_t n) {
    const float c = 0.7978845608028654f;
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
    }
}

/* rows of z [t][n_groups * width]: each group of `width` through rms with weight w, in place */
static void rms_groups(float *z, int64_t t, int n_groups, int64_t width, const float *w, float eps) {
    for (int64_t r = 0; r < t; r++)
        for (int gi = 0; gi < n_groups; gi++) {
            float *zg = z + (r * n_groups + gi) * width;
            rms_row(zg, w, zg, width, eps);
        }
}

/* each row of q [t][nq], k and v [t][nkv] plus its bias */
static void add_bias(float *q, float *k, float *v, const float *const *b, int64_t t, int64_t nq, int64_t nkv) {
    for (int64_t r = 0; r < t; r++) {
        for (int64_t i = 0; i < nq; i++) q[r * nq + i] += b[0][i];
        for (int64_t i = 0; i < nkv; i++) k[r * nkv + i] += b[1][i], v[r * nkv + i] += b[2][i];
    }
}

/* y = rms(y) * w + x, row by row: a branch's output normed into the residual stream */
static void add_normed(float *x, float *y, const float *w, int64_t t, int64_t d, float eps) {
    for (int64_t r = 0; r < t; r++) {
        rms_row(y + r * d, w, y + r * d, d, eps);
        for (int64_t i = 0; i < d; i++) x[r * d + i] += y[r * d + i];
    }
}

/* weights of layer l: w[7 * l + j] for j = q, k, v, o, gate, up, down, stored as kinds[7 * l + j]; norms[4 * l + j]
 * for j = input, attention output, pre-MLP, MLP output, each NULL where the layout has none (pre-norm: 0 and 2;
 * Gemma: all four; OLMo 2: 1 and 3); head_norms: NULL, or the q and k norm weights of layer l at 2 * l and
 * 2 * l + 1 ([hd], or the whole projection's with QK_WHOLE); qkv_bias: NULL, or the q, k and v biases of layer l at
 * 3 * l + j (Qwen2's), added to the linears' sums. kc[l], vc[l]: the layer's cache [H_kv][n_cells][hd].
 * Layer l rotates with cos[rot_of[l]], sin[rot_of[l]] [t, hd] (rot_of[l] < 0: no rotary, SmolLM3's NoPE layers)
 * and attends over layout rows_of[l] of n_layouts (row_ptr[i], cells[i]). keep[l] >= 0: copy x after layer l into
 * hidden[:, keep[l] * d .. + d] (hidden [t, n_hidden * d]). Returns 0, or -1 if memory for the scratch rows could
 * not be had. */
int lean_layers(float *x, int64_t t, int64_t d, int n_layers, const void *const *w, const int *kinds,
                const float *const *norms, const float *const *head_norms, const float *const *qkv_bias, int flags,
                float *const *kc, float *const *vc, int64_t n_cells, const int64_t *write_cells,
                const float *const *cos, const float *const *sin, const int *rot_of,
                const int64_t *const *row_ptr, const int64_t *const *cells, const int *rows_of, int n_layouts,
                int n_heads, int n_kv_heads, int hd, int64_t mlp, float scaling, float eps, const int *keep,
                float *hidden, int n_hidden) {
    const int64_t nq = (int64_t)n_heads * hd, nkv = (int64_t)n_kv_heads * hd;
    float *h = malloc(sizeof(float) * t * d), *q = malloc(sizeof(float) * t * nq);
    float *k = malloc(sizeof(float) * t * nkv), *v = malloc(sizeof(float) * t * nkv);
    float *a = malloc(sizeof(float) * t * nq), *g = malloc(sizeof(float) * t * mlp);
    RowGroups groups[4] = {{NULL, NULL, 0}, {NULL, NULL, 0}, {NULL, NULL, 0}, {NULL, NULL, 0}};
    int failed = !(h && q && k && v && a && g) || hd > 512 || n_layouts < 1 || n_layouts > 4;
    for (int i = 0; i < n_layouts && !failed; i++)  /* the same cells in every layer of a layout: groups made once */
        failed = row_groups(&groups[i], row_ptr[i], cells[i], t, n_heads, n_kv_heads, hd);
    for (int l = 0; l < n_layers && !failed; l++) {
        const void *const *wl = w + 7 * l;
        const int *kl = kinds + 7 * l;
        const float *const *nl = norms + 4 * l;
        const int lay = rows_of[l];
        const float *in = x;  /* what the attention's linears read: x, or its norm */
        if (nl[0]) {
            for (int64_t r = 0; r < t; r++) rms_row(x + r * d, nl[0], h + r * d, d, eps);
            in = h;
        }
        if (linear(kl[0], in, wl[0], q, NULL, t, d, nq, 0) || linear(kl[1], in, wl[1], k, NULL, t, d, nkv, 0) ||
            linear(kl[2], in, wl[2], v, NULL, t, d, nkv, 0)) {
            failed = 1;
            break;
        }
        if (qkv_bias) add_bias(q, k, v, qkv_bias + 3 * l, t, nq, nkv);
        if (head_norms && (flags & QK_WHOLE)) {
            rms_groups(q, t, 1, nq, head_norms[2 * l], eps);
            rms_groups(k, t, 1, nkv, head_norms[2 * l + 1], eps);
        } else if (head_norms) {
            rms_groups(q, t, n_heads, hd, head_norms[2 * l], eps);
            rms_groups(k, t, n_kv_heads, hd, head_norms[2 * l + 1], eps);
        }
        for (int64_t r = 0; r < t; r++) {
            if (rot_of[l] >= 0) {
                const float *cl = cos[rot_of[l]] + r * hd, *sl = sin[rot_of[l]] + r * hd;
                rope_row(q + r * nq, n_heads, hd, cl, sl);
                rope_row(k + r * nkv, n_kv_heads, hd, cl, sl);
            }
            for (int kh = 0; kh < n_kv_heads; kh++) {
                const int64_t at = ((int64_t)kh * n_cells + write_cells[r]) * hd;
                memcpy(kc[l] + at, k + r * nkv + (int64_t)kh * hd, sizeof(float) * hd);
                memcpy(vc[l] + at, v + r * nkv + (int64_t)kh * hd, sizeof(float) * hd);
            }
        }
        if (attend_rows(q, kc[l], vc[l], n_cells * hd, row_ptr[lay], cells[lay], a, t, n_heads, n_kv_heads, hd,
                        scaling, &groups[lay])) {
            failed = 1;
            break;
        }
        /* x = a Wo + x, in place (an output reads its x first), or with the output normed first */
        if (nl[1] ? linear(kl[3], a, wl[3], h, NULL, t, nq, d, 0) : linear(kl[3], a, wl[3], x, x, t, nq, d, 2)) {
            failed = 1;
            break;
        }
        if (nl[1]) add_normed(x, h, nl[1], t, d, eps);
        const float *in_mlp = x;
        if (nl[2]) {
            for (int64_t r = 0; r < t; r++) rms_row(x + r * d, nl[2], h + r * d, d, eps);
            in_mlp = h;
        }
        if (linear(kl[4], in_mlp, wl[4], g, NULL, t, d, mlp, flags & GELU ? 0 : 1)) { /* act(h Wg) */
            failed = 1;
            break;
        }
        if (flags & GELU) gelu_tanh(g, t * mlp);
        if (linear(kl[5], in_mlp, wl[5], g, g, t, d, mlp, 3) ||  /* (h Wu) * that, in place */
            (nl[3] ? linear(kl[6], g, wl[6], h, NULL, t, mlp, d, 0) : linear(kl[6], g, wl[6], x, x, t, mlp, d, 2))) {
            failed = 1;
            break;
        }
        if (nl[3]) add_normed(x, h, nl[3], t, d, eps);
        if (keep[l] >= 0)
            for (int64_t r = 0; r < t; r++) memcpy(hidden + (r * n_hidden + keep[l]) * d, x + r * d, sizeof(float) * d);
    }
    free(h), free(q), free(k), free(v), free(a), free(g);
    for (int i = 0; i < 4; i++) row_groups_free(&groups[i]);
    return failed ? -1 : 0;
}
