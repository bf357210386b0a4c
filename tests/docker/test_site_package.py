"""The site-only package, checked without Docker or systemd: docker/site/compose.yaml (one agent on a
hospital's host, its CSV/Parquet file by configuration) and docker/systemd/xclp-agent.service. Each
command line goes through xclp's own parser with the settings of its .env example filled in (parse
only); the data, the schema, the membership and the CA certificate lie in read-only mounts, the token is
a secret file, and the example's data file is one the agent reads: a .csv or a .parquet."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path, PurePosixPath

import pytest

from cli import main as cli

# the compose helpers of test_docker_files (its loader, interpolation, mounts and secrets), by path: the
# tests run with --import-mode=importlib, where a test module is no importable name
_spec = importlib.util.spec_from_file_location("docker_files", Path(__file__).with_name("test_docker_files.py"))
_files = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_files)
DOCKER, DOCKERFILE, ROOT = _files.DOCKER, _files.DOCKERFILE, _files.ROOT
compose_vars, interpolate = _files.compose_vars, _files.interpolate
load_compose, mount_of, parse, secret_file = _files.load_compose, _files.mount_of, _files.parse, _files.secret_file

SITE = DOCKER / "site"
UNIT = DOCKER / "systemd" / "xclp-agent.service"


def _env(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", path.read_text(), re.M))


@pytest.fixture(scope="module")
def site():
    return load_compose(SITE / "compose.yaml")


def _argv(service: dict, env: dict[str, str]) -> list[str]:
    return [interpolate(str(a), env) for a in service["command"]]


def test_the_site_package_is_one_agent_and_nothing_else(site):
    assert list(site["services"]) == ["agent"], "a hospital's host runs its agent only: no database, no coordinator"
    svc = site["services"]["agent"]
    build = svc["build"]
    assert (SITE / build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE.resolve()
    assert svc["image"] == load_compose()["services"]["coordinator"]["image"], "one image for every role"
    assert svc["healthcheck"]["disable"] is True


def test_every_setting_comes_from_the_env_example_and_compose_refuses_a_missing_one(site):
    example = _env(SITE / ".env.example")
    used = compose_vars(site)
    assert used and used <= set(example), f"missing from docker/site/.env.example: {sorted(used - set(example))}"
    svc = site["services"]["agent"]
    for name in ("XCLP_COORDINATOR", "XCLP_SITE", "XCLP_DATA_FILE", "XCLP_ID_COLUMN"):
        with pytest.raises(KeyError):  # compose stops with the ${VAR:?…} message
            _argv(svc, {k: v for k, v in example.items() if k != name})


@pytest.mark.parametrize("data_file", ["patients.csv", "patients.parquet"])
def test_the_agent_reads_a_csv_or_parquet_file_through_the_schema(site, data_file):
    svc = site["services"]["agent"]
    env = {**_env(SITE / ".env.example"), "XCLP_DATA_FILE": data_file}
    args = parse(_argv(svc, env))
    assert args.func is cli.cmd_agent_run
    assert args.coordinator.startswith("https://") and not args.insecure_http
    assert PurePosixPath(args.data).name == data_file and PurePosixPath(args.data).suffix in (".csv", ".parquet")
    assert args.id_column == env["XCLP_ID_COLUMN"] and args.label_column == env["XCLP_LABEL_COLUMN"]
    for path in (args.data, args.schema, args.membership, args.ca_file):
        m = mount_of(svc, path)
        assert m is not None and m["read_only"], f"{path}: not in a read-only mount"
    out = mount_of(svc, args.out)
    assert out is not None and not out["read_only"]
    assert out["source"].startswith("./"), "the results go to a folder of the hospital's host, where it reads them"


def test_the_site_token_is_a_secret_file(site):
    svc = site["services"]["agent"]
    args = parse(_argv(svc, _env(SITE / ".env.example")))
    assert args.token is None and "environment" not in svc
    assert secret_file(site, svc, args.token_file).parts[-2] == "secrets"


def _unit() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if line.strip() and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_the_systemd_unit_runs_the_agent_with_its_token_from_a_credential():
    unit = _unit()
    assert unit["User"] != ["root"] and unit["User"], "the agent runs as its own user"
    assert unit["Restart"] == ["on-failure"] and unit["KillSignal"] == ["SIGTERM"]
    env = {**_env(DOCKER / "systemd" / "agent.env.example"), "CREDENTIALS_DIRECTORY": "/run/credentials/xclp-agent"}
    assert unit["EnvironmentFile"] == ["/etc/xclp/agent.env"]
    argv = shlex.split(unit["ExecStart"][0])
    assert argv[0].endswith("/bin/xclp")
    used = {m for a in argv for m in re.findall(r"\$\{([A-Za-z_]+)\}", a)}
    assert used <= set(env), f"not in agent.env.example: {sorted(used - set(env))}"
    args = parse([re.sub(r"\$\{([A-Za-z_]+)\}", lambda m: env[m.group(1)], a) for a in argv[1:]])
    assert args.func is cli.cmd_agent_run and args.token is None
    # the token: a credential systemd hands the service as a file (LoadCredential), read by --token-file
    name, _, source = unit["LoadCredential"][0].partition(":")
    assert args.token_file == f"{env['CREDENTIALS_DIRECTORY']}/{name}" and source.startswith("/etc/xclp/")
    assert PurePosixPath(args.data).suffix in (".csv", ".parquet") and args.id_column and args.schema
    assert args.out.startswith("/var/lib/") and unit["StateDirectory"] == [PurePosixPath(args.out).name]


def test_systemd_itself_reads_the_unit_without_a_complaint(tmp_path):
    """systemd's own parser (`systemd-analyze verify`) on the unit, its ExecStart pointed at this checkout's
    xclp: every directive known and every value valid (a misspelt key or value is only warned about and
    ignored by systemd, so the test reads what it says, not its exit status alone)."""
    import shutil
    import subprocess
    import sys

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: the systemd package)")
    xclp_bin = Path(sys.executable).with_name("xclp")
    if not xclp_bin.exists():
        pytest.skip(f"{xclp_bin}: the package's console script is not installed in this environment")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/xclp/venv/bin/xclp", str(xclp_bin)))
    out = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    said = [line for line in (out.stdout + out.stderr).splitlines() if unit.name in line]
    assert out.returncode == 0 and said == [], "\n".join(said) or out.stderr
