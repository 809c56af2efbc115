"""The one error type the stack raises: a one-line explanation plus the fix."""


class StackError(RuntimeError):
    """Something in the local stack is wrong in a way the user can fix.

    ``str(err)`` is one line: what is wrong, then what to do about it.
    """

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem} — fix: {fix}")
