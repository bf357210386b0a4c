"""Every flag of every `xclp` subcommand has a help sentence, and its --help says the default."""

import argparse

import pytest

from cli.main import build_parser


def _parsers(parser: argparse.ArgumentParser, path: str = "xclp"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def _options(parser):
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        yield action


def _lacking(parser: argparse.ArgumentParser) -> list[str]:
    """The flags (and positional arguments) of one parser whose help is missing or says no default."""
    bad = []
    fmt = parser._get_formatter()
    for action in _options(parser):
        name = "/".join(action.option_strings) or action.dest
        text = (action.help or "").strip()
        if not text or action.help is argparse.SUPPRESS:
            bad.append(f"{name}: no help")
            continue
        shown = fmt._expand_help(action) if fmt._get_help_string(action) else ""
        if action.option_strings and not action.required and "default" not in shown.lower():
            bad.append(f"{name}: --help does not say its default")
    return bad


def test_every_flag_of_every_subcommand_has_help_and_shows_its_default():
    bad = [f"{path}: {what}" for path, p in _parsers(build_parser()) for what in _lacking(p)]
    assert not bad, "\n".join(bad)


def test_the_walk_sees_every_subcommand_and_catches_a_flag_without_help():
    paths = {path for path, _ in _parsers(build_parser())}
    assert {"xclp agent run", "xclp coordinator serve", "xclp job submit predict", "xclp simulate train",
            "xclp tls make-dev-ca"} <= paths
    parser = build_parser()
    agent = dict(_parsers(parser))["xclp agent run"]
    agent.add_argument("--planted", default=3)  # a fault: no help
    agent.add_argument("--planted-none", default=None, help="a flag that does not say what happens without it")
    assert _lacking(agent) == ["--planted: no help", "--planted-none: --help does not say its default"]


@pytest.mark.parametrize("flag, words", [
    ("--port", "8000"), ("--host", "127.0.0.1"),
])
def test_serve_help_shows_the_defaults(capsys, flag, words):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["coordinator", "serve", "--help"])
    out = capsys.readouterr().out
    line = " ".join(out.split())
    assert flag in line and f"(default: {words})" in line
