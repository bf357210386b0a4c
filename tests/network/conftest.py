import os

import pytest


@pytest.fixture(scope="session")
def netns_ok():
    """Network namespaces can be made here; else the test is skipped with the reason — or fails where
    XCLP_REQUIRE_NETNS is set (CI runs as root and sets it: these tests must run there)."""
    from netsim.hosts import unavailable

    why = unavailable()
    if why is not None:
        if os.environ.get("XCLP_REQUIRE_NETNS"):
            pytest.fail(f"XCLP_REQUIRE_NETNS is set but {why}")
        pytest.skip(f"needs network namespaces: {why}")


@pytest.fixture
def network(netns_ok):
    from netsim.hosts import Network

    net = Network()
    try:
        yield net
    finally:
        net.close()
