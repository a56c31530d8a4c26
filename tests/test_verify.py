"""Verification maths: matching, rejection sampling's distribution, the sampler's stream and rollback."""

import pytest
import torch

from engine.round import verify
from engine.sampling import Sampler, SamplerParams


def test_greedy_match_keeps_agreeing_prefix_plus_one():
    logits = torch.full((4, 10), -5.0)
    for row, tok in enumerate([3, 4, 7, 9]):
        logits[row, tok] = 5.0
    v = verify.sample_and_match(Sampler(SamplerParams(temp=0)), logits, [3, 4, 5])
    assert v.tokens == [3, 4, 7] and v.n_accepted == 2
    v = verify.sample_and_match(Sampler(SamplerParams(temp=0)), logits, [3, 4, 7])
    assert v.tokens == [3, 4, 7, 9] and v.n_accepted == 3  # all accepted: the bonus row speaks
    v = verify.sample_and_match(Sampler(SamplerParams(temp=0)), logits[:1], [])
    assert v.tokens == [3] and v.n_accepted == 0
    # the caller's argmax (the round's event has it) gives the same verdict; a grammar's mask makes its own
    top = logits.argmax(dim=-1).tolist()
    for draft in ([3, 4, 5], [3, 4, 7], [1, 2, 3]):
        assert verify.sample_and_match(Sampler(SamplerParams(temp=0)), logits, draft, top=top) == \
            verify.sample_and_match(Sampler(SamplerParams(temp=0)), logits, draft)
    allowed = torch.ones(4, 10, dtype=torch.bool)
    allowed[2, 7] = False  # the grammar forbids the target's own choice at row 2: it takes the next best
    v = verify.sample_and_match(Sampler(SamplerParams(temp=0)), logits, [3, 4, 7], allowed, top=top)
    assert v.tokens[:2] == [3, 4] and v.tokens[2] != 7


def test_sample_and_match_draws_once_per_emitted_token_like_plain_sampling():
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    plain = Sampler(SamplerParams(temp=0.8, seed=11))
    plain_tokens = [plain.sample(logits[i]) for i in range(6)]
    # a draft that agrees with the first 3 plain tokens then differs
    draft = plain_tokens[:3] + [(plain_tokens[3] + 1) % 50, 0]
    s = Sampler(SamplerParams(temp=0.8, seed=11))
    v = verify.sample_and_match(s, logits, draft)
    assert v.tokens == plain_tokens[:4]
    assert s.n_draws == 4 and v.n_draws == 4


def test_sampler_filters():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    p = Sampler(SamplerParams(temp=1.0, top_k=2)).probs(logits)
    assert (p[2:] == 0).all() and torch.isclose(p.sum(), torch.tensor(1.0))
    p = Sampler(SamplerParams(temp=1.0, top_p=0.5)).probs(logits)
    assert p[0] == 1.0
    p = Sampler(SamplerParams(temp=1.0, min_p=0.3)).probs(logits)
    assert (p[2:] == 0).all() and p[1] > 0
    with pytest.raises(ValueError):
        SamplerParams(temp=-1).validate()
    with pytest.raises(ValueError):
        SamplerParams(top_p=0).validate()


def test_clone_and_copy_restore_the_stream():
    s = Sampler(SamplerParams(temp=1.0, seed=5))
    s.uniform()
    saved = s.clone()
    a = [s.uniform() for _ in range(3)]
    s.copy_from(saved)
    assert [s.uniform() for _ in range(3)] == a
    assert saved.n_draws == 1


def test_replay_advances_the_stream_exactly_as_the_verification_did():
    torch.manual_seed(1)
    logits = torch.randn(4, 20)
    s = Sampler(SamplerParams(temp=1.0, seed=3))
    before = s.clone()
    v = verify.sample_and_match(s, logits, [1, 2, 3])
    after = s.uniform()
    s.copy_from(before)
    verify.replay(s, v.tokens, v.n_draws)
    assert s.uniform() == after


def _empirical(draw, n: int, vocab: int) -> torch.Tensor:
    counts = torch.zeros(vocab)
    for _ in range(n):
        counts[draw()] += 1
    return counts / n


def test_rejection_sampling_first_token_is_distributed_as_p():
    """The first emitted token of a rejection-sampling round must follow p exactly, whatever q is."""
    vocab = 6
    p_logits = torch.tensor([2.0, 1.5, 0.2, -1.0, 0.7, 0.0])
    q = torch.tensor([0.05, 0.05, 0.5, 0.3, 0.05, 0.05])  # a draft that likes the wrong tokens
    target = Sampler(SamplerParams(temp=1.0, seed=7))
    p = target.probs(p_logits)
    g = torch.Generator().manual_seed(99)
    logits = torch.stack([p_logits, p_logits])

    def draw():
        d = int(torch.multinomial(q, 1, generator=g))
        return verify.rejection(target, logits, [d], [q]).tokens[0]

    freq = _empirical(draw, 6000, vocab)
    tv = 0.5 * float((freq - p).abs().sum())
    assert tv < 0.03, f"total variation {tv:.3f} between emitted tokens and p"
    # and it must really differ from q (a test that cannot fail is a defect)
    assert 0.5 * float((freq - q).abs().sum()) > 0.3


def test_rejection_verdict_records_each_uniform_and_the_residual_it_drew_from():
    """The event's numbers (RoundEvent.uniforms, residual_top) are the ones that decided: every kept token had
    u <= p/q, the refused one u > p/q, and the residual's top tokens are norm(max(0, p - q))'s, largest first."""
    p_logits = torch.tensor([2.0, 1.5, 0.2, -1.0, 0.7, 0.0])
    q = torch.tensor([0.05, 0.05, 0.5, 0.3, 0.05, 0.05])
    target = Sampler(SamplerParams(temp=1.0, seed=3))
    p = target.probs(p_logits)
    want = torch.clamp(p - q, min=0.0)
    want = want / want.sum()
    logits = torch.stack([p_logits] * 4)
    seen_rejection = False
    for _ in range(40):
        v = verify.rejection(target, logits, [2, 3, 2], [q, q, q], residual_shown=verify.RESIDUAL_SHOWN)
        m = v.n_accepted
        assert len(v.uniforms) == min(m + 1, 3)
        for i, u in enumerate(v.uniforms):
            ratio = float(p[v.tokens[i] if i < m else [2, 3, 2][i]]) / float(q[[2, 3, 2][i]])
            assert (u <= ratio) == (i < m)
        if m < 3:
            seen_rejection = True
            ids, probs = zip(*v.residual_top)
            assert list(ids) == torch.topk(want, 5).indices.tolist()
            assert torch.allclose(torch.tensor(probs), torch.topk(want, 5).values, atol=1e-6)
        else:
            assert v.residual_top == []
    assert seen_rejection, "a draft the target dislikes was never refused: the residual went untested"


def test_wrong_residual_would_be_caught():
    """Sampling rejected tokens from p instead of norm(max(0, p - q)) biases the output; the check sees it."""
    p_logits = torch.tensor([2.0, 1.5, 0.2, -1.0, 0.7, 0.0])
    q = torch.tensor([0.05, 0.05, 0.5, 0.3, 0.05, 0.05])
    target = Sampler(SamplerParams(temp=1.0, seed=7))
    p = target.probs(p_logits)
    g = torch.Generator().manual_seed(99)

    def wrong_draw():
        d = int(torch.multinomial(q, 1, generator=g))
        if target.uniform() * float(q[d]) <= float(p[d]):
            return d
        return target.sample_probs(p)  # the bug: ignores what the draft already covered

    freq = _empirical(wrong_draw, 6000, 6)
    assert 0.5 * float((freq - p).abs().sum()) > 0.05


def test_rejection_sampling_two_positions_joint_distribution():
    """With identical p rows, the first two emitted tokens are independent draws from p."""
    p_logits = torch.tensor([1.0, 0.0, -0.5, 0.5])
    q = torch.tensor([0.1, 0.6, 0.1, 0.2])
    target = Sampler(SamplerParams(temp=1.0, seed=1))
    p = target.probs(p_logits)
    g = torch.Generator().manual_seed(5)
    logits = torch.stack([p_logits] * 3)
    counts = torch.zeros(4, 4)
    n = 0
    for _ in range(8000):
        d = [int(torch.multinomial(q, 1, generator=g)) for _ in range(2)]
        toks = verify.rejection(target, logits, d, [q, q]).tokens
        if len(toks) >= 2:
            counts[toks[0], toks[1]] += 1
            n += 1
        else:
            # the second token of this round is drawn next round from p: emulate it
            counts[toks[0], target.sample_probs(p)] += 1
            n += 1
    joint = counts / n
    want = p[:, None] * p[None, :]
    assert 0.5 * float((joint - want).abs().sum()) < 0.04
