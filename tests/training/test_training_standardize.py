"""Training runs' XCLP jobs: federated standardisation on by default, off on request (service, CLI)."""


def test_training_runs_standardise_their_xclp_jobs_by_default_and_can_keep_raw_features():
    from cli.main import build_parser
    from service.training_api import TrainJobCreate, training_params
    from xclp.training.algorithms import STRATEGIES

    def child(body: dict) -> bool:
        params = training_params(TrainJobCreate(sites=["a", "b"], classes=10, **body), "job")
        kind = STRATEGIES[params["algorithm"]]
        s = kind.from_config(params["config"], 10, 2, n_features=4, n_public=10)
        return s.xclp_params("job-r1").standardize

    assert child({"algorithm": "fedavg-xclp"}) is True
    assert child({"algorithm": "fedavg-xclp", "standardize": False}) is False
    public = {"public_sha256": "0" * 64, "public_size": 10}
    assert child({"algorithm": "fedct-xclp", **public}) is True
    assert child({"algorithm": "fedct-xclp", "standardize": False, **public}) is False
    parse = build_parser().parse_args
    assert parse(["simulate", "train"]).standardize is True
    assert parse(["simulate", "train", "--no-standardize"]).standardize is False
    assert parse(["job", "submit", "train", "--coordinator", "http://127.0.0.1:1", "--sites", "a,b", "--classes", "10",
                  "--no-standardize"]).standardize is False
