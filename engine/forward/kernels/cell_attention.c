/* Attention of each row over its own cells, in a fixed order of arithmetic (attention_row.h).
 *
 * A row's output is a function of its query and of the K/V of the cells it sees, listed in position order,
 * and of nothing else: not of the other rows of the batch, not of how many cells the cache holds, not of where
 * they are stored, not of the number of threads. So a verification forward (k+1 rows), a tree of drafts, a
 * prompt prefilled at once and plain decoding one row at a time all give the same bits for the same position.
 * BLAS and torch's SDPA choose kernels and blockings by shape, which breaks that (engine/forward/attention.py).
 *
 * With 16-wide vectors and 64-wide heads the rows go by groups: up to 4 consecutive rows whose cell lists
 * start with the same cells (a slot's draft rows over its committed prefix, a prompt's rows) share each key's
 * and value's load from memory, which a row at a time read once per row. A row's arithmetic is unchanged: 16
 * cells' dot products are reduced together by shuffles (reduce16) in exactly the pairwise order of
 * attention_row.h, and each row's weighted sums still add its cells in list order (over the shared cells, then
 * its own). -DROW_AT_A_TIME builds the kernel without groups, to compare the two.
 */
#include "attention_row.h"
#include "cell_attention.h"

#if defined(WIDE) && !defined(ROW_AT_A_TIME)
#define GROUPS 1
#define MAX_GROUP 4    /* rows a task takes together: one slot's 16 draft rows are still 4 tasks per key head */
#define MIN_SHARED 32  /* cells a row must share with the group's first to join it */

/* The pairwise reduction (w = 8, 4, 2, 1) of 16 cells' 16 lanes, a[c] lane j, for the 16 at once: each step
 * adds the same two partial sums dot4_64_g and reduce4 add. Lane 4k + m of the last step holds cell 4m + k. */
static inline __attribute__((always_inline)) __m512 reduce16(const __m512 *a) {
    __m512 w[8], x[4], y[2];
    for (int p = 0; p < 8; p++)  /* w = 8: per cell pair, [lanes 0..7 + lanes 8..15 of cell 2p | of cell 2p+1] */
        w[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int p = 0; p < 4; p++)  /* w = 4: one 128-bit block per cell 4p .. 4p+3, its lanes 0..3 */
        x[p] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * p], w[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(w[2 * p], w[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int p = 0; p < 2; p++)  /* w = 2: block k holds lanes 0, 1 of cells 8p + k and 8p + 4 + k */
        y[p] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * p], x[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(x[2 * p], x[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* w = 1: block k holds cells k, 4 + k, 8 + k, 12 + k */
    return _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* out[c] = scale * (q . k_c + 0) for 16 cells (64-wide head): dot4_64_g's lanes and adds, in cell order */
static inline __attribute__((always_inline)) void scores16(const float *qv, const float *const *kc, float scale,
                                                           float *out) {
    const __m512 q0 = _mm512_loadu_ps(qv), q1 = _mm512_loadu_ps(qv + 16);
    const __m512 q2 = _mm512_loadu_ps(qv + 32), q3 = _mm512_loadu_ps(qv + 48);
    __m512 a[16];
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++) {
        a[c] = _mm512_fmadd_ps(q0, _mm512_loadu_ps(kc[c]), _mm512_setzero_ps());
        a[c] = _mm512_fmadd_ps(q1, _mm512_loadu_ps(kc[c] + 16), a[c]);
        a[c] = _mm512_fmadd_ps(q2, _mm512_loadu_ps(kc[c] + 32), a[c]);
        a[c] = _mm512_fmadd_ps(q3, _mm512_loadu_ps(kc[c] + 48), a[c]);
    }
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512 d = _mm512_permutexvar_ps(order, reduce16(a));
    _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_add_ps(d, _mm512_setzero_ps()), _mm512_set1_ps(scale)));
}

/* One row of a group over one key head: its G query vectors, its cells, its scratch and outputs */
typedef struct {
    const float *q;        /* G * 64 */
    const int64_t *cells;  /* n cells in position order */
    int64_t n;
    float *s;              /* G * (n + 1): scores then exps, then the G sums */
    float *o;              /* G * 64 */
} RowJob;

/* o (+)= sum_{i in [i0, i1)} e_i v_{cells[i]} for R rows (their cells[i0 .. i1) the same) and G heads: each v
 * loaded once for the R * G sums, all 64 dimensions in registers; `more` continues the sums already in o */
static inline __attribute__((always_inline)) void weigh_rows_g(const float *restrict vb, const int64_t *cells,
                                                               int64_t i0, int64_t i1, const int R, const int G,
                                                               const RowJob *rows, int more) {
    __m512 a[2][4][4];
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++)
            for (int w = 0; w < 4; w++)
                a[r][g][w] = more ? _mm512_loadu_ps(rows[r].o + g * 64 + 16 * w) : _mm512_setzero_ps();
    for (int64_t i = i0; i < i1; i++) {
        const float *vc = vb + cells[i] * 64;
        __m512 x[4];
        for (int w = 0; w < 4; w++) x[w] = _mm512_loadu_ps(vc + 16 * w);
        for (int r = 0; r < R; r++)
            for (int g = 0; g < G; g++) {
                const __m512 e = _mm512_set1_ps(rows[r].s[g * rows[r].n + i]);
                for (int w = 0; w < 4; w++) a[r][g][w] = _mm512_fmadd_ps(e, x[w], a[r][g][w]);
            }
    }
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++)
            for (int w = 0; w < 4; w++) _mm512_storeu_ps(rows[r].o + g * 64 + 16 * w, a[r][g][w]);
}

static void weigh_rows(const float *vb, const int64_t *cells, int64_t i0, int64_t i1, int R, int G,
                       const RowJob *rows, int more) {
    switch (R * 4 + G) {  /* two rows' sums fill the 32 registers up to 3 heads */
    case 4 + 1: weigh_rows_g(vb, cells, i0, i1, 1, 1, rows, more); break;
    case 4 + 2: weigh_rows_g(vb, cells, i0, i1, 1, 2, rows, more); break;
    case 4 + 3: weigh_rows_g(vb, cells, i0, i1, 1, 3, rows, more); break;
    case 4 + 4: weigh_rows_g(vb, cells, i0, i1, 1, 4, rows, more); break;
    case 8 + 1: weigh_rows_g(vb, cells, i0, i1, 2, 1, rows, more); break;
    case 8 + 2: weigh_rows_g(vb, cells, i0, i1, 2, 2, rows, more); break;
    default: weigh_rows_g(vb, cells, i0, i1, 2, 3, rows, more); break;
    }
}

/* A group's rows over one key head; their first `shared` cells are the same. */
static void group_task(RowJob *rows, int nr, int64_t shared, const float *kb, const float *vb, int G,
                       float scale) {
    const int64_t *lead = rows[0].cells;
    const float *kc[16];
    int64_t i = 0;
    for (; i + 16 <= shared; i += 16) {  /* 16 keys loaded for all the group's query vectors */
        for (int c = 0; c < 16; c++) kc[c] = kb + lead[i + c] * 64;
        for (int r = 0; r < nr; r++)
            for (int g = 0; g < G; g++) scores16(rows[r].q + g * 64, kc, scale, rows[r].s + g * rows[r].n + i);
    }
    for (int r = 0; r < nr; r++) {  /* each row's cells past those: by 16, then by 4 and one at a time */
        RowJob *w = rows + r;
        int64_t j = i;
        for (; j + 16 <= w->n; j += 16) {
            for (int c = 0; c < 16; c++) kc[c] = kb + w->cells[j + c] * 64;
            for (int g = 0; g < G; g++) scores16(w->q + g * 64, kc, scale, w->s + g * w->n + j);
        }
        scores_from(w->q, kb, w->cells, j, w->n, w->n, G, 64, scale, w->s);
        softmax_heads(w->s, w->n, G, w->s + (int64_t)G * w->n);
    }
    const int R = G <= 3 ? 2 : 1;
    int r = 0;
    for (; r + R <= nr; r += R) weigh_rows(vb, lead, 0, shared, R, G, rows + r, 0);
    for (; r < nr; r++) weigh_rows(vb, lead, 0, shared, 1, G, rows + r, 0);
    for (r = 0; r < nr; r++) {
        RowJob *w = rows + r;
        if (w->n > shared) weigh_rows(vb, w->cells, shared, w->n, 1, G, w, 1);
        const float *total = w->s + (int64_t)G * w->n;
        for (int g = 0; g < G; g++)
            for (int d = 0; d < 64; d++) w->o[g * 64 + d] /= total[g];
    }
}

/* Consecutive rows into groups: start[gi] .. start[gi + 1], sharing their first shared[gi] cells. A row joins
 * while it shares MIN_SHARED cells with the group's first row and all but 64 of them. Returns the count. */
static int64_t make_groups(const int64_t *row_ptr, const int64_t *cells, int64_t n_rows, int64_t *start,
                           int64_t *shared) {
    int64_t ng = 0;
    for (int64_t r = 0; r < n_rows;) {
        const int64_t *lead = cells + row_ptr[r], n_lead = row_ptr[r + 1] - row_ptr[r];
        int64_t common = n_lead, e = r + 1;
        for (; e < n_rows && e - r < MAX_GROUP; e++) {
            const int64_t *c = cells + row_ptr[e], n = row_ptr[e + 1] - row_ptr[e];
            const int64_t m = n < n_lead ? n : n_lead;
            int64_t cp = 0;
            while (cp < m && c[cp] == lead[cp]) cp++;
            if (cp < MIN_SHARED || cp + 64 < n_lead) break;
            common = cp < common ? cp : common;
        }
        start[ng] = r;
        shared[ng++] = common;
        r = e;
    }
    start[ng] = n_rows;
    return ng;
}

static int grouped_attention(const float *q, const float *k, const float *v, int64_t head_stride,
                             const int64_t *row_ptr, const int64_t *cells, float *out, int n_heads, int n_kv_heads,
                             float scale, const int64_t *start, const int64_t *shared, int64_t ng) {
    const int G = n_heads / n_kv_heads;
    int failed = 0;
#pragma omp parallel
    {
        float *s = NULL;
        int64_t cap = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < ng * n_kv_heads; task++) {
            const int64_t gi = task / n_kv_heads, r0 = start[gi], nr = start[gi + 1] - r0;
            const int kh = (int)(task % n_kv_heads);
            const int64_t need = (int64_t)G * (row_ptr[r0 + nr] - row_ptr[r0] + nr);
            if (cap < need) {
                free(s);
                cap = need;
                s = malloc(sizeof(float) * cap);
            }
            if (!s) {
                cap = 0;
#pragma omp atomic write
                failed = 1;
                continue;
            }
            RowJob rows[MAX_GROUP];
            float *at = s;
            for (int64_t j = 0; j < nr; j++) {
                const int64_t r = r0 + j, n = row_ptr[r + 1] - row_ptr[r];
                const int64_t o = (r * n_heads + (int64_t)kh * G) * 64;
                rows[j] = (RowJob){q + o, cells + row_ptr[r], n, at, out + o};
                at += G * (n + 1);
            }
            if (rows[0].n <= 0) {  /* a row that sees nothing (alone in its group): zeros */
                for (int64_t i = 0; i < (int64_t)G * 64; i++) rows[0].o[i] = 0.0f;
                continue;
            }
            group_task(rows, (int)nr, shared[gi], k + kh * head_stride, v + kh * head_stride, G, scale);
        }
        free(s);
    }
    return failed ? -1 : 0;
}
#endif

/* the groups of a forward's rows (cell_attention.h) */
int row_groups(RowGroups *g, const int64_t *row_ptr, const int64_t *cells, int64_t n_rows, int n_heads,
               int n_kv_heads, int head_dim) {
    *g = (RowGroups){NULL, NULL, 0};
#ifdef GROUPS
    if (head_dim != 64 || n_heads / n_kv_heads > 4)
        return 0;
    g->start = malloc(sizeof(int64_t) * (n_rows + 1));
    g->shared = malloc(sizeof(int64_t) * (n_rows + 1));
    if (!g->start || !g->shared)
        return -1;
    g->n = make_groups(row_ptr, cells, n_rows, g->start, g->shared);
#else
    (void)row_ptr, (void)cells, (void)n_rows, (void)n_heads, (void)n_kv_heads, (void)head_dim;
#endif
    return 0;
}

void row_groups_free(RowGroups *g) {
    free(g->start), free(g->shared);
    *g = (RowGroups){NULL, NULL, 0};
}

/* every row of a forward over one layer's cells (cell_attention.h), by groups where there are some */
int attend_rows(const float *q, const float *k, const float *v, int64_t head_stride, const int64_t *row_ptr,
                const int64_t *cells, float *out, int64_t n_rows, int n_heads, int n_kv_heads, int head_dim,
                float scale, const RowGroups *groups) {
    const int group = n_heads / n_kv_heads;
#ifdef GROUPS
    if (groups->n > 0)
        return grouped_attention(q, k, v, head_stride, row_ptr, cells, out, n_heads, n_kv_heads, scale,
                                 groups->start, groups->shared, groups->n);
#else
    (void)groups;
#endif
    int failed = 0;
#pragma omp parallel
    {
        float *s = NULL;
        int64_t cap = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n_rows * n_kv_heads; task++) {
            const int64_t r = task / n_kv_heads, c0 = row_ptr[r], n = row_ptr[r + 1] - c0;
            const int kh = (int)(task % n_kv_heads);
            const int64_t at = (r * n_heads + (int64_t)kh * group) * head_dim;
            if (n <= 0) {  /* a row that sees nothing: zeros (nothing to average) */
                for (int64_t i = 0; i < (int64_t)group * head_dim; i++) out[at + i] = 0.0f;
                continue;
            }
            if (cap < group * (n + 1)) {
                free(s);
                cap = group * (n + 1);
                s = malloc(sizeof(float) * cap);
            }
            if (!s) {
                cap = 0;
#pragma omp atomic write
                failed = 1;
                continue;
            }
            one_task(q + at, k + kh * head_stride, v + kh * head_stride, cells + c0, n, group, head_dim, scale, s,
                     out + at);
        }
        free(s);
    }
    return failed ? -1 : 0;
}

/* attend_rows for one call (engine/forward/attention.py): the groups made for it alone */
int cell_attention(const float *q, const float *k, const float *v, int64_t head_stride, const int64_t *row_ptr,
                   const int64_t *cells, float *out, int64_t n_rows, int n_heads, int n_kv_heads, int head_dim,
                   float scale) {
    RowGroups groups;
    int failed = row_groups(&groups, row_ptr, cells, n_rows, n_heads, n_kv_heads, head_dim) ||
                 attend_rows(q, k, v, head_stride, row_ptr, cells, out, n_rows, n_heads, n_kv_heads, head_dim, scale,
                             &groups);
    row_groups_free(&groups);
    return failed ? -1 : 0;
}
