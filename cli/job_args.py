"""The flags made from an option table (xclp.job_options.JOB_OPTIONS, xclp.training.options.TRAINING_OPTIONS):
each flag's type, default, choices and help are the option's, and a value out of its bounds is refused by
argparse with the option's own sentence. Light imports only, so that building the `xclp` parser stays fast."""

from __future__ import annotations

import argparse

from xclp.job_options import OPTION
from xclp.options import Option


def typed(o: Option):
    """The option's check as an argparse type: one error line naming the option and its bounds."""
    def parse(text: str):
        try:
            return o.check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = o.type.__name__
    return parse


def add_option(p, o: Option, **override) -> None:
    """`o` as a flag of `p` (`override`: this command's default or help, where it differs)."""
    kw = {"default": o.default, "help": o.help} | override
    if o.type is bool:
        p.add_argument(o.flag, action=argparse.BooleanOptionalAction, **kw)
    else:
        p.add_argument(o.flag, type=typed(o), choices=o.choices, **kw)


def add_job_options(p, names: tuple[str, ...], **defaults) -> None:
    """The XCLP job parameters `names` (xclp.job_options) as flags of `p`; `defaults`: a command's own
    default of a parameter (a job between sites: xclp.job_options.SECURE_DEFAULTS)."""
    for name in names:
        add_option(p, OPTION[name], **({"default": defaults[name]} if name in defaults else {}))
