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


# The flags that shape a job, in the words every command that takes them uses.
CRYPTO_HELP = ("secure protocol for the Hamming distances and row sums: lattice (Ring-LWE, the fastest secure one), "
               "paillier, paillier-naive or ot; plaintext has no security (a reference: agents refuse it unless "
               "started with --allow-plaintext)")
BITS_HELP = ("LSH length L, bits per point's hash: longer estimates the cosine similarity more closely and costs "
             "linearly more in the secure Hamming phase (256 for a quick try, 1024 usual, 2048+ for many features)")
K_HELP = ("neighbours per point in the kNN graph: 5–20 is usual; more smooths over noisy points and helps with "
          "few labels, fewer keeps small classes apart")
ALPHA_HELP = ("propagation α in (0, 1), the weight of the graph against the given labels: near 1 (0.99) spreads "
              "labels far, which suits few labels; 0.5–0.9 trusts the given labels more")
KEY_BITS_HELP = ("Paillier modulus size in bits, used only with --crypto paillier or paillier-naive "
                 "(2048 or more; agents refuse keys below their --min-key-bits)")
CLASSES_HELP = ("number of classes C of the job: every site's labels must be 0..C−1 (a site with a label outside "
                "refuses the job and says so); required, there is no default")
