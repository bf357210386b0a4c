"""How `xclp … --help` shows every flag: its one-sentence help and its default.

`Parser` is the `xclp` parser's class; its subcommands' parsers inherit it (argparse makes a
subparser of the parent's class), so every `--help` uses `DefaultsFormatter`: a help that does not
say its default already gets " (default: X)" appended — "off" for a switch — and a flag whose default
is None must say in its own words what happens without it (tests/cli/test_help.py checks both).
"""

from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.HelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or "default" in text.lower() or action.required
                or action.default is None or action.default is argparse.SUPPRESS):
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):  # noqa: SLF001
            return f"{text} (default: {'on' if action.default else 'off'})"
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)


# The flags that shape a job: xclp.job_options (each option's sentence); the class count, which has no default:
CLASSES_HELP = ("number of classes C of the job: every site's labels must be 0..C−1 (a site with a label outside "
                "refuses the job and says so); required, there is no default")
