"""Hosts on a private test network, made of Linux network namespaces (root only).

    switch namespace:  bridge br0 ── one veth end per host (named after the host)
    host namespace:    eth0 (the veth's other end, ADDRESS/24) and lo

Nothing is configured in the root namespace: the test process reaches a host only by running a
process inside it (`Host.popen`, `ip netns exec`) or through a socket made inside it
(`netns_socket`, which netsim.proxy uses to forward a loopback port of the test into a host).
Cutting a host's link takes its switch-side veth end down: the host keeps its address and route and
its packets vanish (as with a pulled cable upstream), so connections hang instead of failing fast.

The addresses (default 10.203.0.0/24) exist only inside the namespaces made here; `Network.close`
deletes every namespace it made (their veth pairs go with them).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import re
import shutil
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path

CLONE_NEWNET = 0x40000000
_counter = itertools.count()


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (None if they can): not root, no `ip`, or the kernel
    refuses. Tries one namespace with a veth pair and deletes it."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    name = f"xnchk{os.getpid()}"
    try:
        r = ip("netns", "add", name, check=False)
        if r.returncode != 0:
            return f"`ip netns add` failed: {r.stderr.strip()}"
        r = ip("-n", name, "link", "add", "a0", "type", "veth", "peer", "name", "b0", check=False)
        if r.returncode != 0:
            return f"no veth pairs: {r.stderr.strip()}"
        return None
    finally:
        ip("netns", "del", name, check=False)


_TAG = re.compile(r"^xn(\d+)n\d+-")


def sweep_leftovers() -> list[str]:
    """Delete the namespaces this harness made in a process that is gone (killed before its close():
    the namespace names carry the maker's pid). Those of live processes, and any other, are left alone."""
    gone = []
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _TAG.match(name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            ip("netns", "del", name, check=False)
            gone.append(name)
    return gone


class Host:
    def __init__(self, net: Network, name: str, ns: str, address: str, port_name: str):
        self.net, self.name, self.ns, self.address, self.port_name = net, name, ns, address, port_name

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's namespace (`ip netns exec` execs in place: the pid is argv's)."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kw)

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), **kw)

    def link_down(self) -> None:
        ip("-n", self.net.switch, "link", "set", self.port_name, "down")

    def link_up(self) -> None:
        ip("-n", self.net.switch, "link", "set", self.port_name, "up")

    def socket(self, family=socket.AF_INET, type=socket.SOCK_STREAM) -> socket.socket:
        return netns_socket(self.ns, family, type)


class Network:
    """A switch and hosts on `subnet`.0/24 (host i gets .i+1). Use as a context manager, or call close()."""

    def __init__(self, subnet: str = "10.203.0"):
        self.subnet = subnet
        sweep_leftovers()
        self.tag = f"xn{os.getpid()}n{next(_counter)}"
        self.switch = f"{self.tag}-sw"
        self.hosts: dict[str, Host] = {}
        self._made: list[str] = []
        try:
            self._netns(self.switch)
            ip("-n", self.switch, "link", "set", "lo", "up")
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise

    def _netns(self, name: str) -> None:
        ip("netns", "add", name)
        self._made.append(name)

    def add_host(self, name: str) -> Host:
        i = len(self.hosts) + 1
        ns, port = f"{self.tag}-{name}", f"p{i}"
        address = f"{self.subnet}.{i}"
        self._netns(ns)
        ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("-n", self.switch, "link", "set", port, "master", "br0")
        ip("-n", self.switch, "link", "set", port, "up")
        ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        self.hosts[name] = host = Host(self, name, ns, address, port)
        return host

    def close(self) -> None:
        for ns in reversed(self._made):
            ip("netns", "del", ns, check=False)
        self._made.clear()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_libc = None


def _setns(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def in_netns(ns: str):
    """This thread inside network namespace `ns` for the block (sockets made there stay there)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(Path("/var/run/netns") / ns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def netns_socket(ns: str, family=socket.AF_INET, type=socket.SOCK_STREAM) -> socket.socket:
    with in_netns(ns):
        return socket.socket(family, type)
