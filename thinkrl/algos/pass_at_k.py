"""Sampling metrics over G responses per prompt: mean@n, pass@k, best@k.

Shapes: a prompt has n scored responses; `correct` counts those judged
correct (c <= n). All functions are exact (no bootstrap) and pure.
"""

from __future__ import annotations

from math import comb
from typing import Sequence

from thinkrl.errors import UserError


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code", eq. 1) for one prompt:

        pass@k = 1 - C(n - c, k) / C(n, k)

    the probability that at least one of k responses drawn without
    replacement from the n sampled ones is correct. Computed as the product

        C(n - c, k) / C(n, k) = prod_{i = n - c + 1}^{n} (1 - k / i)

    which never forms the (huge) binomials. Needs 1 <= k <= n, 0 <= c <= n.
    c = 0 gives 0; n - c < k (every k-subset holds a correct one) gives 1.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass@k: {c} correct out of {n} samples is impossible")
    if not 1 <= k <= n:
        raise UserError(f"pass@{k} needs 1 <= k <= n, but n = {n} samples per prompt; "
                         f"sample at least {k} (rollout.val_kwargs.n / --n) or lower k")
    if n - c < k:
        return 1.0
    miss_all = 1.0
    for i in range(n - c + 1, n + 1):
        miss_all *= 1.0 - k / i
    return 1.0 - miss_all


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """pass@k averaged over prompts; `counts` holds one (n, c) per prompt
    (n may differ between prompts, each must be >= k)."""
    if not counts:
        raise ValueError("pass@k over zero prompts is undefined")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def mean_at_n(scores: Sequence[float]) -> float:
    """mean@n of one prompt: the average score of its n responses."""
    if not scores:
        raise ValueError("mean@n over zero responses is undefined")
    return sum(scores) / len(scores)


def best_at_k(scores: Sequence[float], k: int) -> float:
    """Expected best score among k responses drawn without replacement from
    one prompt's n scored responses (verl's `best@k`, computed exactly
    instead of by bootstrap). With scores sorted ascending, s_(1) <= ... <= s_(n),
    the i-th is the maximum of a random k-subset with probability
    C(i - 1, k - 1) / C(n, k), so

        best@k = sum_{i=k}^{n} s_(i) * C(i - 1, k - 1) / C(n, k).

    For 0/1 scores this equals pass_at_k(n, sum(scores), k).
    """
    n = len(scores)
    if not 1 <= k <= n:
        raise UserError(f"best@{k} needs 1 <= k <= n, but there are {n} responses")
    ordered = sorted(scores)
    total = comb(n, k)
    return sum(ordered[i - 1] * comb(i - 1, k - 1) for i in range(k, n + 1)) / total


def k_values(n: int) -> list[int]:
    """The k reported for n samples per prompt: 1, 2, 4, ... below n, and n."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]
