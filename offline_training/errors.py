"""The base of the errors ``offline_training/`` raises for the user to fix (a training run, its nodes, a release step,
a TrainJob or its template): each message names what is wrong and the fix, so the ``loopline`` command prints it as one
line."""


class OfflineTrainingError(Exception):
    """A training or release problem the user can fix; ``str(err)`` says what and how."""
