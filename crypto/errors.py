"""Errors raised by the secure protocols.

Every malformed, oversized, replayed or tampered input raises one of these with a message that
says what was wrong; a protocol never returns a wrong answer instead.
"""


class ProtocolError(ValueError):
    """A message or parameter that a protocol cannot accept (bad shape, size, range, version)."""


class IntegrityError(ProtocolError):
    """An authenticated message failed its check: tampered, replayed, reordered or misaddressed."""


class ViewRefused(ProtocolError):
    """A round's view that asks a site to reveal more than the computation can need, or to reveal an
    entry again (xclp.view_bounds): the site refuses it, with this reason."""
