"""The tied embedding table read through a file mapping (engine/forward/mapped.py): same bits, same logits, the tie kept,
and the table kept in memory where no file can be written."""

import torch
from tiny import save_tiny, suite_dtype

from engine.batch import Batch
from engine.memory.context import ModelContext
from engine.forward.mapped import drop_resident
from engine.load.models import load_model


def _logits(loaded, tokens):
    ctx = ModelContext(loaded.model, n_ctx=64)
    b = Batch()
    for i, t in enumerate(tokens):
        b.add(t, i, 0, True)
    return ctx.decode(b).logits


def test_tied_table_is_mapped_with_the_same_bits_and_logits(tmp_path, monkeypatch):
    path = save_tiny(tmp_path / "tied", seed=5, tie_word_embeddings=True)
    stock = load_model(str(path), device="cpu", dtype=suite_dtype(), prepack=False)
    monkeypatch.setenv("SPECPLAY_CACHE", str(tmp_path / "cache"))
    loaded = load_model(str(path), device="cpu", dtype=suite_dtype())
    emb = loaded.model.get_input_embeddings().weight
    assert getattr(emb, "_mapped_array", None) is not None, "the tied table should be file-mapped"
    assert loaded.model.get_output_embeddings().weight is emb  # the tie is kept
    assert torch.equal(emb, stock.model.get_input_embeddings().weight)
    assert len(list((tmp_path / "cache" / "mapped").glob("*.bin"))) == 1

    tokens = [1, 7, 9, 12, 7, 9, 30]
    unmapped = (tmp_path / "ro")
    unmapped.write_text("a file where a folder should be: nothing can be written under it")
    monkeypatch.setenv("SPECPLAY_CACHE", str(unmapped))
    in_memory = load_model(str(path), device="cpu", dtype=suite_dtype())
    assert getattr(in_memory.model.get_input_embeddings().weight, "_mapped_array", None) is None
    assert torch.equal(_logits(loaded, tokens), _logits(in_memory, tokens))

    drop_resident(emb)  # pages go; values come back from the file
    assert torch.equal(emb, stock.model.get_input_embeddings().weight)


def test_untied_model_keeps_its_embedding_in_memory(tmp_path, monkeypatch, tiny_dirs):
    monkeypatch.setenv("SPECPLAY_CACHE", str(tmp_path / "cache"))
    loaded = load_model(str(tiny_dirs["target"]), device="cpu", dtype=suite_dtype())
    assert getattr(loaded.model.get_input_embeddings().weight, "_mapped_array", None) is None
    assert not (tmp_path / "cache" / "mapped").exists()
