"""Errors raised by the secure protocols.

Every malformed, oversized, replayed or tampered input raises one of these with a message that
says what was wrong; a protocol never returns a wrong answer instead.
"""


class ProtocolError(ValueError):
    """A message or parameter that a protocol cannot accept (bad shape, size, range, version)."""


class IntegrityError(ProtocolError):
    """An authenticated message failed its check: tampered, replayed, reordered or misaddressed."""
