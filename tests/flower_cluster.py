"""The Flower deployment tests' shared part (tests/flower/test_flower_deployment*.py): a module's
deployment and the runs' inputs.

Each run costs ~100 CPU-seconds whatever the data: Flower 1.41 starts a ClientApp process per message
(~2.5 CPU-s each, mostly Flower's own imports), and a round waits on the SuperNodes' and the grid's 3-second
polls. Runs at once on separate SuperLinks saved only ~10 % (the runs are CPU-bound on 2 cores) and came
near the runs' timeout under load, so within a module they run one after another, on one deployment
(`flower_fixture`: a SuperLink and a SuperNode per site, started once, as an operator's federation
takes run after run). The runs are split over modules all the same: `--dist loadscope` keeps a module
on one worker, and one module of every run was the suite's critical path (~660 s on one worker while
the others had finished); a deployment's start (~10 s, 20 s under load) is the price of each split."""

import time

import numpy as np
import pytest

from xclp_flower.deployment import LocalFlower

SITES = ("site0", "site1", "site2")  # the deployment's SuperNodes (simulate_sites names its sites so)


def flower_fixture():
    """A module-scoped `flower` fixture: the module's deployment, each SuperNode's data file (and
    FedCT's U) at a fixed path, which each test fills with its sites' data before its run (a ClientApp
    loads it at every message). Every process is ended at the module's end (asserted)."""

    @pytest.fixture(scope="module")
    def flower(tmp_path_factory):
        work = tmp_path_factory.mktemp("flower")
        deployment = LocalFlower(work, {s: work / f"{s}.npz" for s in SITES}, public=work / "public.npz")
        try:
            yield deployment
        finally:
            deployment.close()
        assert all(p.poll() is not None for p in deployment.procs.values()), deployment.logs()  # every process ended

    return flower


def site_files(flower: LocalFlower, ds, truth: bool = False) -> None:
    """Each site's data into its SuperNode's data file."""
    assert set(ds.sites) <= set(flower.sites), ds.sites
    for s in ds.sites:
        m = ds.site == s
        extra = {"y_true": ds.y_true[m]} if truth else {}
        np.savez(flower.sites[s], X=ds.X[m], y=ds.y[m], **extra)


def run(flower: LocalFlower, ds, run_config: str, truth: bool = False) -> dict:
    """`flwr run` over the sites' data: the ServerApp's summary, with the run's wall time."""
    site_files(flower, ds, truth)
    t = time.monotonic()
    summary = flower.run(run_config, timeout=1500)  # (a run: ~100 CPU-s, 4–6 min idle; past 10 min under load)
    summary["_seconds"] = round(time.monotonic() - t, 1)
    return summary

