"""Bundles on the wire: a compressed member (a decompression bomb) is refused before it is unpacked."""

import io
import tracemalloc
import zipfile

import numpy as np
import pytest

from crypto.errors import ProtocolError
from xclp.training.messages import dump_state, load_state
from xclp.wire import dump_bundle, load_bundle


def bomb(n_bytes: int = 64 << 20) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, w=np.zeros(n_bytes // 4, dtype=np.float32))
    return buf.getvalue()


def test_a_compressed_bundle_is_refused_before_it_is_decompressed():
    body = bomb()
    assert len(body) < 1 << 20  # 64 MiB of zeros deflate to well under 1 MiB
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="compressed"):
            load_bundle(body, ("w",), max_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # nothing near the 64 MiB it would expand to


def test_model_uploads_refuse_bombs_and_accept_what_dump_bundle_writes():
    import torch

    template = {"w": torch.zeros(16, dtype=torch.float32)}
    state, meta = load_state(dump_state({"w": torch.ones(16)}, {"n": 3}), template)
    assert torch.equal(state["w"], torch.ones(16)) and meta == {"n": 3}
    with pytest.raises(ProtocolError, match="compressed"):
        load_state(bomb(1 << 16), template)


def test_members_declaring_more_than_the_body_are_refused():
    body = bytearray(dump_bundle({"a": np.arange(10)}))
    with zipfile.ZipFile(io.BytesIO(bytes(body))) as z:
        assert all(m.compress_type == zipfile.ZIP_STORED for m in z.infolist())
    assert np.array_equal(load_bundle(bytes(body), ("a",))["a"], np.arange(10))
    with pytest.raises(ProtocolError, match="not a valid bundle"):
        load_bundle(b"PK\x03\x04" + bytes(40), ("a",))
