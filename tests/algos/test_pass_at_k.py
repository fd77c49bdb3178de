"""pass@k, best@k, mean@n against values worked out by hand."""

from itertools import combinations
from math import comb

import pytest

from thinkrl.algos.pass_at_k import best_at_k, k_values, mean_at_n, mean_pass_at_k, pass_at_k


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 0.4),                 # c / n
    (5, 2, 2, 0.7),                 # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 2, 3, 0.9),                 # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (5, 2, 4, 1.0),                 # n - c = 3 < k: every 4-subset holds a correct one
    (5, 0, 3, 0.0),                 # nothing correct
    (5, 5, 1, 1.0),
    (4, 1, 2, 0.5),                 # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (8, 3, 4, 1 - 5 / 70),          # C(5,4) = 5, C(8,4) = 70
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_product_form_matches_binomials_for_large_n():
    # C(200, 100) ~ 9e58: the product never forms it, the ratio stays exact enough.
    n, c, k = 200, 7, 100
    expected = 1 - comb(n - c, k) / comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12)


def test_pass_at_k_rejects_impossible_arguments():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="impossible"):
        pass_at_k(4, 5, 1)


def test_mean_pass_at_k_averages_prompts():
    # prompt A: n=5, c=2 -> pass@2 = 0.7; prompt B: n=5, c=0 -> 0
    assert mean_pass_at_k([(5, 2), (5, 0)], 2) == pytest.approx(0.35)


def test_best_at_k_hand_values():
    scores = [0.0, 0.1, 1.0, 0.1]
    # k=2: 6 pairs; the pairs holding the 1.0 (3 of them) give 1.0, the other
    # three give max(0, .1)=.1, max(0, .1)=.1, max(.1, .1)=.1 -> (3 + 0.3) / 6
    assert best_at_k(scores, 2) == pytest.approx(3.3 / 6)
    assert best_at_k(scores, 1) == pytest.approx(mean_at_n(scores))
    assert best_at_k(scores, 4) == pytest.approx(1.0)


def test_best_at_k_is_the_mean_max_over_all_subsets():
    scores = [0.3, 0.9, 0.0, 0.5, 0.5]
    for k in range(1, 6):
        subsets = list(combinations(scores, k))
        assert best_at_k(scores, k) == pytest.approx(sum(map(max, subsets)) / len(subsets))


def test_best_at_k_equals_pass_at_k_on_binary_scores():
    scores = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    for k in range(1, 7):
        assert best_at_k(scores, k) == pytest.approx(pass_at_k(6, 2, k))


def test_k_values():
    assert k_values(1) == [1]
    assert k_values(2) == [1, 2]
    assert k_values(5) == [1, 2, 4, 5]
    assert k_values(8) == [1, 2, 4, 8]
