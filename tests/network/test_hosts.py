"""netsim.hosts: hosts in namespaces reach each other over the switch, a cut link silences a host,
the test reaches a host through a socket made in its namespace, and nothing is left behind."""

import os
import subprocess
import sys
import time

import pytest


def _listener(host, port):
    code = ("import socket,sys\ns=socket.create_server((sys.argv[1], int(sys.argv[2])))\nprint('up', flush=True)\n"
            "while True:\n c,_=s.accept()\n c.sendall(c.recv(100).upper())\n c.close()\n")
    p = host.popen([sys.executable, "-c", code, host.address, str(port)], stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"up\n"
    return p


def _ask(host, address, port, timeout=5.0):
    with host.socket() as s:
        s.settimeout(timeout)
        s.connect((address, port))
        s.sendall(b"ping")
        return s.recv(100)


def test_hosts_talk_over_the_switch_and_a_cut_link_silences_one(network):
    a, b = network.add_host("a"), network.add_host("b")
    assert (a.address, b.address) == ("10.203.0.1", "10.203.0.2")
    server = _listener(a, 7000)
    try:
        assert _ask(b, a.address, 7000) == b"PING"
        a.link_down()
        t = time.monotonic()
        with pytest.raises(OSError):  # packets vanish: the connect times out, it is not refused
            _ask(b, a.address, 7000, timeout=1.0)
        assert time.monotonic() - t >= 0.9
        a.link_up()
        end = time.monotonic() + 20
        while True:
            try:
                assert _ask(b, a.address, 7000) == b"PING"
                break
            except OSError:
                assert time.monotonic() < end
                time.sleep(0.2)
    finally:
        server.kill()
        server.wait()


def test_close_deletes_every_namespace(netns_ok):
    from netsim.hosts import Network, ip

    net = Network()
    net.add_host("x")
    tag = net.tag
    assert tag in ip("netns", "list").stdout
    net.close()
    assert tag not in ip("netns", "list").stdout


def test_namespaces_left_by_a_killed_run_are_swept(netns_ok):
    from netsim.hosts import ip, sweep_leftovers

    dead = next(p for p in range(4_000_000, 4_100_000) if not os.path.exists(f"/proc/{p}"))
    name, live = f"xn{dead}n0-sw", f"xn{os.getpid()}n999-sw"
    for n in (name, live):
        ip("netns", "add", n)
    try:
        assert name in sweep_leftovers()
        listed = ip("netns", "list").stdout
        assert name not in listed and live in listed  # a live process's namespaces stay
    finally:
        for n in (name, live):
            ip("netns", "del", n, check=False)
