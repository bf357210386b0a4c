"""The memory of a process tree (issue 23): a background thread that sums the PSS of a process and
all its descendants every `interval` seconds and keeps the peaks.

Why PSS (proportional set size, /proc/PID/smaps_rollup "Pss:") and not RSS: a forked pool worker
shares its parent's pages copy-on-write until one side writes them. RSS counts such a page in full in
every process that maps it, so the sum of the RSS of a parent and two forked workers counts the
parent's inherited data three times (at 10^6 points: ~1.9 GB RSS per worker, most of it the
parent's). PSS divides each page by the number of processes that map it, so the tree's sum counts a
shared page once — what the machine actually holds for the job. (ru_maxrss of RUSAGE_CHILDREN is the
largest RSS any ended child reached, inherited pages included: neither the workers' own memory nor
the machine's.) Sampling misses a peak shorter than the interval; the bench's steps hold their arrays
for seconds."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def pss(pid: int) -> int:
    """Bytes of PSS of the process `pid` (0 if it has ended or cannot be read)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def descendants(root: int) -> list[int]:
    """The pids of every process below `root` (children, their children, ...), from /proc/*/stat."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
            parent[int(d)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class TreeMemory:
    """Samples the PSS of `root` (default: this process) and its descendants in a daemon thread.
    `peak`: the largest sum seen; `peak_child`: the largest single descendant's PSS;
    `phase_peak()`: the largest sum since its last call (the bench's per-step peaks)."""

    def __init__(self, root: int | None = None, interval: float = 0.5):
        self.root = os.getpid() if root is None else root
        self.interval = interval
        self.peak = self.peak_child = self._phase = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tree-memory")

    def sample(self) -> int:
        kids = [pss(c) for c in descendants(self.root)]
        total = pss(self.root) + sum(kids)
        with self._lock:
            self.peak = max(self.peak, total)
            self.peak_child = max([self.peak_child] + kids)
            self._phase = max(self._phase, total)
        return total

    def phase_peak(self) -> int:
        self.sample()  # the step's end counts too
        with self._lock:
            p, self._phase = self._phase, 0
        return p

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> TreeMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
