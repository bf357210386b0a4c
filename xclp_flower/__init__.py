"""XCLP inside a Flower deployment (the optional extra `.[flower]`): a ServerApp and a ClientApp on
Flower's Message API that run the same protocol core (xclp.protocol) as the coordinator and the
simulation. See xclp_flower/client_app.py for how a site keeps its state between messages."""
