"""The base of the errors ``schemas/`` raises for the user to fix (a project, a contract or a schema change Loopline
cannot take): each message names what is wrong and the fix, so the ``loopline`` command prints it as one line."""


class SchemasError(Exception):
    """A project, contract or schema problem the user can fix; ``str(err)`` says what and how."""
