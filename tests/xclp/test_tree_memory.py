"""bench.tree_memory: the process tree's PSS includes what a child process holds (issue 23)."""

import subprocess
import sys

from bench.tree_memory import TreeMemory, descendants, pss

MB = 1 << 20


def test_the_tree_peak_counts_a_child_process_memory():
    # a child that touches 200 MB (bytes of 0x01: every page written, none shared) and waits
    child = subprocess.Popen([sys.executable, "-c", "import sys; b = b'\\x01' * (200 << 20); print('ready', flush=True); "
                              "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with TreeMemory(interval=0.05) as mem:
            assert child.pid in descendants(mem.root)
            own = pss(mem.root)
            mem.sample()
        assert mem.peak - own >= 150 * MB
        assert mem.peak_child >= 150 * MB
        assert mem.phase_peak() >= mem.peak - 50 * MB  # the per-step peak sees it too
    finally:
        child.stdin.close()
        child.wait(timeout=10)
