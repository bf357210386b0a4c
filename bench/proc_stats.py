"""What the load and soak benchmarks (bench.fifty_agents, bench.soak) and the soak test
(tests/network/test_soak.py) read of a running coordinator and its agents: a process tree's resident
memory, open files, CPU seconds and TCP connections (Linux /proc), and whether an agent's folders
hold only what is meant to outlast its jobs. One place, so that the short test and the long
benchmark check the same invariants."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench.tree_memory import descendants

# What an agent keeps for good: its identity, its privacy ledger (and that file's lock).
LONG_LIVED = {"identity.key", "privacy-ledger.json", "privacy-ledger.json.lock"}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """The process and its descendants (the coordinator's executor runs server steps in child processes)."""
    return [pid, *descendants(pid)]


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration, ValueError):
        return 0


def rss_kib(pid: int) -> int:
    """The resident memory of the process and its descendants, KiB."""
    return sum(_status_kib(p, "VmRSS") for p in tree(pid))


def peak_rss_kib(pid: int) -> int:
    """The process's own peak resident memory (VmHWM), KiB."""
    return _status_kib(pid, "VmHWM")


def open_files(pid: int) -> int:
    total = 0
    for p in tree(pid):
        try:
            total += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            pass
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the process and its live descendants, plus what its ended children
    spent (cutime, cstime: counted once a child is waited for)."""
    total = 0
    for p in tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += sum(int(x) for x in fields[11:15]) if p == pid else sum(int(x) for x in fields[11:13])
    return total / CLOCK_TICKS


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    for p in tree(pid):
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                try:
                    link = os.readlink(f"/proc/{p}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    out.add(link[8:-1])
        except OSError:
            pass
    return out


def tcp_connections(pid: int, listen_port: int, db_port: int | None = 5432) -> dict:
    """The process tree's established TCP connections: those that reached its listening port (the
    agents', the operator's) and those it holds to the database port."""
    mine = _socket_inodes(pid)
    clients = db = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "01" or f[9] not in mine:  # 01: ESTABLISHED
                continue
            local, remote = int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16)
            clients += local == listen_port
            db += db_port is not None and remote == db_port
    return {"clients": clients, "database": db}


def agent_folder_problems(out: Path, jobs: list[str]) -> list[str]:
    """What an agent's --out folder holds beyond its jobs' results, its state records (keys wiped) and
    what it keeps for good (LONG_LIVED): an empty list when clean."""
    problems = []
    expect = {".agent.lock", ".agent-state"} | {f"{j}{ext}" for j in jobs for ext in (".npz", ".csv")}
    got = {p.name for p in out.iterdir()}
    if got != expect:
        problems.append(f"{out}: extra {sorted(got - expect)}, missing {sorted(expect - got)}")
    state = out / ".agent-state"
    want = LONG_LIVED | {f"{j}.json" for j in jobs}
    got = {p.name for p in state.iterdir()} if state.is_dir() else set()
    if got != want:
        problems.append(f"{state}: extra {sorted(got - want)}, missing {sorted(want - got)}")
    for j in jobs:
        try:
            record = json.loads((state / f"{j}.json").read_text())
        except (OSError, ValueError):
            continue  # (named above)
        if record.get("key") is not None or record.get("noise") is not None:
            problems.append(f"{state / (j + '.json')}: key or noise not wiped ({sorted(record)})")
    return problems


def tree_bytes(path: Path) -> int:
    """Bytes of every file under `path` (0 if it does not exist)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys against xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0
