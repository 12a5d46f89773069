"""Errors a user can act on.

Library code raises :class:`InputError` for bad input; the CLI turns it into one line and exit
code 2. Each message names the offending field and says how to fix it.
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
