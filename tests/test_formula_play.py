"""The formula to play with (ui/formula_play.py): the curve is the formula, break-even and the a -> 1 cap are
where the formula puts them, each rule of thumb is stated beside the number it checks, and the last answer's
measured point is drawn where it was measured."""

import pytest

from engine.bench.stats import formula
from ui import formula_play
from ui.lesson import Explained, break_even


def test_the_curve_is_the_formula_with_break_even_marked():
    fig = formula_play.figure(0.6, 4, 0.3)
    main = next(d for d in fig["data"] if d["name"] == "k = 4, c = 0.30")
    for x, y in zip(main["x"], main["y"]):
        assert y == pytest.approx(formula(x, 4, 0.3))
    a_even = break_even(4, 0.3)
    assert formula(a_even, 4, 0.3) == pytest.approx(1.0, abs=1e-6)
    assert any(s["x0"] == a_even for s in fig["layout"]["shapes"]) and f"{a_even:.2f}" in fig["layout"]["annotations"][0]["text"]
    assert {d["name"] for d in fig["data"]} >= {"k = 1", "k = 2", "k = 8", "k = 16"}  # the other k, faintly


def test_the_rules_of_thumb_stand_beside_their_numbers():
    words = formula_play.text(0.2, 12, 0.5)
    assert f"{formula(0.2, 12, 0.5):.2f}&times;" in words and "slower than plain decoding" in words
    assert f"(k + 1) / (c + 1) = {13 / 1.5:.2f}" in words
    assert "below about 0.3" in words and "this a is below it" in words
    assert "k of 4 to 8" in words and "k is outside it" in words and f"{0.2 ** 12:.3f}" in words
    assert f"Kept / drafted = {formula_play.hit_rate(0.2, 12):.2f}" in words and "(here it is below)" in words
    good = formula_play.text(0.9, 6, 0.2)
    assert "faster than" in good and "this a is above it" in good and "k is inside it" in good
    assert "(here it is below)" not in good


def test_kept_over_drafted_is_the_expected_kept_tokens_over_k():
    for a, k in ((0.5, 4), (0.8, 8), (0.0, 3)):
        expected_kept = sum(a ** i for i in range(1, k + 1))  # position i is reached and kept with a^i
        assert formula_play.hit_rate(a, k) == pytest.approx(expected_kept / k)
    assert formula_play.hit_rate(1.0, 5) == 1.0


def test_the_last_answer_is_drawn_where_it_was_measured():
    x = Explained(alpha=0.55, per_pos=(0.7, 0.5), k=3.2, c=0.4, predicted=1.3, measured=1.21, break_even=0.3,
                  split_ms=(1.0, 20.0, 0.1, 2.0))
    fig = formula_play.figure(0.55, 3, 0.4, x)
    point = next(d for d in fig["data"] if d["name"].startswith("your last answer"))
    assert point["x"] == [0.55] and point["y"] == [1.21]
    assert "measured 1.21&times;" in formula_play.text(0.55, 3, 0.4, x)
