"""The ServerApp: xclp_flower.server_app (installed with the project's [flower] extra)."""

from xclp_flower import server_app as _xclp

app = _xclp.app  # an assignment: `flwr run` looks for `app = …` in this file before it imports anything
