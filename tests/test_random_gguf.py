"""Random-weight GGUFs in real models' shapes (engine/load/random_gguf.py, engine/load/kquants.py): the K-quant blocks
read back through gguf-py as written, llama.cpp's type mix, and a tiny file of each type loading through the engine's
GGUF path and decoding."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from engine.load import random_gguf as rg
from engine.load.kquants import quantize_q4_k, quantize_q6_k
from engine.params import GenParams
from engine.serve.engine import Engine

TINY = rg.Shape("llama", 256, 2, 4, 2, 512, 10000.0, tied=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The cache (converted copies, mapped tables) in a folder of this module's own."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECPLAY_CACHE", str(root))
        yield root


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_k_quant_blocks_read_back_through_gguf_py_within_their_step(kind):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(1)
    rows = rng.normal(0, 0.02, (5, 768)).astype(np.float32)
    rows[0, :256] = 0.0  # an all-zero block: scales 0, weights 0
    raw = quantize_q4_k(rows) if kind == "Q4_K" else quantize_q6_k(rows)
    back = dequantize(raw, GGMLQuantizationType[kind]).reshape(rows.shape)
    assert np.all(back[0, :256] == 0.0)
    sub = 32 if kind == "Q4_K" else 16
    spread = np.ptp(rows.reshape(-1, sub), axis=1) if kind == "Q4_K" else np.abs(rows.reshape(-1, sub)).max(1) * 2
    levels = 15 if kind == "Q4_K" else 63
    # half a level, plus the six-bit / int8 rounding of each sub-block's scale against the block's
    err = np.abs(back - rows).reshape(-1, sub).max(1)
    assert np.all(err <= spread / levels * (0.5 + 0.6) + 1e-6), err.max()
    assert np.corrcoef(rows.ravel(), back.ravel())[0, 1] > (0.99 if kind == "Q4_K" else 0.999)


def test_the_mix_is_llama_cpps():
    # Llama-3.1-8B: 32 layers; more bits in 0..3, 28..31 and every third from 4 (6, 9, ...)
    more = [i for i in range(32) if rg.use_more_bits(i, 32)]
    assert more[:6] == [0, 1, 2, 3, 6, 9] and more[-4:] == [28, 29, 30, 31]
    assert rg.tensor_type("blk.6.attn_v.weight", "Q4_K_M", 6, 32, 4096) == "Q6_K"
    assert rg.tensor_type("blk.5.ffn_down.weight", "Q4_K_M", 5, 32, 14336) == "Q4_K"
    assert rg.tensor_type("blk.5.attn_q.weight", "Q4_K_M", 5, 32, 4096) == "Q4_K"
    assert rg.tensor_type("output.weight", "Q4_K_M", -1, 32, 4096) == "Q6_K"
    assert rg.tensor_type("output.weight", "Q4_0", -1, 32, 4096) == "Q6_K"
    assert rg.tensor_type("token_embd.weight", "Q4_0", -1, 32, 4096) == "Q4_0"
    assert rg.tensor_type("output.weight", "Q8_0", -1, 32, 4096) == "Q8_0"
    assert rg.tensor_type("blk.0.attn_q.weight", "Q4_K_M", 5, 32, 576) == "Q5_0"  # 576 is no multiple of 256
    assert rg.tensor_type("blk.0.attn_v.weight", "Q4_K_M", 0, 32, 576) == "Q8_0"


def test_the_real_shapes_count_their_parameters():
    def params(model):
        return sum(int(np.prod(s)) for _, s, _ in rg.tensors(rg.SHAPES[model]))

    vocab = 49152  # the embedded model's, in place of each model's own
    # Llama-3.2-1B has 1.236e9 with its 128,256-token table; Llama-3.1-8B 8.03e9 with two
    assert params("llama-3.2-1b") == 1_235_814_400 - (128256 - vocab) * 2048
    assert params("llama-3.1-8b") == 8_030_261_248 - 2 * (128256 - vocab) * 4096
    assert params("qwen2.5-3b") == 3_085_938_688 - (151936 - vocab) * 2048


def test_a_file_is_cached_by_model_type_layers_and_seed(tmp_path):
    a = rg.random_gguf_path("llama-3.2-1b", "Q4_0", seed=0, root=tmp_path)
    assert a != rg.random_gguf_path("llama-3.2-1b", "Q4_0", seed=1, root=tmp_path)
    assert a != rg.random_gguf_path("llama-3.2-1b", "Q8_0", seed=0, root=tmp_path)
    assert a != rg.random_gguf_path("llama-3.2-1b", "Q4_0", seed=0, layers=2, root=tmp_path)
    assert a.name.endswith(".Q4_0.gguf") and a.parent == tmp_path / "random-gguf"
    with pytest.raises(ValueError):
        rg.random_gguf("llama-3.2-1b", "Q2_K", root=tmp_path)


@pytest.mark.parametrize("ftype", rg.TYPES)
def test_a_tiny_file_loads_through_the_gguf_path_and_decodes(ftype, cache):
    from gguf import GGUFReader

    from engine.forward.prepack import linear_paths
    from engine.load.models import load_model

    path = cache / f"tiny.{ftype}.gguf"
    rg.write(path, TINY, ftype, seed=3)
    written = {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}
    assert written == {n: rg._ggml_type(n, s, ftype, TINY) for n, s, _ in rg.tensors(TINY)}
    assert written["token_embd.weight"] == {"Q8_0": "Q8_0", "Q4_0": "Q6_K", "Q4_K_M": "Q6_K"}[ftype]

    loaded = load_model(str(path), dtype="float32")
    # the 14 layer linears read as stored where their blocks are Q8_0, Q4_0 or Q4_K (those two on the Q4_1
    # kernel); Q6_K blocks (the head, layer 1's attn_v and ffn_down in Q4_K_M) as float32 copies
    paths = linear_paths(loaded.model)
    assert paths == {"Q8_0": "our q8_0 kernel 15", "Q4_0": "our float32 kernel 1, our q4_1 kernel 14",
                     "Q4_K_M": "our float32 kernel 3, our q4_1 kernel 12"}[ftype], paths
    config = loaded.model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (256, 2, 2)
    assert config.vocab_size == 49152 and loaded.encode("hello world")
    engine = Engine(loaded, n_ctx=64, n_seq_max=1, calibrate=False)
    out = [t for ev in engine.generate(loaded.encode("The sea is"), GenParams(max_new_tokens=4, ignore_eos=True))
           for t in ev.emitted]
    assert len(out) == 4 and all(0 <= t < 49152 for t in out)


def test_q4_0_and_q5_0_blocks_stay_quantised_on_the_integer_path(cache):
    from engine.forward.prepack import linear_paths
    from engine.forward.quant_dot import dot_reason
    from engine.load.models import load_model

    if dot_reason():
        pytest.skip(f"no integer kernel here: {dot_reason()}")
    q4_0 = cache / "tiny-int8.Q4_0.gguf"
    rg.write(q4_0, TINY, "Q4_0", seed=4)
    # 320 wide: Q4_K_M's rows of 320 fall back to Q5_0 (and Q6_K's to Q8_0), its 512-wide ffn_down stays Q4_K
    # (read as Q4_1 groups) / Q6_K; the Q4_0 file's head (the tied embedding) is Q6_K
    q5_0 = cache / "tiny-320.Q4_K_M.gguf"
    rg.write(q5_0, replace(TINY, hidden=320), "Q4_K_M", seed=5)
    for path, expected in ((q4_0, "our q4_0_dot kernel 14, our q6_k_dot kernel 1"),
                           (q5_0, "our q4_1_dot kernel 1, our q5_0_dot kernel 11, our q6_k_dot kernel 1, "
                                  "our q8_0_dot kernel 2")):
        loaded = load_model(str(path), dtype="int8")
        assert loaded.dtype == "int8" and linear_paths(loaded.model) == expected, linear_paths(loaded.model)
        if path == q4_0:  # the Q6_K head's logits against the dequantised blocks': the inputs' 8-bit rounding apart
            from engine.forward.quant import read_gguf

            ids = torch.tensor([loaded.encode("The sea is calm and the sky is clear")])
            with torch.inference_mode():
                hidden = loaded.model.model(ids).last_hidden_state[0]
                ours = loaded.model.lm_head(hidden).double()
            ref = hidden.double() @ torch.from_numpy(read_gguf(path)["token_embd.weight"].dequantize()).double().T
            error = float((ours - ref).abs().max() / ref.abs().max())
            assert 1e-6 < error < 0.02, error
        engine = Engine(loaded, n_ctx=64, n_seq_max=1, calibrate=False)
        # the lean forward's C layers (lean_layers.c, a kind per block type) against transformers' forward
        assert engine.load_check.passed is True, engine.load_check.detail
        params = GenParams(max_new_tokens=4, ignore_eos=True)
        out = [t for ev in engine.generate(loaded.encode("The sea is"), params) for t in ev.emitted]
        assert len(out) == 4
