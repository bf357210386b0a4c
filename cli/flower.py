"""`xclp flower run` and `xclp flower wait`: a Flower run's outcome as the exit status.

Flower 1.41's `flwr run` exits 0 as soon as the SuperLink has accepted the run (flwr/cli/run/run.py
returns after StartRun), so a script cannot tell a failed run from a good one by it. These commands
submit through Flower's own CLI (`flwr run … --format json`, for the run id) and follow the run with
`flwr ls CONNECTION --run-id ID --format json` — Flower's public commands only — until its status is
`finished:…`: exit 0 when it completed, 1 with its reason when it failed or was stopped, 2 when Flower
cannot be asked (not installed, an unknown connection, a SuperLink that cannot be reached, output
that is not Flower's JSON), 3 when --timeout ran out. Ctrl-C stops the following, not the run.

`flwr` with --format json exits 0 even on its own errors; it prints {"success": false,
"error-message": …} instead, which is what `_flwr` turns into one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

FINISHED = "finished"


class FlowerError(Exception):
    """Flower could not be asked, or answered something else than a run's status: exit 2."""


def flwr_binary() -> str:
    """The `flwr` script beside this interpreter (the virtualenv's, activated or not), else on PATH."""
    if importlib.util.find_spec("flwr") is not None:
        here = Path(sys.executable).parent / "flwr"
        found = str(here) if here.exists() else shutil.which("flwr")
        if found:
            return found
    raise FlowerError("Flower is not installed (it is the optional extra: pip install -e '.[flower]')")


def parse_reply(stdout: str, what: str) -> dict:
    """The JSON object `flwr … --format json` printed; its error message as a FlowerError."""
    start = stdout.find("{")  # (anything Flower printed before the object is not part of it)
    try:
        reply = json.loads(stdout[start:]) if start >= 0 else None
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        last = (stdout.strip().splitlines() or ["nothing"])[-1]
        raise FlowerError(f"{what}: not Flower's JSON reply: {last[:200]}")
    if reply.get("success") is not True:
        # Flower's message is several lines ("Using SuperLink: …", blank, the error): its last line says it
        lines = [ln.strip() for ln in str(reply.get("error-message", "")).splitlines() if ln.strip()]
        raise FlowerError(f"{what}: {lines[-1] if lines else 'failed, without a message'}")
    return reply


def run_status(reply: dict, run_id: str) -> tuple[str, str]:
    """(status, details) of run `run_id` in a `flwr ls --run-id` reply; status is e.g. "running",
    "finished:failed"."""
    runs = reply.get("runs")
    if not isinstance(runs, list):
        raise FlowerError(f"flwr ls: no list of runs in its reply: {json.dumps(reply)[:200]}")
    for row in runs:
        if isinstance(row, dict) and str(row.get("run-id")) == str(run_id):
            return str(row.get("status", "")), " ".join(str(row.get("status-details") or "").split())
    raise FlowerError(f"flwr ls: the SuperLink has no run {run_id}")


def outcome(status: str, details: str, run_id: str) -> tuple[int, str] | None:
    """The exit status and final line of a finished run; None while it is not finished."""
    if not status.startswith(FINISHED):
        return None
    if status == f"{FINISHED}:completed":
        return 0, f"run {run_id}: {status}"
    return 1, f"xclp: run {run_id} {status}: {details or 'Flower gave no reason'}"


def _flwr(flwr: str, argv: list[str], what: str, timeout: float = 300) -> dict:
    try:
        r = subprocess.run([flwr, *argv, "--format", "json"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FlowerError(f"{what}: no answer in {timeout:.0f} s") from None
    return parse_reply(r.stdout, what)


def follow(flwr: str, run_id: str, connection: str, timeout: float | None, poll: float) -> int:
    """Ask the SuperLink for the run's status every `poll` s until it is finished; a line on stderr
    at each change of status."""
    start = time.monotonic()
    last = None
    while True:
        status, details = run_status(_flwr(flwr, ["ls", connection, "--run-id", run_id], "flwr ls"), run_id)
        if status != last:
            print(f"xclp: run {run_id}: {status} ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
            last = status
        done = outcome(status, details, run_id)
        if done is not None:
            code, line = done
            print(line, file=sys.stdout if code == 0 else sys.stderr)
            return code
        if timeout is not None and time.monotonic() - start > timeout:
            print(f"xclp: run {run_id} still {status} after {timeout:g} s (it goes on at the SuperLink)",
                  file=sys.stderr)
            return 3
        time.sleep(poll)


def _following(flwr: str, run_id: str, args) -> int:
    try:
        return follow(flwr, run_id, args.connection, args.timeout, args.poll)
    except KeyboardInterrupt:  # the run is the SuperLink's: only our following stops
        print(f"xclp: stopped following run {run_id}; it goes on at the SuperLink (follow it again: xclp flower "
              f"wait {run_id} {args.connection}; stop it: flwr stop {run_id} {args.connection})", file=sys.stderr)
        return 130


def cmd_flower_run(args) -> int:
    try:
        flwr = flwr_binary()
        argv = ["run", str(args.app), args.connection]
        for cfg in args.run_config or []:
            argv += ["--run-config", cfg]
        run_id = _flwr(flwr, argv, "flwr run").get("run-id")
        if not run_id:
            raise FlowerError("flwr run: its reply names no run id")
        print(f"xclp: run {run_id} submitted to {args.connection}", file=sys.stderr, flush=True)
        return _following(flwr, str(run_id), args)
    except FlowerError as exc:
        print(f"xclp: {exc}", file=sys.stderr)
        return 2


def cmd_flower_wait(args) -> int:
    try:
        return _following(flwr_binary(), args.run_id, args)
    except FlowerError as exc:
        print(f"xclp: {exc}", file=sys.stderr)
        return 2


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds > 0")
    return value


def add_flower_parser(sub) -> None:
    fl = sub.add_parser("flower", help="Flower runs whose exit status says how they ended (flwr run exits 0 "
                        "once a run is accepted)").add_subparsers(dest="what", required=True)
    conn_help = "the SuperLink connection's name in $FLWR_HOME/config.toml, as `flwr run` takes it"

    def follow_args(p):
        p.add_argument("--timeout", type=_positive, default=None,
                       help="stop following after this many seconds, exit 3 (default: follow until it finishes)")
        p.add_argument("--poll", type=_positive, default=5.0,
                       help="seconds between two `flwr ls` of the run's status (default 5)")

    fr = fl.add_parser("run", help="`flwr run` an app, then follow the run: exit 0 if it completed, 1 with its "
                       "reason if it failed or was stopped, 2 if Flower cannot be asked")
    fr.add_argument("app", help="the Flower app's folder (e.g. examples/flower-xclp), as `flwr run` takes it")
    fr.add_argument("connection", help=conn_help)
    fr.add_argument("--run-config", "-c", action="append", metavar="KEY=VALUE …",
                    help="passed on to `flwr run --run-config` (repeatable; default: the app's pyproject.toml)")
    follow_args(fr)
    fr.set_defaults(func=cmd_flower_run)
    fw = fl.add_parser("wait", help="follow a run already submitted (e.g. after Ctrl-C): the same exit status "
                       "as `xclp flower run`")
    fw.add_argument("run_id", help="the run's id, as `flwr run` or `xclp flower run` printed it")
    fw.add_argument("connection", help=conn_help)
    follow_args(fw)
    fw.set_defaults(func=cmd_flower_wait)
