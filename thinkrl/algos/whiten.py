"""Batch whitening of per-token values (REINFORCE++ and GAE advantages).

Its own module because both ``advantages`` and ``gae`` use it and the
advantage registry imports ``gae``."""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.errors import UserError


def masked_whiten(values: Tensor, mask: Tensor) -> Tensor:
    """(x - mu) / sqrt(var + 1e-8) over the masked entries of the whole batch.

        mu  = sum(x m) / (sum m + 1e-8)
        var = sum((x - mu)^2 m) / (sum m + 1e-8) * M / (M - 1),   M = sum m  (Bessel)

    Args: values, mask [N, T]. Returns [N, T] (padding entries are not zeroed here).
    """
    mask = mask.float()
    count = mask.sum()
    if count < 2:
        raise UserError(f"whitening needs at least 2 response tokens in the batch, got {int(count)}; "
                         "use a larger data.train_batch_size or rollout.n")
    mean = (values * mask).sum() / (count + 1e-8)
    var = ((values - mean) ** 2 * mask).sum() / (count + 1e-8) * count / (count - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)
