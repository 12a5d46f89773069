"""Errors a user can act on.

Library code raises :class:`InputError` for bad input; the CLI turns it into one line and exit
code 2. Each message names the offending field and says how to fix it. :class:`InvalidSchedule`
is the one kind of bad input that is not a usage error: the file was read and understood, and
what it describes is wrong (a race, a deadlock, a chunk sent before it is held, a wrong result).
The CLI gives it exit code 1, the code of a failed verification.
"""


class InputError(ValueError):
    """Bad input: ``field`` names what is wrong, ``fix`` says what to do instead."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        msg = f"{field}: {problem}"
        if fix:
            msg += f" ({fix})"
        super().__init__(msg)


class InvalidSchedule(InputError):
    """A schedule or algorithm that was understood and breaks a rule (exit code 1, not 2)."""
