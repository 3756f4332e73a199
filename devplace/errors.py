"""User-facing errors.

Every error devplace raises on purpose is a ``DevplaceError``: the command line prints its message as
one line and exits non-zero, so each message must name the op, device or field at fault and say what
would fix it.
"""


class DevplaceError(Exception):
    """Base class: a problem with the user's input or request, not a bug in devplace."""


class GraphError(DevplaceError):
    """An operator graph is malformed (cycle, missing op, bad figure)."""


class ClusterError(DevplaceError):
    """A cluster description is malformed or does not fit the graph."""


class PlacementError(DevplaceError):
    """A placement does not match its graph or cluster, or no placement could be found."""


class OutOfMemoryError(PlacementError):
    """No placement fits the devices' memory."""


class CaptureError(DevplaceError):
    """A model, its inputs or its loss cannot be captured as a training-step graph."""
