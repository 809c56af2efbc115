"""The base of the errors ``streams/`` raises for the user to fix (a feature view the engine cannot compute, a topic
spec, an undelivered record, a job's state or environment): each message names what is wrong and the fix, so the
``loopline`` command prints it as one line."""


class StreamsError(Exception):
    """A streaming problem the user can fix; ``str(err)`` says what and how."""
