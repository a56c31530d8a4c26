"""engine/forward/gguf_table.py against gguf-py's GGUFReader: the same tensors (names, shapes, types, bytes) from a
file with every kind of metadata value, a non-default alignment, and clear refusals of what is not a GGUF."""

import numpy as np
import pytest

from engine.forward.gguf_table import GGUFTableError, read_table


def write(path, alignment=None):
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    w = GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(3000)] + ["ü", ""])
    w.add_array("tokenizer.ggml.scores", [float(i) for i in range(50)])
    w.add_array("nested.lists", [[1, 2], [3]])
    w.add_uint64("a.u64", 7)
    w.add_int8("a.i8", -3)
    w.add_bool("a.bool", True)
    w.add_float64("a.f64", 0.5)
    w.add_string("a.text", "héllo")
    rng = np.random.default_rng(0)
    w.add_tensor("f32.weight", rng.standard_normal((3, 8)).astype(np.float32))
    q = rng.standard_normal((4, 64)).astype(np.float32)
    blocks = quantize(q, GGMLQuantizationType.Q8_0)  # [4, 2 * 34] bytes
    w.add_tensor("q8.weight", blocks, raw_shape=blocks.shape, raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("f16.bias", rng.standard_normal(5).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("alignment", [None, 64])
def test_the_table_is_gguf_pys(tmp_path, alignment):
    from gguf import GGUFReader

    path = tmp_path / "t.gguf"
    write(path, alignment)
    ours, theirs = read_table(path), GGUFReader(str(path)).tensors
    assert [t.name for t in ours] == [t.name for t in theirs] == ["f32.weight", "q8.weight", "f16.bias"]
    for a, b in zip(ours, theirs):
        assert a.shape == tuple(int(x) for x in b.shape) and a.tensor_type == int(b.tensor_type)
        assert np.array_equal(a.data, np.asarray(b.data).view(np.uint8).reshape(-1)), a.name


def test_what_is_not_a_gguf_is_refused(tmp_path):
    path = tmp_path / "t.gguf"
    write(path)
    whole = path.read_bytes()
    for name, data, why in (("text.gguf", b"not a model at all", "not a GGUF"),
                            ("v1.gguf", b"GGUF" + (1).to_bytes(4, "little") + bytes(16), "version 1"),
                            ("cut.gguf", whole[:200], "ends inside its header"),
                            ("short.gguf", whole[:-200], "past the end")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(GGUFTableError, match=why):
            read_table(tmp_path / name)
