"""A Llama-family GGUF built straight from its blocks (engine/load/gguf_direct.py) is the model transformers' float32
copy gives, packed as before: the same parameters, every linear the same outputs bit for bit, the same tokens, and
no float32 copy written to the cache."""

import numpy as np
import pytest
import torch

from engine.load import models
from engine.load import random_gguf as rg
from engine.params import GenParams
from engine.serve.engine import Engine

LLAMA = rg.Shape("llama", 256, 2, 4, 2, 512, 10000.0, tied=True)
QWEN2 = rg.Shape("qwen2", 256, 2, 4, 2, 512, 1000000.0, tied=False, rms_eps=1e-6)  # q/k/v biases, its own head
QWEN3 = rg.Shape("qwen3", 256, 2, 2, 1, 512, 1000000.0, tied=True, rms_eps=1e-6)  # q/k norms; head_dim 128 as
# transformers' Qwen3Config assumes (its GGUF mapping reads no key length)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPLAY_CACHE", str(tmp_path))
    return tmp_path


def _reference(path, dtype, monkeypatch):
    """The same file through transformers' float32 copy, then packed from its blocks (engine/forward/quant.py)."""
    with monkeypatch.context() as mp:
        mp.setattr(models, "direct_reason", lambda *args: "the reference path")
        return models.load_model(str(path), dtype=dtype)


def _packed(model) -> dict:
    return {name: m for name, m in model.named_modules() if hasattr(m, "_packed_weight")}


def test_a_gguf_built_from_its_blocks_is_the_model_transformers_gives(cache, monkeypatch):
    """A Llama Q4_0 file (permuted q and k, a tied Q6_K head) both ways, on the integer path where this CPU has
    it; then a second load reuses the mapped table and the tokenizer."""
    from engine.forward.prepack import linear_paths
    from engine.forward.quant_dot import dot_reason

    dtype = "float32" if dot_reason() else "int8"
    path = cache / "tiny-llama.Q4_0.gguf"
    rg.write(path, LLAMA, "Q4_0", seed=7)
    direct = models.load_model(str(path), dtype=dtype)
    assert not list(cache.glob("*-f32/model.safetensors"))  # no float32 copy of the model on disk
    table = next((cache / "mapped").glob("*token_embd*.bin"))
    ref = _reference(path, dtype, monkeypatch)
    assert list(cache.glob("*-f32/model.safetensors"))  # the reference did write its copy

    assert direct.dtype == ref.dtype == dtype and direct.n_params == ref.n_params
    assert linear_paths(direct.model) == linear_paths(ref.model)
    ref_params = dict(ref.model.named_parameters())
    for name, p in direct.model.named_parameters():
        assert torch.equal(p, ref_params[name]), name  # the norms and the embedding table
    ours, theirs = _packed(direct.model), _packed(ref.model)
    assert ours.keys() == theirs.keys() and len(ours) == 1 + 7 * LLAMA.layers
    with torch.inference_mode():
        for name, module in ours.items():
            x = torch.randn(3, module.in_features, generator=torch.Generator().manual_seed(0))
            assert torch.equal(module(x), theirs[name](x)), name
    assert _tokens(direct) == _tokens(ref)

    again = models.load_model(str(path), dtype=dtype)  # the table and the tokenizer read back, not rewritten
    assert list((cache / "mapped").glob("*token_embd*.bin")) == [table]
    assert hasattr(again.model.get_input_embeddings().weight, "_mapped_array")
    assert torch.equal(again.model.get_input_embeddings().weight, direct.model.get_input_embeddings().weight)
    assert again.encode("hello world") == direct.encode("hello world") and _tokens(again) == _tokens(direct)


@pytest.mark.parametrize("shape, ftype, kind, n_blocks", [(QWEN2, "Q8_0", "q8_0", 1 + 7 * QWEN2.layers),
                                                          (QWEN3, "Q4_0", "q4_1", 7 * QWEN3.layers)],
                         ids=["qwen2-q80", "qwen3-q40"])
def test_a_qwen_file_keeps_its_rows_biases_norms_and_head(shape, ftype, kind, n_blocks, cache):
    """Qwen's converters do not permute q and k. Qwen2: q, k, v biases (added to the blocks' sums) and an untied Q8_0
    head; Qwen3: q and k norms per head, a tied Q6_K head (float32 here). Every tensor as transformers names and
    reads it (no reference load: its name map and gguf-py's values, tensor by tensor)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    from engine.forward.gguf_table import read_table
    from engine.load.gguf_direct import hf_names

    path = cache / f"tiny-{shape.arch}.{ftype}.gguf"
    rg.write(path, shape, ftype, seed=9)
    loaded = models.load_model(str(path), dtype="float32")
    model, config = loaded.model, loaded.model.config
    theirs = get_gguf_hf_weights_map(_skeleton(config), TensorProcessor())
    ours = hf_names(config.num_hidden_layers, config.model_type)
    params = dict(model.named_parameters())
    n_packed = 0
    for t in read_table(path):
        assert theirs[t.name] == ours[t.name], t.name
        ref = torch.from_numpy(dequantize(np.asarray(t.data), GGMLQuantizationType(t.tensor_type)).copy())
        module = model.get_submodule(ours[t.name].rsplit(".", 1)[0])
        if ours[t.name] in params:
            assert torch.equal(params[ours[t.name]], ref.reshape(params[ours[t.name]].shape)), t.name
            continue
        x = torch.randn(3, module.in_features, generator=torch.Generator().manual_seed(0))
        expected = x @ ref.reshape(module.out_features, -1).T + (0 if module.bias is None else module.bias)
        with torch.inference_mode():  # the kernels' sums, not torch's order
            assert torch.allclose(module(x), expected, rtol=1e-4, atol=1e-5), t.name
        n_packed += getattr(module._packed_weight, "kind", "") == kind
    assert n_packed == n_blocks
    biased = [model.get_submodule(f"model.layers.0.self_attn.{n}_proj").bias is not None for n in "qkv"]
    assert biased == [shape.arch == "qwen2"] * 3
    engine = Engine(loaded, n_ctx=64, n_seq_max=1, calibrate=False)
    assert engine.load_check.passed is True, engine.load_check.detail
    assert len(_tokens(loaded)) == 8

    from engine.load.gguf_direct import load_direct

    (cache / "a-file").write_text("")  # a table folder that cannot be made: the table is kept in memory
    kept = load_direct(path, config, dot=False, table_folder=cache / "a-file" / "mapped")
    table = kept.get_input_embeddings().weight
    assert not hasattr(table, "_mapped_array") and torch.equal(table, model.get_input_embeddings().weight)


def _skeleton(config):
    """The model of `config` with every parameter (ours has dropped its packed linears' weights), on no device."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _tokens(loaded) -> list[int]:
    engine = Engine(loaded, n_ctx=64, n_seq_max=1, calibrate=False)
    params = GenParams(max_new_tokens=8, ignore_eos=True)
    return [t for ev in engine.generate(loaded.encode("The sea is"), params) for t in ev.emitted]


def test_other_families_and_dtypes_keep_transformers_path(tiny_dirs):
    from transformers import AutoConfig

    from engine.load.gguf_direct import direct_reason

    config = AutoConfig.from_pretrained(tiny_dirs["target"])
    assert direct_reason(config, "bfloat16", "cpu", True) == "a bfloat16 model is built from transformers' float32 copy"
    assert "CPU" in direct_reason(config, "float32", "cpu", False)
    assert direct_reason(config, "float32", "cpu", True) is None
    config.model_type = "phi3"
    assert "Llama family" in direct_reason(config, "float32", "cpu", True)


def test_gemma3_is_read_as_transformers_reads_it(tmp_path):
    """Gemma 3 270M built from its file: our names are transformers' (its gguf-py name map) and each tensor's
    values those its Gemma2TensorProcessor gives (norms stored as 1 + w), for the first and last layers, the
    final norm and the whole embedding table; a linear packed from its blocks gives the bits our float32 kernel
    gives on those values."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    from engine.forward import gemm
    from engine.forward.gemm import SmallGemm
    from engine.forward.gguf_table import read_table
    from engine.load.gguf import gguf_config
    from engine.load.gguf_direct import hf_names, load_direct
    from engine.load.packaged import packaged_gguf

    path = packaged_gguf("gemma3-270m")
    config = gguf_config(path)
    model = load_direct(path, config, dot=False, table_folder=tmp_path)
    ours = hf_names(config.num_hidden_layers, config.model_type)
    theirs = get_gguf_hf_weights_map(_skeleton(config), TensorProcessor())
    tensors = read_table(path)
    assert model is not None and all(theirs[t.name] == ours[t.name] for t in tensors)
    processor = TENSOR_PROCESSORS["gemma3"](config=config.to_dict())
    params = dict(model.named_parameters())
    kernels = gemm.load((torch.float32,))
    last = config.num_hidden_layers - 1
    checked = [t for t in tensors if t.name.startswith(("blk.0.", f"blk.{last}.", "output_norm", "token_embd"))]
    n_packed = 0
    for t in checked:
        raw = dequantize(np.asarray(t.data), GGMLQuantizationType(t.tensor_type))
        hf = ours[t.name]
        module = model.get_submodule(hf.rsplit(".", 1)[0])
        if hasattr(module, "_packed_weight") and hf != "model.embed_tokens.weight":
            ref = processor.process(weights=raw, name=t.name).weights.reshape(module.out_features, -1)
            x = torch.randn(3, module.in_features, generator=torch.Generator().manual_seed(1))
            with torch.inference_mode():
                assert torch.equal(module(x), SmallGemm.pack(kernels, torch.from_numpy(ref))(x)), t.name
            n_packed += 1
            continue
        ref = processor.process(weights=raw, name=t.name).weights.reshape(params[hf].shape)
        assert np.array_equal(params[hf].detach().numpy(), ref), t.name
    assert len(checked) == 2 * 13 + 2 and n_packed >= 2 * 5  # q, k, v, o, gate, up, down less the Q6_K ones
    head = model.get_output_embeddings()._packed_weight
    assert head.kind == "q8_0" and head.weight.numel() * head.weight.element_size() < 1.2 * config.vocab_size * config.hidden_size
