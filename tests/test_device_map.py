"""A model spread by accelerate's device map: every source loads through it, each layer's cells sit on that
layer's device, and decoding is what it is without a map. One CPU allows only maps onto the CPU, and a second
"device" for the cells alone (`meta`, which computes shapes): enough to see every per-layer tensor go where its
layer is."""

import pytest
import torch

from devicecheck import strict_devices
from engine.batch import Batch
from engine.draft.registry import NGRAM_CHAIN
from engine.load.models import _dispatch, load_model
from engine.memory.cells import CellCache
from engine.memory.context import layer_devices
from engine.params import GenParams, SpecParams
from engine.serve.engine import Engine
from tiny import make_llama

PROMPT = [1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
CPU_MAP = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu", "model.norm": "cpu",
           "model.rotary_emb": "cpu", "lm_head": "cpu"}


def load_model_like(model):
    from engine.load.models import LoadedModel
    from tiny import make_tokenizer, WORDS

    return LoadedModel(model=model, tokenizer=make_tokenizer(WORDS), name="mapped", quant_bits=32,
                       n_params=sum(p.numel() for p in model.parameters()), device="cpu")


def tokens(engine, types) -> list[int]:
    p = GenParams(max_new_tokens=24, ignore_eos=True, spec=SpecParams(types=list(types), n_max=4, adaptive=False))
    return [t for e in engine.generate(PROMPT, p) for t in e.emitted]


def test_a_directory_loads_through_a_device_map_and_decodes_as_without(tiny_dirs):
    mapped = load_model(str(tiny_dirs["target"]), device="cpu", device_map=CPU_MAP)
    plain = load_model(str(tiny_dirs["target"]), device="cpu", prepack=False)
    # a map onto one device is a plain load for transformers (no hf_device_map): what it decodes is checked here,
    # the cells per layer by the dispatched model below
    engine = Engine(mapped, n_ctx=256, n_seq_max=1, calibrate=False)
    assert all(k.device.type == "cpu" for k in engine.ctx.cache.k)
    reference = tokens(Engine(plain, n_ctx=256, n_seq_max=1, calibrate=False), [])
    assert tokens(engine, []) == reference
    assert tokens(engine, NGRAM_CHAIN) == reference


def test_a_model_built_on_the_cpu_is_dispatched_by_the_map():
    model = make_llama(0)
    _dispatch(model, CPU_MAP)  # the GGUF path: the model is built first, then spread
    assert model.hf_device_map == CPU_MAP
    assert layer_devices(model, 2) == [torch.device("cpu")] * 2
    engine = Engine(load_model_like(model), n_ctx=256, n_seq_max=1, calibrate=False)
    assert engine.ctx.cache.layer_devices == [torch.device("cpu")] * 2
    reference = Engine(load_model_like(make_llama(0)), n_ctx=256, n_seq_max=1, calibrate=False)
    assert tokens(engine, NGRAM_CHAIN) == tokens(reference, [])
    assert layer_devices(make_llama(1), 2) is None  # no map: every layer where the first parameter is


def test_each_layer_writes_and_moves_its_cells_on_its_own_device():
    cache = CellCache(n_layers=2, n_kv_heads=2, head_dim=4, n_cells=16, n_seq_max=2, layer_devices=["cpu", "meta"],
                      by_seq=True)
    assert [k.device.type for k in cache.k] == ["cpu", "meta"]
    with strict_devices():
        first = Batch()
        for i, tok in enumerate([5, 6, 7]):
            first.add(tok, i, 0, False)
        cache.claim(first)
        batch = Batch()  # two sequences at once: cells that are not one run, written by index on each device
        for seq, pos in ((0, 3), (1, 0), (0, 4), (1, 1)):
            batch.add(9, pos, seq, False)
        cache.claim(batch)
        assert not isinstance(cache._write, slice)
        for layer, device in enumerate(("cpu", "meta")):
            k = torch.ones(1, 2, 4, 4, device=device)
            out_k, _ = cache.update(k, k, layer)
            assert out_k.device.type == device
        cache.settle(cache.last_cells.tolist())


def test_a_map_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="layer_devices"):
        CellCache(n_layers=2, n_kv_heads=2, head_dim=4, n_cells=16, n_seq_max=1, layer_devices=["cpu"])
