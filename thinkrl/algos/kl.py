"""Per-token estimators of KL(pi || pi_ref) from sampled-token log-probs.

Shape legend: N responses = B prompts x G samples, T response tokens.

Tokens are sampled from the current policy pi, so with
log r = log pi_ref(y_t) - log pi(y_t) each estimator below is a single-sample
estimate of KL(pi || pi_ref) (J. Schulman, "Approximating KL divergence", 2020):
k1 = -log r is unbiased but noisy, k2 = 0.5 (log r)^2 is biased but low
variance, k3 = r - log r - 1 is unbiased, non-negative and low variance.
Each takes ``(logprob [N, T], ref_logprob [N, T])`` and returns ``[N, T]``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from thinkrl.errors import UserError

__all__ = ["KL_ESTIMATORS", "get_kl_estimator", "kl_abs", "kl_k1", "kl_k2", "kl_k3"]

KLEstimator = Callable[[Tensor, Tensor], Tensor]


def kl_k1(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """k1 = log pi - log pi_ref.  Args and result: [N, T]."""
    return logprob - ref_logprob


def kl_abs(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """|log pi - log pi_ref|.  Args and result: [N, T]."""
    return (logprob - ref_logprob).abs()


def kl_k2(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """k2 = 0.5 * (log pi - log pi_ref)^2.  Args and result: [N, T]."""
    return 0.5 * (logprob - ref_logprob).square()


def kl_k3(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """k3 ("low_var_kl") = exp(d) - d - 1 with d = log pi_ref - log pi.

    d is clamped to [-20, 20] before exp so a token the reference finds
    impossible cannot overflow, and k3 is clamped to [-10, 10] so a few such
    tokens cannot dominate the loss (the clamps verl uses).  Args and result: [N, T].
    """
    d = (ref_logprob - logprob).clamp(min=-20.0, max=20.0)
    return (torch.exp(d) - d - 1).clamp(min=-10.0, max=10.0)


KL_ESTIMATORS: dict[str, KLEstimator] = {
    "kl": kl_k1,
    "k1": kl_k1,
    "abs": kl_abs,
    "mse": kl_k2,
    "k2": kl_k2,
    "low_var_kl": kl_k3,
    "k3": kl_k3,
}


def get_kl_estimator(name: str) -> KLEstimator:
    """Return the estimator named ``name`` (aliases: kl=k1, mse=k2, low_var_kl=k3)."""
    try:
        return KL_ESTIMATORS[name]
    except KeyError:
        known = ", ".join(KL_ESTIMATORS)
        raise UserError(f"Unknown KL estimator {name!r}; choose one of: {known}.") from None
