"""The ClientApp: xclp_flower.client_app; each SuperNode's --node-config names its site, data and output:
site=NAME data-path=FILE out=FOLDER [public-path=U.npz] [allow-plaintext=true] [allow-unmasked-training=true]
[max-epsilon=E]."""

from xclp_flower import client_app as _xclp

app = _xclp.app  # an assignment: `flwr run` looks for `app = …` in this file before it imports anything
