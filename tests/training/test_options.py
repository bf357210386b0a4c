"""The training options are defined once (xclp.training.options.TRAINING_OPTIONS): the command line's
flags (`simulate train`, `job submit train`), the training job request's fields, Flower's run config
keys and the simulation's config all carry each of them, with its default and its bounds."""

import dataclasses

import pytest
from pydantic import ValidationError

from cli.main import build_parser
from service.training_api import TrainJobCreate
from xclp.training.options import TRAINING_OPTIONS
from xclp.training.runner import TrainConfig


def _flags(argv):
    p = build_parser()
    return vars(p.parse_args(argv))


def test_every_option_is_a_flag_a_request_field_a_run_config_key_and_a_config_field_with_one_default():
    sim = _flags(["simulate", "train"])
    job = _flags(["job", "submit", "train", "--sites", "a,b", "--classes", "10", "--coordinator", "https://c"])
    fields = TrainJobCreate.model_fields
    config = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for o in TRAINING_OPTIONS:
        assert sim[o.name] == o.default and job[o.name] == o.default, o.name
        assert o.name in fields and fields[o.name].default == o.default, o.name
        assert o.name in config and config[o.name] == o.default, o.name


def test_an_option_out_of_its_bounds_is_refused_alike_everywhere(capsys):
    for argv in (["simulate", "train", "--quorum", "2"], ["job", "submit", "train", "--sites", "a,b", "--classes", "10", "--coordinator", "https://c",
                                                           "--quorum", "2"]):
        with pytest.raises(SystemExit):
            _flags(argv)
        assert "quorum: 2.0 is out of range (≥ 0 and ≤ 1)" in capsys.readouterr().err
    with pytest.raises(ValidationError, match="quorum"):
        TrainJobCreate(algorithm="fedct", sites=["a", "b"], quorum=2)
    with pytest.raises(ValueError, match="quorum: 2.0 is out of range"):
        next(o for o in TRAINING_OPTIONS if o.name == "quorum").check("2")


def test_flowers_run_config_takes_every_option():
    server = pytest.importorskip("xclp_flower.server_app", reason="Flower is the optional extra")
    for o in TRAINING_OPTIONS:
        assert o.key in server.TRAIN_KEYS
    with pytest.raises(ValueError, match="tie"):
        server.TRAIN_KEYS["tie"]("sometimes")
