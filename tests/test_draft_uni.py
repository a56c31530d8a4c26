"""draft-uni: a draft model of another vocabulary drafting through text. Two tiny models, each with its own byte-level
BPE trained here on one paragraph (other vocabulary sizes, other merges, other special ids), both trained briefly on
that paragraph so the draft's guesses are often right: greedy and same-seed sampling stay token-identical to plain
decoding, with chains and trees; the text is re-encoded a tail at a time; the drafted text becomes only whole target
tokens that extend the confirmed ones."""

import json

import pytest
import torch

from engine.draft.base import Drafter, DraftRequest
from engine.draft.chain import DrafterChain
from engine.draft.text_bridge import BridgeState, TextBridge, decode, encode
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from fresh import forgetting
from test_engine import tokens
from tiny import load_tiny, make_llama

TEXT = ("The small river runs past the old mill, where the miller's daughter counts the sacks of grain before the "
        "market opens. Café owners along the square set out chairs, naïve tourists ask for directions, and the baker "
        "sells warm bread to everyone who passes by the fountain. ")
TARGET_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
DRAFT_SPECIALS = ["<s>", "</s>", "<unk>", "<pad>"]  # other ids for the same specials, as between real families


def make_bpe(vocab_size: int, specials: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT * 4], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


def train_on_text(tok, seed: int, steps: int = 150):
    """A tiny Llama that has seen the paragraph: its greedy text continues it, mostly."""
    model = make_llama(seed, vocab_size=len(tok))
    with torch.no_grad():
        model.lm_head.weight.div_(8.0)  # make_llama sharpens an untrained head; training does that here
    ids = torch.tensor([tok.bos_token_id] + encode(tok, TEXT * 12))
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - 65, (8,), generator=g)
        x = torch.stack([ids[s:s + 64] for s in starts])
        opt.zero_grad()
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target, draft) loaded through the real loader; training on one thread is several times faster here than on
    threads that share two cores."""
    root = tmp_path_factory.mktemp("uni")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, vocab, specials, seed in [("target", 480, TARGET_SPECIALS, 0), ("draft", 300, DRAFT_SPECIALS, 1)]:
            tok = make_bpe(vocab, specials)
            train_on_text(tok, seed).save_pretrained(root / name)
            tok.save_pretrained(root / name)
    finally:
        torch.set_num_threads(threads)
    return load_tiny(root / "target"), load_tiny(root / "draft"), root


@pytest.fixture(scope="module")
def engine(pair):
    target, draft, _ = pair
    return Engine(target, draft=draft, n_ctx=1024, n_seq_max=2, calibrate=False)


fresh_engines = forgetting("engine")


def prompts(target) -> list[list[int]]:
    """8 prompts: 10 tokens of the paragraph from 8 places, after the BOS."""
    ids = target.encode(TEXT * 2)
    return [ids[:1] + ids[1 + off:11 + off] for off in range(0, 64, 8)]


def run(engine, prompt, types, temp=0.0, seed=0, tree_nodes=0, n=40):
    params = GenParams(max_new_tokens=n, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                       spec=SpecParams(types=list(types), n_max=8, adaptive=False, p_min=0.0, tree_nodes=tree_nodes))
    return list(engine.generate(prompt, params))


def test_a_draft_model_of_another_vocabulary_drafts_through_text(engine):
    assert engine.draft_mismatch and engine.draft_type == "draft-uni"
    with pytest.raises(ValueError, match="use draft-uni"):
        engine.start([1, 5, 6], GenParams(spec=SpecParams(types=["draft-simple"])))


@pytest.mark.parametrize("tree_nodes", [0, 12], ids=["chain", "tree"])
def test_greedy_is_plain_decoding_and_drafts_are_accepted(engine, pair, tree_nodes, capsys):
    target = pair[0]
    n_rounds = n_emitted = 0
    for prompt in prompts(target):
        plain = tokens(run(engine, prompt, []))
        events = run(engine, prompt, ["draft-uni"], tree_nodes=tree_nodes)
        assert tokens(events) == plain
        assert not tree_nodes or any(e.verify_mode == "tree" for e in events)
        n_rounds += len(events) - 1  # the prefill's token came from its own forward
        n_emitted += len(plain) - 1
    stats = engine.chain.stats["draft-uni"]
    spec = stats.acc_rate_pos()
    assert stats.n_acc_tokens > 0, "no draft token was ever accepted"
    with capsys.disabled():
        print(f"\ndraft-uni {'tree' if tree_nodes else 'chain'}: acceptance per position "
              f"{[round(a, 3) for a in spec]}, {n_emitted / n_rounds:.2f} tokens per target forward")


def test_the_round_shows_both_tokenisations(engine, pair):
    from ui.timeline import timeline_row
    from ui.tokens import Vocab

    target = pair[0]
    events = run(engine, prompts(target)[2], ["draft-uni"])
    shown = [e for e in events if e.draft_pieces]
    assert shown and all(e.kind == "spec" and e.drafter == "draft-uni" for e in shown)
    for e in shown:
        # the target tokens it became are those verified; the draft cut the same text finer
        assert e.target_pieces[:len(e.drafted)] == [target.tokenizer.decode([t]) for t in e.drafted]
        assert len(e.draft_pieces) > len(e.target_pieces)
    row = timeline_row(shown[0], Vocab.of(target.tokenizer), [])
    assert "draft tokens: [" in row and "→ target tokens: [" in row


def test_sample_and_match_gives_plain_sampling_text_for_the_same_seed(engine, pair):
    """The draft has no q over the target's vocabulary: at temperature > 0 its drafts go to sample-and-match, never
    to rejection sampling, and the text is the plain run's for the same seed."""
    n_spec = 0
    for seed, prompt in enumerate(prompts(pair[0])[:4]):
        plain = tokens(run(engine, prompt, [], temp=0.8, seed=seed))
        events = run(engine, prompt, ["draft-uni"], temp=0.8, seed=seed)
        assert tokens(events) == plain
        spec = [e for e in events if e.kind == "spec"]
        assert all(e.verify_mode == "match" and e.q_draft is None for e in spec)
        assert any("not rejection sampling" in note for note in events[0].notes)  # the user is told why
        n_spec += len(spec)
    assert n_spec > 0, "no draft was verified: nothing was compared"


class QGiver(Drafter):
    """Drafts one token with a q that is not over the target's vocabulary."""
    name = "fake"

    def draft(self, requests):
        for r in requests:
            r.result, r.result_q = [7], [torch.ones(3) / 3]


def test_the_chain_drops_q_from_a_drafter_that_does_not_give_the_targets():
    chain = DrafterChain({"fake": QGiver()})
    chain.begin(0, [1, 2], ["fake"])
    r = DraftRequest(seq=0, prompt=[1], id_last=2, n_max=4, n_min=0, p_min=None, want_q=True)
    chain.draft([r])
    assert r.result == [7] and r.result_q is None  # the round then verifies it by sample-and-match


def test_the_text_is_re_encoded_a_tail_at_a_time(pair):
    """Rounds of 1 to 5 new target tokens: after each, the draft's tokens are its tokenizer's encoding of the whole
    text, while each round encoded only a tail of bounded length."""
    target, draft, _ = pair
    bridge = TextBridge(target.tokenizer, draft.tokenizer)
    st = BridgeState()
    ids = target.encode(TEXT * 3)
    n, step, longest = 12, 0, 0
    bridge.sync(st, ids[:n])
    while n < len(ids):
        n = min(len(ids), n + 1 + step % 5)
        step += 1
        bridge.sync(st, ids[:n])
        assert st.text == target.tokenizer.decode(ids[:n])
        assert st.draft.tokens == encode(draft.tokenizer, st.text)
        longest = max(longest, st.chars_encoded)
    assert len(st.text) > 600 and longest < 80, f"a round encoded {longest} characters of {len(st.text)}"


def test_the_drafters_own_tokens_follow_the_generated_text(engine, pair):
    target, draft, _ = pair
    run(engine, prompts(target)[1], ["draft-uni"])
    slot = engine.slots[0]
    st = engine.pool["draft-uni"].states[0]  # as of the last draft: the rounds after it drafted nothing
    assert len(st.target.tokens) > len(prompts(target)[1]) + 20
    assert st.target.tokens == (slot.tokens + [slot.id_last])[:len(st.target.tokens)]
    assert st.text == target.tokenizer.decode(st.target.tokens)
    assert st.draft.tokens == encode(draft.tokenizer, st.text)


def test_only_whole_target_tokens_that_extend_the_confirmed_ones_are_drafted(pair):
    target, draft, _ = pair
    tt = target.tokenizer
    bridge = TextBridge(tt, draft.tokenizer)
    st = BridgeState()
    bridge.sync(st, target.encode("The small river runs past the old"))
    got = bridge.to_target(st, " mill, where the mil")
    # the text's last target token may be a piece of a longer one (' mil' of ' mill' or ' miller'): it is left out
    whole = encode(tt, " mill, where the mil")
    assert got == whole[:-1] and tt.decode(got).startswith(" mill, where the")
    # the confirmed text ends inside a word: the drafted text merges with its last token, which the target
    # wrote otherwise, so the draft does not extend the confirmed tokens and nothing is drafted
    st = BridgeState()
    bridge.sync(st, target.encode("The small river runs past the old mi"))
    assert bridge.to_target(st, "ll, where the miller") == []


def test_the_page_puts_the_draft_models_drafter_in_the_chain():
    from ui.settings import with_draft_type

    assert with_draft_type(["ngram-simple", "draft-simple"], "draft-uni") == ["ngram-simple", "draft-uni"]
    assert with_draft_type(["ngram-simple"], "draft-simple") == ["ngram-simple", "draft-simple"]
    assert with_draft_type(["draft-uni", "ngram-mod"], "draft-uni") == ["draft-uni", "ngram-mod"]


def test_the_bench_runs_draft_uni(pair, tmp_path):
    from engine.bench import cli
    from engine.bench.rows import load_rows

    _, _, root = pair
    prompts_file = tmp_path / "p.jsonl"
    prompts_file.write_text(json.dumps({"id": "mill", "prompt": TEXT[:60]}) + "\n")
    out = tmp_path / "uni.csv"
    assert cli.main(["--prompts", str(prompts_file), "--out", str(out), "--target", str(root / "target"),
                     "--draft", str(root / "draft"), "--spec", "draft-uni", "--max-new-tokens", "24",
                     "--ignore-eos", "--p-min", "0", "--no-adaptive"]) == 0
    spec = [r for r in load_rows(out) if r["spec_decode"] == "on"]
    assert spec and all(r["lossless_ok"] == "True" for r in spec)


def walk_bridge(tt, td, ids: list[int], stride: int) -> BridgeState:
    """Confirm `ids` to a bridge a few tokens at a time (1 to `stride`): after each step its text is the target's
    decoding, and the draft's tokens are the draft tokenizer's encoding of that text (a character cut in half is
    re-read when its last byte comes, so it is not compared then). Returns the bridge's state at the end."""
    bridge, st = TextBridge(tt, td), BridgeState()
    n, step = 4, 0
    while n < len(ids):
        n = min(len(ids), n + 1 + step % stride)
        step += 1
        bridge.sync(st, ids[:n])
        assert st.text == decode(tt, ids[:n])
        if not st.text.endswith("\ufffd"):
            assert st.draft.tokens == encode(td, st.text)
    return st


def test_the_same_distribution_check_passes_through_another_vocabulary(pair):
    """The page's "Same distribution?" check (engine/bench/samedist.py) on the text bridge at temperature 2:
    the second answer token over 1,000 speculative and 1,000 plain answers."""
    from engine.bench.samedist import SameDistPlan, compare, engine_runner
    from engine.draft.draft_model import DraftModelParams
    from engine.draft.draft_uni import DraftUniParams

    target, draft, _ = pair
    wide = Engine(target, draft=draft, n_ctx=8 * 64, n_seq_max=8, calibrate=False,
                  drafter_params={"draft-uni": DraftUniParams(model=DraftModelParams(n_seq_max=8))})
    # temperature 2: the trained pair is sure of the paragraph, and a test of one token says nothing
    params = GenParams(sampling=SamplerParams(temp=2.0),
                       spec=SpecParams(types=["draft-uni"], n_max=3, adaptive=False, p_min=0.0))
    report = compare(engine_runner(wide), prompts(target)[0], params, SameDistPlan(n=1000, width=8))
    # most second tokens were a verification's (a drafted text may hold no whole target token: no draft then)
    assert report.n_verified > 500 and report.n_accepted > 0
    assert report.dof >= 3 and report.p_value > 0.01, report
