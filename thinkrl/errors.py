"""An error a user can fix, with what is wrong and what to do kept apart.

Its message is both ("problem; fix"), so code that only prints it loses
nothing; `thinkrl doctor` shows them in separate columns without parsing
text. A ValueError, so every caller that handles user mistakes handles it.
"""

from __future__ import annotations


class SetupError(ValueError):
    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem, self.fix = problem, fix

    def __reduce__(self):  # pickled whole (it crosses from Ray workers to the driver)
        return type(self), (self.problem, self.fix)


def problem_and_fix(err: Exception, *, default_fix: str = "see the message") -> tuple[str, str]:
    """(problem, fix) of any error: a SetupError's own parts, else the whole message."""
    if isinstance(err, SetupError):
        return err.problem, err.fix
    return str(err), default_fix


class RunStopped(RuntimeError):
    """The run stopped itself on purpose (a guard fired: destroyed weights,
    failing rewards). Its message says why, what is kept on disk and how to
    go on; the command line prints it without a traceback and exits 1."""


class DiskFull(SetupError):
    """A write failed because the disk is full; names the folder, its free
    space and the space needed."""
