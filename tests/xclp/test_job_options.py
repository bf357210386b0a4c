"""An XCLP job's parameters are defined once (xclp.job_options.JOB_OPTIONS): JobParams' fields, the
command line's flags (`simulate predict`, `job submit predict`, `job submit train`), the REST requests'
fields and Flower's run config keys all carry each of them with the table's default, and a value out
of its bounds is refused alike by every driver — the simulation and Flower included."""

import dataclasses

import pytest
from pydantic import ValidationError

from cli.main import build_parser
from service.jobs_api import JobCreate
from service.training_api import TrainJobCreate
from xclp.job_options import JOB_OPTIONS, OPTION, SECURE_DEFAULTS, TRAIN_JOB_OPTIONS
from xclp.job_params import JobParams

SUBMIT = ["--sites", "a,b", "--classes", "10", "--coordinator", "https://c"]


def _flags(argv):
    return vars(build_parser().parse_args(argv))


def test_every_option_is_a_field_a_flag_a_request_field_and_a_run_config_key_with_one_default():
    params = {f.name: f.default for f in dataclasses.fields(JobParams)}
    sim = _flags(["simulate", "predict"])
    job = _flags(["job", "submit", "predict", *SUBMIT])
    train = _flags(["job", "submit", "train", *SUBMIT])
    for o in JOB_OPTIONS:
        between_sites = SECURE_DEFAULTS.get(o.name, o.default)  # a job between sites: a secure protocol
        assert params[o.name] == o.default and sim[o.name] == o.default, o.name
        assert job[o.name] == between_sites and JobCreate.model_fields[o.name].default == between_sites, o.name
    for name in TRAIN_JOB_OPTIONS:
        want = SECURE_DEFAULTS.get(name, OPTION[name].default)
        assert train[name] == want and TrainJobCreate.model_fields[name].default == want, name


@pytest.mark.parametrize("name,bad", [("k", 10_001), ("k", 0), ("power", 65.0), ("key_bits", 512), ("graph", "fast")])
def test_a_value_out_of_bounds_is_refused_by_every_driver(name, bad, capsys):
    o = OPTION[name]
    with pytest.raises(ValueError, match=o.key):  # the simulation, the agents, the estimators: JobParams
        JobParams(job_id="j", n_classes=2, **{name: bad}).validate()
    with pytest.raises(ValidationError, match=name):  # the REST request
        JobCreate(sites=["a", "b"], classes=2, **{name: bad})
    with pytest.raises(SystemExit):  # the command line: one line naming the option
        _flags(["job", "submit", "predict", *SUBMIT, o.flag, str(bad)])
    assert o.key in capsys.readouterr().err
    server = pytest.importorskip("xclp_flower.server_app", reason="Flower is the optional extra")
    with pytest.raises(ValueError, match=o.key):
        server.params_from({"classes": 2, o.key: bad}, 1)
