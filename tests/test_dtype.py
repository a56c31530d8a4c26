"""The weights' dtype that "auto" picks: the engine's whole forward timed in both dtypes (engine/load/dtype.py)."""

from __future__ import annotations

import pytest

from engine.load import dtype as dtype_mod


def _llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       tie_word_embeddings=True)


@pytest.fixture
def native_bf16(monkeypatch):
    # the choice is timed on any CPU that claims native bfloat16; emulated bfloat16 times as well as native,
    # but oneDNN packs bfloat16 linears only with AVX-512 BW/VL/DQ or AVX-NE-CONVERT
    from engine.forward.kernels.build import cpu_flags

    flags = cpu_flags()
    if not ({"avx512bw", "avx512vl", "avx512dq"} <= flags or "avx_ne_convert" in flags):
        pytest.skip("oneDNN cannot pack bfloat16 linears on this CPU (no avx512bw/vl/dq, no avx_ne_convert)")
    monkeypatch.setattr(dtype_mod, "native_bf16_flag", lambda: "avx512_bf16")


def test_auto_times_the_engines_whole_forward_and_keeps_the_faster(native_bf16):
    choice = dtype_mod.choose_dtype("auto", _llama_config(), "cpu")
    ms = choice.layer_ms
    assert set(ms) == {"float32", "bfloat16"} and all(t > 0 for t in ms.values())
    assert "a forward" in choice.reason
    faster = "bfloat16" if ms["bfloat16"] < dtype_mod.MARGIN * ms["float32"] else "float32"
    assert choice.dtype == faster


def test_the_timed_forward_runs_the_engines_forward_on_the_configs_shapes():
    t = dtype_mod.time_forward(_llama_config(), "float32", reps=1)
    assert 0 < t < 10_000


def test_a_config_no_causal_lm_is_built_from_falls_back_on_one_layers_linears(native_bf16):
    from transformers import T5Config

    cfg = T5Config(d_model=64, num_heads=4, d_kv=16, d_ff=128, num_layers=1, vocab_size=128)
    choice = dtype_mod.choose_dtype("auto", cfg, "cpu")
    assert "a layer's linears" in choice.reason and set(choice.layer_ms) == {"float32", "bfloat16"}


def test_an_explicit_dtype_is_taken_as_asked_and_a_wrong_one_refused():
    assert dtype_mod.choose_dtype("float32", _llama_config(), "cpu").dtype == "float32"
    with pytest.raises(ValueError, match="dtype must be one of"):
        dtype_mod.choose_dtype("float16", _llama_config(), "cpu")


def test_a_model_too_large_to_build_twice_has_one_layers_linears_timed(native_bf16, monkeypatch):
    cfg = _llama_config()
    assert 0 < dtype_mod.float32_bytes(cfg) < 4 * 600_000  # 3 layers of 147k weights, one tied table of 66k
    monkeypatch.setattr(dtype_mod, "WHOLE_FORWARD_MAX_BYTES", dtype_mod.float32_bytes(cfg) - 1)
    choice = dtype_mod.choose_dtype("auto", cfg, "cpu")
    assert "a layer's linears" in choice.reason


@pytest.mark.parametrize("bf16_ms, kept", [(0.90, "bfloat16"), (0.96, "float32"), (1.30, "float32")])
def test_auto_keeps_bfloat16_only_when_its_forward_is_faster_by_the_margin(monkeypatch, bf16_ms, kept):
    # the decision alone, on any CPU: the timings are given, float32's is 1 ms
    monkeypatch.setattr(dtype_mod, "native_bf16_flag", lambda: "avx512_bf16")
    monkeypatch.setattr(dtype_mod, "time_forward", lambda cfg, dt: bf16_ms if dt == "bfloat16" else 1.0)
    choice = dtype_mod.choose_dtype("auto", _llama_config(), "cpu")
    assert choice.dtype == kept and choice.layer_ms == {"float32": 1.0, "bfloat16": bf16_ms}
    assert "a forward" in choice.reason


def test_auto_without_native_bfloat16_takes_float32_untimed(monkeypatch):
    monkeypatch.setattr(dtype_mod, "native_bf16_flag", lambda: None)
    monkeypatch.setattr(dtype_mod, "time_forward", lambda cfg, dt: pytest.fail("timed without native bfloat16"))
    choice = dtype_mod.choose_dtype("auto", _llama_config(), "cpu")
    assert choice.dtype == "float32" and "no native bfloat16" in choice.reason and not choice.layer_ms
