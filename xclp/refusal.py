"""The refusal format, for every kind of job: a site's word that it will not, or cannot, go on (`REFUSE`,
any phase) and the coordinator's word to a site it left out by the job's rules (`LEFT_OUT`), each a
JSON reason of bounded length for the operator, with no data of the site in it."""

from __future__ import annotations

import json

from crypto.errors import ProtocolError

REFUSE = "refuse"  # a site's word that it will not, or cannot, go on with a job: any phase, any kind of job
LEFT_OUT = "left-out"  # the coordinator's word to a site it left out of a job by the job's rules, and why
MAX_REASON_CHARS = 2000
MAX_REFUSAL_BODY = 4 * MAX_REASON_CHARS + 64  # the JSON of a reason of MAX_REASON_CHARS characters, each escaped


def refusal(reason: str) -> bytes:
    """A site's refusal: the reason, as a sentence, for the operator (no data of the site in it)."""
    return json.dumps({"reason": str(reason)[:MAX_REASON_CHARS]}).encode()


def read_refusal(body: bytes) -> str:
    try:
        reason = json.loads(body.decode()).get("reason")
    except (UnicodeDecodeError, ValueError, AttributeError):
        raise ProtocolError("a refusal is JSON {\"reason\": \"…\"}") from None
    if not isinstance(reason, str) or not reason or len(reason) > MAX_REASON_CHARS:
        raise ProtocolError(f"a refusal's reason is a sentence of 1 to {MAX_REASON_CHARS} characters")
    return reason
