"""The embedded model at 8 bits (engine/load/requant.py): the same weights as Q8_0, loaded through the Q8_0 path."""

import numpy as np
import pytest

from engine.draft.registry import NGRAM_CHAIN
from engine.params import GenParams, SpecParams
from engine.serve.engine import Engine
from tiny import suite_dtype

N_NEW = 32


@pytest.fixture(scope="module")
def paths():
    from engine.load.gguf import cache_dir, embedded_gguf_path
    from engine.load.requant import requantised

    src = embedded_gguf_path()
    return src, requantised(src, cache_dir())


@pytest.fixture(scope="module")
def q8(paths):
    from engine.load.models import load_model

    return load_model("embedded-q8", dtype=suite_dtype())


def test_every_q4_1_matrix_becomes_q8_0_and_the_rest_is_copied(paths):
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFReader

    src, dst = (GGUFReader(str(p)) for p in paths)
    assert [t.name for t in src.tensors] == [t.name for t in dst.tensors]
    n_q4 = 0
    for a, b in zip(src.tensors, dst.tensors):
        assert list(a.shape) == list(b.shape), a.name
        if a.tensor_type == T.Q4_1:
            assert b.tensor_type == T.Q8_0, a.name
            n_q4 += 1
        else:  # the Q8_0 embedding and the float32 norms, byte for byte
            assert b.tensor_type == a.tensor_type and np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name
    assert n_q4 == 210
    assert dst.fields["general.file_type"].contents() == 7  # LLAMA_FTYPE_MOSTLY_Q8_0
    for key in ("tokenizer.chat_template", "llama.context_length", "tokenizer.ggml.eos_token_id"):
        assert dst.fields[key].contents() == src.fields[key].contents(), key


def test_the_8_bit_weights_are_the_4_bit_ones_within_q8_0_rounding(paths):
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFReader
    from gguf.quants import dequantize

    src, dst = (GGUFReader(str(p)) for p in paths)
    worst = 0.0
    for a, b in zip(src.tensors, dst.tensors):
        if a.tensor_type != T.Q4_1:
            continue
        w4 = dequantize(np.asarray(a.data), T.Q4_1).reshape(-1, 32)
        w8 = dequantize(np.asarray(b.data), T.Q8_0).reshape(-1, 32)
        # Q8_0's step is max |w| / 127 per block, its scale a float16: half a step plus the scale's rounding
        step = np.abs(w4).max(axis=1, keepdims=True) / 127
        err = np.abs(w8 - w4)
        assert np.all(err <= step * (0.5 + 127 * 2.0 ** -11) + 1e-7), a.name
        worst = max(worst, float((err / np.maximum(step, 1e-30)).max()))
    assert 0.0 < worst  # requantised, not copied


def test_the_8_bit_model_loads_through_its_q8_0_blocks(q8):
    from engine.forward.prepack import linear_paths

    assert q8.quant_bits == 8 and q8.name == "embedded-q8"
    if suite_dtype() == "float32":  # every layer linear and the LM head read from Q8_0 blocks, none from Q4_1
        paths = linear_paths(q8.model)
        assert "q8_0" in paths and "q4_1" not in paths, paths


def test_speculation_on_the_8_bit_model_is_token_identical_to_its_plain_decoding(q8):
    engine = Engine(q8, n_ctx=512, n_seq_max=1)
    ids = q8.encode_chat([{"role": "user", "content": "Repeat exactly: the red fox jumps over the lazy dog, "
                                                      "the red fox jumps over the lazy dog, the red fox"}])
    plain = [t for ev in engine.generate(ids, GenParams(max_new_tokens=N_NEW)) for t in ev.emitted]
    events = list(engine.generate(ids, GenParams(max_new_tokens=N_NEW,
                                                 spec=SpecParams(types=NGRAM_CHAIN, adaptive=False))))
    assert [t for ev in events for t in ev.emitted] == plain and len(plain) > 8
    assert sum(ev.kind == "spec" for ev in events) > 0, "the n-gram chain never drafted"
