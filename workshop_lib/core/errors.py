"""Exceptions a user can cause. Each message says what was wrong and how to fix it."""


class WorkshopError(Exception):
    """Base class: the CLI prints the message (no traceback) and exits with status 2."""


class ClusterError(WorkshopError):
    """The scheduler or the local cluster could not do what was asked."""


class SubmitError(ClusterError):
    """sbatch (or the local executor) refused a script."""


class JobFailed(ClusterError):
    """A job ended in a state other than COMPLETED."""
