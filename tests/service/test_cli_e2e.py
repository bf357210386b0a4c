"""The operator's command line against a real coordinator and real agents: `xclp site add`,
`xclp job submit predict|train`, `xclp job wait`, `xclp job status` (the contract outside checks use)."""

import json

import numpy as np
import pytest
from svc import ADMIN, ProcessCluster

from cli.main import main
from xclp.data import load_arrays
from xclp.splits import simulate_sites
from xclp.training.fedct import public_digest

pytestmark = pytest.mark.slow


def cli(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_operator_cli_runs_prediction_and_training_jobs(tmp_path, capsys):
    X, y = load_arrays("digits", limit=500, seed=1)
    X = (X / 16.0).astype(np.float32)
    public, ds = X[:100], simulate_sites(X[100:], y[100:], 3, "iid", 0.2, seed=1)
    np.savez(tmp_path / "U.npz", X=public)
    # every site's points carry an ID (a .npz array, a CSV column) and a column to ignore
    pid = {s: np.array([f"{s}-{i}" for i in range((ds.site == s).sum())]) for s in ds.sites}
    sites = {s: {"X": ds.X[ds.site == s], "y": ds.y[ds.site == s], "pid": pid[s], "note": pid[s]} for s in ds.sites[:2]}
    c = ProcessCluster(tmp_path, f"sqlite:///{tmp_path / 'coord.db'}", sites, public=tmp_path / "U.npz",
                       agent_options=("--allow-plaintext", "--allow-unmasked-training", "--id-column", "pid",
                                      "--ignore-columns", "note"))
    try:
        coord = ["--coordinator", c.url, f"--admin-token={ADMIN}"]
        last = ds.sites[2]  # registered through the CLI, which prints its token once; its data is a CSV
        rows = np.column_stack([pid[last], ds.X[ds.site == last].astype(str), ds.y[ds.site == last].astype(str),
                                np.full(len(pid[last]), "free text")])
        header = ",".join(["pid"] + [f"px{j}" for j in range(ds.X.shape[1])] + ["label", "note"])
        np.savetxt(tmp_path / f"{last}.csv", rows, delimiter=",", header=header, comments="", fmt="%s")
        c.data_files[last] = tmp_path / f"{last}.csv"
        code, out = cli(capsys, "site", "add", last, *coord, "--json")
        assert code == 0 and json.loads(out)["site"] == last
        c.tokens[last] = json.loads(out)["token"]
        c.write_membership(ds.sites)  # the consortium's membership, agreed with the third hospital in it
        for s in ds.sites:
            c.start_agent(s)
        names = ",".join(ds.sites)

        code, out = cli(capsys, "job", "submit", "predict", *coord, "--sites", names, "--classes", "10",
                        "--crypto", "plaintext", "--bits", "128", "--k", "8", "--json")
        job = json.loads(out)["job"]
        assert code == 0 and cli(capsys, "job", "wait", job, *coord, "--timeout", "120")[0] == 0
        code, out = cli(capsys, "job", "status", job, *coord, "--json")
        assert code == 0 and json.loads(out)["status"] == "done"
        assert np.load(c.result(job, last))["labels"].shape == ((ds.site == last).sum(),)
        for s in ds.sites:  # beside each .npz, a CSV of id,label,confidence with the site's own IDs
            with np.load(c.result(job, s)) as f:
                assert list(f["ids"]) == list(pid[s])
                table = np.loadtxt(c.result(job, s).with_suffix(".csv"), delimiter=",", dtype=str)
                assert list(table[0]) == ["id", "label", "confidence"] and list(table[1:, 0]) == list(pid[s])
                assert list(table[1:, 1].astype(int)) == list(f["labels"])

        code, out = cli(capsys, "job", "submit", "train", *coord, "--sites", names, "--classes", "10",
                        "--algorithm", "fedct", "--model", "tree,logreg", "--public", str(tmp_path / "U.npz"), "--rounds", "2", "--json")
        job = json.loads(out)["job"]
        assert code == 0 and cli(capsys, "job", "wait", job, *coord, "--timeout", "120")[0] == 0
        st = json.loads(cli(capsys, "job", "status", job, *coord, "--json")[1])
        assert st["params"]["public_sha256"] == public_digest(public)  # pinned from the file
        assert st["params"]["config"]["learners"] == ["tree", "logreg", "tree"]  # the list cycles over the sites
        assert [r["round"] for r in st["training"]["history"]] == [1, 2]
        code, out = cli(capsys, "job", "status", job, *coord)
        # no truth column in these sites' files: each site held out labelled points (--holdout's default) and
        # the status says the accuracy is on them, with how many
        assert code == 0 and "round 2/2 done" in out and "final: accuracy on held-out labelled points (" in out
        assert st["params"]["holdout"] == 0.2
        assert c.result(job, last, ".model.skops").stat().st_size > 0

        # an unknown site or a bad U is refused before anything is stored
        assert cli(capsys, "job", "submit", "train", *coord, "--sites", "site0,nobody", "--classes", "10",
                   "--algorithm", "fedavg")[0] == 2
        (tmp_path / "bad.npz").write_bytes(b"not an npz")
        assert cli(capsys, "job", "submit", "train", *coord, "--sites", names, "--classes", "10",
                   "--algorithm", "fedct", "--public", str(tmp_path / "bad.npz"))[0] == 2
    finally:
        c.close()


def test_tokens_come_from_a_file_or_the_environment(tmp_path, capsys, monkeypatch):
    """A token on the command line is visible to every user (ps, /proc/*/cmdline): the operator's and
    the sites' tokens can come from a file or the environment instead, and their absence is a clear error."""
    sites = {"p": {"X": np.zeros((4, 2)), "y": np.array([0, 1, -1, -1])}}
    c = ProcessCluster(tmp_path, f"sqlite:///{tmp_path / 'coord.db'}", sites)
    try:
        with open(f"/proc/{c.coordinator.pid}/cmdline", "rb") as f:
            assert ADMIN.encode() not in f.read()  # the launcher passes it in the environment
        monkeypatch.delenv("XCLP_ADMIN_TOKEN", raising=False)
        code = main(["site", "add", "q", "--coordinator", c.url])
        assert code == 2 and "--admin-token-file" in capsys.readouterr().err
        (tmp_path / "admin.txt").write_text(ADMIN + "\n")
        code, out = cli(capsys, "site", "add", "q", "--coordinator", c.url, "--admin-token-file",
                        str(tmp_path / "admin.txt"), "--json")
        assert code == 0 and json.loads(out)["site"] == "q"
        monkeypatch.setenv("XCLP_ADMIN_TOKEN", ADMIN)
        code, out = cli(capsys, "site", "add", "r", "--coordinator", c.url, "--json")
        assert code == 0 and json.loads(out)["site"] == "r"
        c.start_agent("p")
        with open(f"/proc/{c.agents['p'].pid}/cmdline", "rb") as f:
            assert c.tokens["p"].encode() not in f.read()
    finally:
        c.close()
