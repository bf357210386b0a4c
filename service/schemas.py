"""What the coordinator's API takes and answers, apart from the database models (service.db): the
one error body, the error responses each route documents, and the constrained types the request
models share (service.app, service.training_api), and a request field made from an option table's
entry (`option_field`: xclp.job_options, xclp.training.options). The OpenAPI document is generated from these, and
tests/service/test_openapi.py runs schemathesis against it: what it says must be what the API does."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from xclp.options import Option


class Error(BaseModel):
    """Every error of the API, 4xx and 5xx alike, request validation included: what went wrong, in words."""

    detail: str


_ERROR_MEANING = {
    401: "no bearer token, or one that names no site",
    403: "the caller may not do this (the admin token is needed, or the site is not in the job)",
    404: "no such job, site, message or model (yet)",
    409: "not now: the job is in another phase, attempt or round, has ended, or the upload differs from "
         "the one already stored",
    400: "the body is not valid JSON",
    413: "the body exceeds the limit of its topic or of its route (service.guard)",
    422: "malformed: the request does not fit the schema, or its values do not fit together or the job",
    429: "too many wrong bearer tokens from this address lately: try again after Retry-After seconds",
}


def errors(*codes: int) -> dict:
    """The `responses` of a route: the errors it may answer, all with the one Error body; a route that
    takes a token (401) may also answer 429 (service.guard's throttle of wrong tokens)."""
    if 401 in codes and 429 not in codes:
        codes = (*codes, 429)
    return {c: {"model": Error, "description": _ERROR_MEANING[c]} for c in codes}


SiteName = Annotated[str, Field(pattern=r"^(?!(coordinator|admin)$)[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", max_length=64,
                                description="letters, digits, '_', '.', '-'; at most 64; not 'coordinator' or 'admin'")]
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class Request(BaseModel):
    """A request body: fields outside the schema are refused (a misspelt option is an error, not a
    silently ignored default)."""

    model_config = ConfigDict(extra="forbid", regex_engine="python-re")  # (SiteName's pattern looks ahead)


def option_field(o: Option, defaults: dict | None = None):
    """An option (xclp.options.Option) as a request field: its type, default, bounds and sentence
    (`defaults`: this request's own default of an option, by name, where it differs: SECURE_DEFAULTS)."""
    ann = o.type if o.choices is None else Literal[o.choices]
    if o.default is None:
        ann = ann | None
    kw = {b: getattr(o, b) for b in ("ge", "gt", "le", "lt") if getattr(o, b) is not None}
    if o.type is float:
        kw["allow_inf_nan"] = False
    if o.type is bool:
        kw["strict"] = True  # true or false, never "yes" or 1
    kw = {"default": (defaults or {}).get(o.name, o.default), "description": o.help} | kw
    return ann, Field(**kw)
