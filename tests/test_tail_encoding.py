"""The text bridge re-encodes only a tail of the text: a tokenizer with a SentencePiece dummy prefix (Llama 2's: `▁`
before every text) encodes a tail that starts inside a word otherwise than inside the whole text, and the bridge's
TailEncoder encodes it after an anchor instead. Tokenizers trained here on one paragraph, small enough that words
split into several tokens."""

import pytest

from engine.draft.text_bridge import BridgeState, TailEncoder, TextBridge, decode, encode
from test_draft_uni import TEXT, make_bpe, walk_bridge


def make_dummy_prefix_bpe(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator([TEXT * 4], trainers.BpeTrainer(vocab_size=vocab_size,
                                                            special_tokens=["<unk>", "<s>", "</s>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def sp():
    return make_dummy_prefix_bpe(160)


def _tails(tok, text):
    """(k, the text after token k) for each cut of text's tokens where the head decodes to the text's start."""
    ids = encode(tok, text)
    for k in range(1, len(ids)):
        head = decode(tok, ids[:k])
        if text.startswith(head):
            yield k, text[len(head):]


def test_a_tail_encodes_as_inside_the_whole_text(sp):
    ids = encode(sp, TEXT)
    tail_encoder = TailEncoder(sp)
    assert tail_encoder.anchored
    n_mid_word = 0
    for k, tail in _tails(sp, TEXT):
        assert tail_encoder(tail, at_start=False) == ids[k:], tail[:20]
        n_mid_word += encode(sp, tail) != ids[k:]  # what a plain encoding of the tail gets wrong
    assert n_mid_word > 10
    assert tail_encoder(TEXT, at_start=True) == ids


def test_byte_level_bpe_needs_no_anchor():
    assert not TailEncoder(make_bpe(300, ["<s>", "</s>", "<unk>", "<pad>"])).anchored


@pytest.mark.parametrize("sp_side", ["draft", "target"])
def test_the_bridge_keeps_a_dummy_prefix_vocabulary_in_step(sp, sp_side):
    bpe = make_bpe(300, ["<s>", "</s>", "<unk>", "<pad>"])
    tt, td = (bpe, sp) if sp_side == "draft" else (sp, bpe)
    walk_bridge(tt, td, encode(tt, TEXT * 2), stride=5)
    # the drafted text is encoded from a seam a few tokens back, inside a word: as inside the whole text
    bridge, st = TextBridge(tt, td), BridgeState()
    confirmed = encode(tt, "The small river runs past the old")
    whole = encode(tt, "The small river runs past the old mill, where the miller's")
    assert whole[:len(confirmed)] == confirmed
    bridge.sync(st, confirmed)
    assert bridge.to_target(st, " mill, where the miller's") == whole[len(confirmed):-1]
