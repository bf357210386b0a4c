"""XCLP inside a Flower deployment (the optional extra `.[flower]`): a ServerApp and a ClientApp on
Flower's Message API that run the same protocol core (xclp.protocol) as the coordinator and the
simulation. See xclp_flower/client_app.py for how a site keeps its state between messages."""


def flag(value, what: str) -> bool:
    """A yes/no setting of a node or run config (TOML booleans, or the strings Flower's CLI passes):
    true/false, yes/no, 1/0; anything else is an error, never a silent False."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no", ""):
        return False
    raise ValueError(f"{what}={value!r}: give true or false")
