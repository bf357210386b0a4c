"""The commands' log handler writes to sys.stderr as it is at each record (cli.logs.StderrHandler): a
handler bound to the stderr of its setup — a test's captured stream, closed when that test ended — made a
later record (another thread's, another command's) print a "--- Logging error ---" traceback instead."""

import io
import logging
import sys

from cli.logs import setup_logging


def test_a_record_goes_to_the_stderr_of_its_moment_after_the_old_one_is_closed(monkeypatch):
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    setup_logging("INFO")
    first.close()  # the stream the handler was made under is gone
    now = io.StringIO()
    monkeypatch.setattr(sys, "stderr", now)
    logging.getLogger("xclp.test").info("after the first stream closed")
    out = now.getvalue()
    assert "after the first stream closed" in out and "Logging error" not in out, out
