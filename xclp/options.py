"""An option table's entry (`Option`): each of a job's parameters defined once, with its type, default,
bounds and sentence, from which the command line's flags, the REST request's fields, Flower's run
config keys and the validation are made. The tables: `xclp.job_options.JOB_OPTIONS` (an XCLP job's
parameters) and `xclp.training.options.TRAINING_OPTIONS` (a training run's). Light: no numpy."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    """One option, defined once: the command line's flag (`flag`), a job request's field (`name`),
    Flower's run config key (`key`) and the core's parameter (`name`) are made from it, with its
    default, bounds and sentence."""

    name: str
    type: type
    default: object  # None: the algorithm's own default (said in `help`)
    help: str
    choices: tuple | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        return self.name.replace("_", "-")

    def check(self, value):
        """`value` as this option's type, within its bounds (ValueError naming the option otherwise)."""
        if value is None:
            return None
        try:
            v = self.type(value)
        except (TypeError, ValueError):
            raise ValueError(f"{self.key}: {value!r} is not a {self.type.__name__}") from None
        if self.type is float and v != v:
            raise ValueError(f"{self.key}: not a number")
        bad = ((self.choices is not None and v not in self.choices) or (self.ge is not None and v < self.ge)
               or (self.gt is not None and v <= self.gt) or (self.le is not None and v > self.le)
               or (self.lt is not None and v >= self.lt))
        if bad and self.choices is not None:
            raise ValueError(f"{self.key} must be {self.bounds()}, got {v!r}")
        if bad:
            raise ValueError(f"{self.key}: {v!r} is out of range ({self.bounds()})")
        return v

    def bounds(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices))
        parts = [f"{op} {x:g}" for op, x in (("≥", self.ge), (">", self.gt), ("≤", self.le), ("<", self.lt))
                 if x is not None]
        return " and ".join(parts) or "any"
