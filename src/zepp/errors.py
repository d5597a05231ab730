"""The exception types zepp raises.

``ZeppInputError`` is bad input: messages name the file, field, option or row that is wrong
and say what would fix it, and the command line prints them as one line without a traceback
(exit code 2). The others are failures of the machinery that runs ranks or builds the
emulated cluster; their messages are also meant to be printed as they are.
"""

from __future__ import annotations


class ZeppInputError(ValueError):
    """Bad user input: a file, option or array that zepp cannot use as given."""


class ZeppFileError(ZeppInputError):
    """Bad content of an input file, as one line ``<what>, <file> field <field>; <fix>``
    (``field`` ``None``: the file as a whole is to blame). Attributes ``what``, ``path``,
    ``field``, ``fix``."""

    def __init__(self, what: str, path, field: str | None = None, fix: str = "fix the file"):
        self.what, self.path, self.field, self.fix = what, str(path), field, fix
        where = self.path if field is None else f"{self.path} field {field}"
        super().__init__(f"{what}, {where}; {fix}")


class EmulationUnavailable(RuntimeError):
    """This machine cannot host the emulated cluster (not root, no netns, missing qdisc)."""


class EmulationError(RuntimeError):
    """A command that builds, inspects or removes the emulated cluster failed or was refused
    (for example: the prefix is in use by another cluster)."""


class RankFailure(RuntimeError):
    """One or more rank processes failed, were killed or hung.

    The message names each rank that failed on its own account and why (its exit code, the
    signal that killed it, or a hang that the launcher ended), the first rank to fail, the exit
    codes by rank and the last lines of each rank's stderr. Attributes: ``first`` (rank),
    ``codes`` (exit code per rank; negative: killed by that signal), ``errs`` (stderr texts),
    ``culprits`` (ranks that failed on their own account, not just noticed a peer failing),
    ``hung`` (ranks the launcher killed because they did not end in time).
    """

    def __init__(self, message: str, first: int | None = None, codes=(), errs=(), culprits=(), hung=()):
        super().__init__(message)
        self.first = first
        self.codes = list(codes)
        self.errs = list(errs)
        self.culprits = list(culprits)
        self.hung = list(hung)
