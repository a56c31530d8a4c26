"""Row attention over the cell cache: the C kernel computes softmax(q k^T * scale) v over exactly each row's
cells, equal to SDPA to float32 rounding; and a row's result is the same bits in any batch, over any storage of
its cells."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from engine.forward.attention import CellLayout, RowAttention, cell_layout
from engine.forward.kernels.build import cpu_flags

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: the kernel cannot be built")


def _kernel() -> RowAttention:
    impl = RowAttention(torch.device("cpu"), torch.float32)
    assert impl.kernel is not None, impl.reason
    return impl


def _layout(rows: list[list[int]]) -> CellLayout:
    ptr = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
    return CellLayout(ptr, torch.tensor([c for r in rows for c in r], dtype=torch.long))


@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 2, 16), (6, 6, 24), (9, 3, 64), (8, 1, 80)])
def test_kernel_equals_sdpa_over_each_rows_cells(heads, kv_heads, dim):
    g = torch.Generator().manual_seed(heads * dim)
    n_cells = 70
    cache_k = torch.randn(1, kv_heads, 128, dim, generator=g)  # a view of more cells than live, like the cache
    cache_v = torch.randn(1, kv_heads, 128, dim, generator=g)
    k, v = cache_k[:, :, :n_cells], cache_v[:, :, :n_cells]
    rows = [list(range(40)), [3, 9, 12, 50, 51], list(range(69, -1, -1))[::-1], [7]]
    q = torch.randn(len(rows), heads, dim, generator=g)
    out = _kernel().rows(_layout(rows)).attend(q, k, v, dim ** -0.5)
    for r, cells in enumerate(rows):
        kk = k[0, :, cells].repeat_interleave(heads // kv_heads, 0)
        vv = v[0, :, cells].repeat_interleave(heads // kv_heads, 0)
        want = F.scaled_dot_product_attention(q[r][:, None], kk, vv, scale=dim ** -0.5)[:, 0]
        torch.testing.assert_close(out[r], want, rtol=1e-5, atol=1e-5)


def test_kernel_row_is_the_same_bits_in_any_batch_and_any_storage():
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(1, 3, 400, 64, generator=g), torch.randn(1, 3, 400, 64, generator=g)
    q = torch.randn(9, 9, 64, generator=g)
    impl = _kernel()
    alone = [impl.rows(_layout([list(range(300 + r))])).attend(q[r:r + 1], k, v, 0.125) for r in range(9)]
    together = impl.rows(_layout([list(range(300 + r)) for r in range(9)])).attend(q, k, v, 0.125)
    for r in range(9):
        assert torch.equal(alone[r][0], together[r])
    # the same keys stored elsewhere (a tree's nodes, a shared prefix): same bits when listed in position order
    perm = torch.randperm(400, generator=g)
    k2, v2 = torch.empty_like(k), torch.empty_like(v)
    k2[0, :, perm], v2[0, :, perm] = k[0], v[0]
    moved = impl.rows(_layout([perm[:305].tolist()])).attend(q[5:6], k2, v2, 0.125)
    assert torch.equal(moved[0], together[5])


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="no AVX512F: the kernel has only its 8-wide vectors here")
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (16, 4), (8, 8), (4, 2)])
def test_16_wide_vectors_give_the_bits_of_8_wide_ones(heads, kv_heads):
    # the same additions in the same order whatever the vector width: a model gives the same text on an AVX2 and
    # an AVX512 CPU
    g = torch.Generator().manual_seed(heads)
    k, v = torch.randn(1, kv_heads, 300, 64, generator=g), torch.randn(1, kv_heads, 300, 64, generator=g)
    rows = [list(range(250 + r)) for r in range(6)] + [[2, 5, 7, 90, 91]]
    q = torch.randn(len(rows), heads, 64, generator=g)
    narrow = RowAttention(torch.device("cpu"), torch.float32, defines=("BLOCK8",))
    wide = _kernel().rows(_layout(rows)).attend(q, k, v, 0.125)
    assert torch.equal(wide, narrow.rows(_layout(rows)).attend(q, k, v, 0.125))


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (16, 4), (4, 4), (4, 2)])
def test_rows_attending_in_groups_give_the_bits_of_rows_attending_alone(heads, kv_heads):
    # rows sharing their first cells (a slot's draft tree, a prompt's rows) load each key once for the group;
    # every row must still get the bits it gets alone, whatever the group it fell in
    g = torch.Generator().manual_seed(heads * kv_heads)
    k, v = torch.randn(1, kv_heads, 700, 64, generator=g) * 3, torch.randn(1, kv_heads, 700, 64, generator=g)
    perm = torch.randperm(700, generator=g).tolist()
    a, b, c, d = perm[600:604]
    tree = [perm[:333] + path for path in ([a], [b], [a, c], [b, d], [a, c, d], [])]  # a prefix, then ancestors
    prompt = [perm[:r] for r in range(100, 109)]  # row r sees the r cells before it
    rows = tree + [perm[:40], [], list(range(17)), perm[:30] + [1, 2]] + prompt + [[5]]
    q = torch.randn(len(rows), heads, 64, generator=g)
    alone = RowAttention(torch.device("cpu"), torch.float32, defines=("ROW_AT_A_TIME",))
    grouped = _kernel().rows(_layout(rows)).attend(q, k, v, 0.125)
    assert torch.equal(grouped, alone.rows(_layout(rows)).attend(q, k, v, 0.125))
    for r in (0, 5, 9, 12, 19):
        assert torch.equal(grouped[r], _kernel().rows(_layout([rows[r]])).attend(q[r:r + 1], k, v, 0.125)[0])


def test_layout_lists_each_rows_cells_in_position_order():
    mask = torch.full((1, 1, 3, 5), float("-inf"))
    mask[0, 0, 0, [0, 1]] = 0
    mask[0, 0, 1, [0, 1, 4]] = 0
    mask[0, 0, 2, [2, 3, 4]] = 0
    pos = torch.tensor([0, 1, 4, 3, 2])  # cell 4 holds position 2, before cells 3 and 2
    layout = cell_layout(mask, pos)
    assert layout.row_ptr.tolist() == [0, 2, 5, 8]
    assert layout.cells.tolist() == [0, 1, 0, 1, 4, 4, 3, 2]
    assert not layout.one_run_per_row()
    assert cell_layout(mask[:, :, :1]).one_run_per_row()
