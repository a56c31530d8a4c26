"""A slot's text comes from decoding a window of its last tokens (engine/round/slot.py): the pieces it gives out add
up to the decoding of the whole answer, with no half-decoded character in any piece."""

import random

import pytest

from engine.params import GenParams
from engine.sampling import Sampler, SamplerParams
from engine.round.slot import WINDOW, Slot

TEXT = ("Le café était plein; 日本語のテキストも少し。 Emoji 🎉🎉 and plain words, repeated: "
        "naïve façade, déjà vu, Straße, 東京タワー. ") * 6


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # a small vocabulary: multi-byte characters are split over several tokens, as in a real byte-level BPE
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel
                                                        .alphabet(), special_tokens=["</s>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")


def make_slot(n: int) -> Slot:
    return Slot(seq=0, params=GenParams(max_new_tokens=n, ignore_eos=True), sampler=Sampler(SamplerParams()),
                prompt=[0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_pieces_add_up_to_the_whole_decoding(tokenizer, seed):
    ids = tokenizer(TEXT)["input_ids"]
    assert len(ids) > 10 * WINDOW
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    assert "\ufffd" in "".join(decode([i]) for i in ids)  # some tokens are parts of a character
    slot, rng, at, pieces = make_slot(len(ids)), random.Random(seed), 0, []
    while at < len(ids):
        n = rng.randint(1, 6)
        ev = slot.emit(ids[at:at + n], set(), decode)
        at += len(ev.emitted)
        assert "\ufffd" not in ev.text_delta
        pieces.append(ev.text_delta)
    assert "".join(pieces) == slot.text == decode(ids) == TEXT
    assert slot.dec_from > 0  # the window moved on: no round decoded the whole answer


def test_a_final_half_character_is_given_out(tokenizer):
    ids = tokenizer("Ω")["input_ids"]  # not in the training text: one token per byte
    assert len(ids) > 1
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    slot = make_slot(len(ids) - 1)
    ev = slot.emit(ids, set(), decode)
    assert ev.done and ev.text_delta == decode(ids[:-1]) and ev.text_delta.endswith("\ufffd")


CLEANUP_TEXT = ("It's fine, isn't it? I don't know. We're here! They've gone, and I'm ok. Say \"hi\" , then ' quote ' . "
                "You'll see: it's done , right ? ") * 4


@pytest.fixture(scope="module")
def cleanup_tokenizer(tmp_path_factory):
    """A WordPiece tokenizer as BERT's, with transformers' clean-up on: decoding "it '" gives "it '" but
    decoding "it ' s" gives "it's", so text already given out is rewritten by a later token."""
    from tokenizers import pre_tokenizers
    from transformers import BertTokenizerFast

    words = sorted({w for w, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(CLEANUP_TEXT.lower())})
    vocab = tmp_path_factory.mktemp("wordpiece") / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + words) + "\n")
    return BertTokenizerFast(str(vocab), clean_up_tokenization_spaces=True)


def stream(slot: Slot, ids: list[int], decode, rng: random.Random):
    """Emit ids in random chunks; yield each chunk's delta."""
    at = 0
    while at < len(ids):
        ev = slot.emit(ids[at:at + rng.randint(1, 4)], set(), decode)
        at += len(ev.emitted)
        yield ev.text_delta


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_decoder_that_cleans_up_spaces_streams_the_final_text(cleanup_tokenizer, seed):
    ids = cleanup_tokenizer(CLEANUP_TEXT, add_special_tokens=False)["input_ids"]
    decode = lambda t: cleanup_tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    final = decode(ids)
    assert "it's" in final and "it '" in decode(ids[:2])  # the clean-up rewrites given text, or this tests nothing
    assert len(ids) > 3 * WINDOW
    slot, given = make_slot(len(ids)), ""
    for delta in stream(slot, ids, decode, random.Random(seed)):
        given += delta
        assert final.startswith(given), f"given text {given[-30:]!r} is not how the answer goes on"
    assert given == slot.text == final
    assert slot.dec_from > 0


def test_a_rewrite_beyond_the_held_tail_still_gives_out_the_rest():
    """A decoder that rewrites a whole text (here: upper case once a marker token arrives) cannot keep given text
    a prefix; what follows the rewrite still goes out instead of nothing."""
    words = ["<s>", "hello", "there", "my", "good", "friend", "SHOUT", "and", "then", "more", "words"]
    decode = lambda t: (lambda s: s.upper() if "SHOUT" in s else s)(" ".join(words[i] for i in t))  # noqa: E731
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    given = "".join(stream(make_slot(len(ids)), ids, decode, random.Random(0)))
    assert given.startswith("hello there my good")
    assert given.endswith("AND THEN MORE WORDS")
