"""A slot's text comes from decoding a window of its last tokens (engine/round/slot.py): the pieces it gives out add
up to the decoding of the whole answer, with no half-decoded character in any piece."""

import random

import pytest

from engine.events import RoundEvent
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
        ev = slot.emit(ids[at:at + n], RoundEvent(seq=0, round=0, kind="plain", drafter=None, pos_sampled=0, p0=1),
                       set(), decode)
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
    ev = slot.emit(ids, RoundEvent(seq=0, round=0, kind="plain", drafter=None, pos_sampled=0, p0=1), set(), decode)
    assert ev.done and ev.text_delta == decode(ids[:-1]) and ev.text_delta.endswith("\ufffd")
