/* Attention of each row over its own cells (cell_attention.c): what lean_layers.c calls once per layer.
 *
 * The row groups and attend_rows are the library's own (hidden: not exported from the .so, and called
 * directly, not through its symbol table); cell_attention is the call engine/forward/attention.py makes.
 */
#ifndef CELL_ATTENTION_H
#define CELL_ATTENTION_H

#include <stdint.h>

#define KERNEL_INTERNAL __attribute__((visibility("hidden")))

/* A forward's rows by groups (start[gi] .. start[gi + 1], sharing their first shared[gi] cells), made once for
 * all its layers: every layer sees the same cells. n = 0: rows one at a time (no groups in this build, or a
 * head shape the groups do not take). */
typedef struct {
    int64_t *start, *shared;
    int64_t n;
} RowGroups;

/* Returns 0, or -1 where memory for the groups could not be had. */
KERNEL_INTERNAL int row_groups(RowGroups *g, const int64_t *row_ptr, const int64_t *cells, int64_t n_rows,
                               int n_heads, int n_kv_heads, int head_dim);
KERNEL_INTERNAL void row_groups_free(RowGroups *g);

/* q [n_rows, n_heads, head_dim]; k, v: key head h at k + h * head_stride, cell c at + c * head_dim;
 * row r sees cells[row_ptr[r] .. row_ptr[r + 1]) in position order; out [n_rows, n_heads, head_dim];
 * groups: row_groups() of this layout. Returns 0, or -1 if scratch memory could not be had. */
KERNEL_INTERNAL int attend_rows(const float *q, const float *k, const float *v, int64_t head_stride,
                                const int64_t *row_ptr, const int64_t *cells, float *out, int64_t n_rows,
                                int n_heads, int n_kv_heads, int head_dim, float scale, const RowGroups *groups);

/* attend_rows for one call, the groups made for it alone */
int cell_attention(const float *q, const float *k, const float *v, int64_t head_stride, const int64_t *row_ptr,
                   const int64_t *cells, float *out, int64_t n_rows, int n_heads, int n_kv_heads, int head_dim,
                   float scale);

#endif
