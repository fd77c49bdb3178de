"""What a rehearsal stage raises: a finding the cluster run would fail on, or
one it would run past but a user should see; both keep the problem and its
fix apart, as every SetupError does."""

from __future__ import annotations

from thinkrl.errors import SetupError


class StageFailed(SetupError):
    """The run would fail here (on the cluster: after the job was booked)."""


class StageWarning(SetupError):
    """The run would go on, but something needs a look."""
