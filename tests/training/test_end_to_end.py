"""Short runs on digits: XCLP pseudo-labels beat the labelled-only baselines; fixed seeds repeat."""

import pytest

from xclp.training.runner import TrainConfig, run_training

FEDAVG = dict(dataset="digits", labels=30, rounds=3, local_epochs=1, seed=0, train_size=800, bits=512, quiet=True)
FEDCT = dict(dataset="digits", labels=30, rounds=2, model="tree", tie="random", seed=0, public_size=200, train_size=800, bits=512,
             quiet=True)


@pytest.fixture(scope="module")
def runs():
    return {alg: run_training(TrainConfig(algorithm=alg, **(FEDAVG if alg.startswith("fedavg") else FEDCT)))
            for alg in ("fedavg", "fedavg-xclp", "fedct", "fedct-xclp")}


def test_result_shape(runs):
    r = runs["fedavg-xclp"]
    assert set(r) >= {"algorithm", "final_accuracy", "history", "communication_bytes"}
    assert [h["round"] for h in r["history"]] == [1, 2, 3]
    assert all({"round", "accuracy", "pseudo_label_accuracy", "seconds"} <= set(h) for h in r["history"])
    assert r["data"]["site_labels"] and sum(r["data"]["site_labels"]) == 30


def test_fedavg_xclp_beats_labelled_only_fedavg(runs):
    # seeds 0–2 gave margins of 0.17, 0.23, 0.24 on raw pixels; with the model's inputs standardised
    # (input_scaling) labelled-only FedAvg rose (0.59 / 0.46 / 0.41 → 0.74 / 0.55 / 0.52) and the margins
    # are 0.075, 0.178, 0.192
    assert runs["fedavg-xclp"]["final_accuracy"] >= runs["fedavg"]["final_accuracy"] + 0.05


def test_fedct_xclp_beats_fedct(runs):
    # trees with 6 labels a site: 0.24 / 0.17 / 0.18 → 0.61 / 0.69 / 0.62 on seeds 0–2
    assert runs["fedct-xclp"]["final_accuracy"] >= runs["fedct"]["final_accuracy"] + 0.2


def test_fedct_sends_far_fewer_bytes_than_fedavg(runs):
    assert (runs["fedct"]["communication_bytes"]["per_round_label_bytes"] * 50
            < runs["fedavg"]["communication_bytes"]["per_round_model_bytes"])


def test_fixed_seed_repeats_exactly(runs):
    again = run_training(TrainConfig(algorithm="fedavg-xclp", **FEDAVG))
    strip = lambda r: [{k: v for k, v in h.items() if k != "seconds"} for h in r["history"]]  # noqa: E731
    assert strip(again) == strip(runs["fedavg-xclp"])
    assert strip(run_training(TrainConfig(algorithm="fedct-xclp", **FEDCT))) == strip(runs["fedct-xclp"])


def test_xclp_plot_compares_runs_and_job_status_files(runs, tmp_path):
    import json

    from cli.main import main

    files = []
    for alg in ("fedavg", "fedavg-xclp"):
        files.append(tmp_path / f"{alg}.json")
        files[-1].write_text(json.dumps({k: v for k, v in runs[alg].items() if k != "model"}, default=str))
    status = tmp_path / "job.json"  # what `xclp job status ID --json` prints for a training job
    status.write_text(json.dumps({"job": "abc", "kind": "train", "params": {"algorithm": "fedct", "config": {}},
                                  "training": {"history": [{"round": 1, "local_accuracy": 0.5}, {"round": 2, "local_accuracy": 0.6}]}}))
    out = tmp_path / "runs.png"
    assert main(["plot", *map(str, files), str(status), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"job": "abc", "kind": "predict"}))
    assert main(["plot", str(bad), "--out", str(tmp_path / "x.png")]) == 2
    assert not (tmp_path / "x.png").exists()
