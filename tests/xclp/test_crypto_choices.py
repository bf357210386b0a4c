"""Every place that takes a protocol name offers the same ones, from one list, and the secure entry points
(the demo, job submission, POST /jobs and /jobs/train) default to the lattice protocol; the simulations keep
plaintext, their named reference."""

import inspect

import pytest

from crypto.hamming_api import DEFAULT_SECURE, PROTOCOLS
from xclp.job_params import CRYPTO_CHOICES, JobParams, hamming_protocol

JOB = ["--coordinator", "http://x", "--sites", "a,b", "--classes", "10"]


def _crypto_action(parser, argv):
    """The --crypto (or --protocol) action of the subcommand that argv selects."""
    import argparse

    p = parser
    for word in argv:
        sub = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        p = sub.choices[word]
    return next(a for a in p._actions if a.dest in ("crypto", "protocol"))


def test_one_list_of_protocol_names():
    from xclp.training.options import CRYPTO_CHOICES as TRAIN_CHOICES

    assert DEFAULT_SECURE == "lattice" and "lattice" in PROTOCOLS
    assert set(PROTOCOLS) == {"plaintext", "lattice", "paillier", "paillier-naive", "ot", "masked"}
    assert CRYPTO_CHOICES == PROTOCOLS and TRAIN_CHOICES == PROTOCOLS


@pytest.mark.parametrize("argv", [["simulate", "predict"], ["simulate", "train"], ["bench", "hamming"],
                                  ["job", "submit", "predict"], ["job", "submit", "train"], ["demo"]])
def test_every_command_offers_every_protocol(argv):
    from cli.main import build_parser

    assert tuple(_crypto_action(build_parser(), argv).choices) == PROTOCOLS


def test_defaults():
    from cli.main import build_parser

    parse = build_parser().parse_args
    assert parse(["demo"]).crypto == "lattice"
    assert parse(["demo", "--train", "fedavg-xclp"]).crypto == "lattice"
    assert parse(["job", "submit", "predict", *JOB]).crypto == "lattice"
    assert parse(["job", "submit", "train", *JOB]).crypto == "lattice"
    assert parse(["simulate", "predict"]).crypto == "plaintext"
    assert parse(["simulate", "train"]).crypto == "plaintext"
    assert parse(["demo", "--crypto", "ot"]).crypto == "ot"
    assert parse(["job", "submit", "predict", *JOB, "--crypto", "paillier"]).crypto == "paillier"
    assert parse(["bench", "hamming", "--protocol", "lattice"]).protocol == "lattice"


def test_service_schemas_and_demo_default_to_lattice():
    import cli.demo as demo
    from service.jobs_api import JobCreate
    from service.training_api import TrainJobCreate

    assert JobCreate(sites=["a", "b"], classes=10).crypto == "lattice"
    assert TrainJobCreate(algorithm="fedavg-xclp", sites=["a", "b"], classes=10).crypto == "lattice"
    assert inspect.signature(demo.run_demo).parameters["crypto"].default == "lattice"
    assert inspect.signature(demo.run_train_demo).parameters["crypto"].default == "lattice"


def test_hamming_protocol_builds_lattice():
    from crypto.lattice_hamming import LatticeHamming

    proto = hamming_protocol(JobParams(job_id="j", n_classes=2, crypto="lattice"))
    assert isinstance(proto, LatticeHamming) and proto.name == "lattice"
    with pytest.raises(ValueError):
        JobParams(job_id="j", n_classes=2, crypto="lattise").validate()
