"""The coordinator's executor (xclp.executor) reaches the core's machine: `xclp coordinator serve
--executor/--workers` choose where a blocked graph's heavy steps run, and every prediction step the
engine takes hands that executor to PredictCoordinator."""

from __future__ import annotations

import pytest

from service.app import Settings, create_app
from xclp.executor import ProcessExecutor

TOKEN = "t" * 40


def test_the_engine_holds_the_chosen_executor_and_refuses_a_bad_choice(tmp_path):
    app = create_app(Settings(database=f"sqlite:///{tmp_path}/a.db", admin_token=TOKEN))
    assert isinstance(app.state.engine.executor, ProcessExecutor)  # the default: a pool on this machine
    app = create_app(Settings(database=f"sqlite:///{tmp_path}/b.db", admin_token=TOKEN, executor="process", workers=3))
    assert app.state.engine.executor.workers == 3
    app = create_app(Settings(database=f"sqlite:///{tmp_path}/c.db", admin_token=TOKEN, executor="serial"))
    assert app.state.engine.executor.kind == "serial" and app.state.engine.executor.workers == 1
    for bad, says in [({"executor": "ray"}, "use serial, process or dask"), ({"workers": 0}, "at least 1"),
                      ({"executor": "dask"}, "needs one"), ({"dask_address": "tcp://h:8786"}, "goes with")]:
        with pytest.raises(ValueError, match=says):
            create_app(Settings(database=f"sqlite:///{tmp_path}/d.db", admin_token=TOKEN, **bad))
