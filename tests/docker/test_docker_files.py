"""docker/: what can be checked without a Docker engine.

compose.yaml is parsed (PyYAML when it is installed; otherwise a small loader for the block-style
subset the file uses, which refuses anything outside that subset), every xclp service's command
goes through the project's own argparse parser (parse only, nothing runs), and the Dockerfile is
read as text: non-root USER, `xclp` entry point, a /health check, the packages pyproject.toml
installs copied in, torch pinned as in the Makefile, the parquet extra, an offline build from
docker/wheelhouse when it holds wheels. Secrets (the database password, the tokens) are compose secret
files, never on a command line or in the compose file. TLS: the coordinator serves HTTPS from
read-only mounted files on a port published on every interface, the agents verify it against a
read-only CA file, and the certificate docker/README.md makes covers the name the agents use.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import pytest
from sqlalchemy.engine import make_url

from cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
AGENTS = ["site0", "site1", "site2"]


# --- a minimal YAML loader (block mappings and sequences, scalars, flow sequences of scalars) ----------

class MiniYamlError(ValueError):
    pass


def _strip_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _split_outside_quotes(text: str, sep: str) -> list[str]:
    parts, quote, cur = [], None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == sep:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    parts.append(cur)
    return parts


def _scalar(text: str):
    t = text.strip()
    if not t:
        return None
    if t[0] in "&*|>{!%@`":
        raise MiniYamlError(f"unsupported YAML construct: {t!r}")
    if t[0] == "[":
        if not t.endswith("]"):
            raise MiniYamlError(f"unterminated flow sequence: {t!r}")
        inner = t[1:-1].strip()
        return [] if not inner else [_scalar(x) for x in _split_outside_quotes(inner, ",")]
    if t[0] == '"':
        if not t.endswith('"') or len(t) < 2:
            raise MiniYamlError(f"bad double-quoted scalar: {t!r}")
        return t[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if t[0] == "'":
        if not t.endswith("'") or len(t) < 2:
            raise MiniYamlError(f"bad single-quoted scalar: {t!r}")
        return t[1:-1].replace("''", "'")
    if t in ("null", "~", "Null", "NULL"):
        return None
    if t in ("true", "True", "TRUE"):
        return True
    if t in ("false", "False", "FALSE"):
        return False
    if re.fullmatch(r"[-+]?[0-9]+", t):
        return int(t)
    return t


def _key_value(content: str) -> tuple[str, str] | None:
    """'key: value' or 'key:' outside quotes; None if the line is not a mapping entry."""
    quote = None
    for i, ch in enumerate(content):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ":" and (i + 1 == len(content) or content[i + 1] == " "):
            return content[:i].strip(), content[i + 1:].strip()
    return None


def mini_yaml_load(text: str):
    lines = []
    for raw in text.splitlines():
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise MiniYamlError("tabs in indentation")
        s = _strip_comment(raw)
        if s.strip():
            lines.append((len(s) - len(s.lstrip(" ")), s.strip()))

    def block(i: int, indent: int):
        if lines[i][1].startswith("- ") or lines[i][1] == "-":
            return seq(i, indent)
        return mapping(i, indent)

    def seq(i: int, indent: int):
        out = []
        while i < len(lines) and lines[i][0] == indent and (lines[i][1].startswith("- ") or lines[i][1] == "-"):
            item = lines[i][1][1:].strip()
            if not item or _key_value(item) is not None and not item.startswith(("'", '"', "[")):
                raise MiniYamlError(f"only scalar sequence items are supported: {lines[i][1]!r}")
            out.append(_scalar(item))
            i += 1
        return out, i

    def mapping(i: int, indent: int):
        out = {}
        while i < len(lines) and lines[i][0] == indent:
            kv = _key_value(lines[i][1])
            if kv is None:
                raise MiniYamlError(f"expected 'key: value' at {lines[i][1]!r}")
            key, value = kv
            key = _scalar(key)
            if key in out:
                raise MiniYamlError(f"duplicate key {key!r}")
            i += 1
            if value:
                out[key] = _scalar(value)
            elif i < len(lines) and (lines[i][0] > indent or (lines[i][0] == indent and lines[i][1].startswith("-"))):
                out[key], i = block(i, lines[i][0])
            else:
                out[key] = None
        if i < len(lines) and lines[i][0] > indent:
            raise MiniYamlError(f"bad indentation at {lines[i][1]!r}")
        return out, i

    if not lines:
        return None
    doc, end = block(0, lines[0][0])
    if end != len(lines):
        raise MiniYamlError(f"could not parse from {lines[end][1]!r}")
    return doc


def load_compose(path: Path = COMPOSE) -> dict:
    text = path.read_text()
    mine = mini_yaml_load(text)
    try:
        import yaml
    except ImportError:
        return mine
    ref = yaml.safe_load(text)
    assert mine == ref, f"the minimal loader disagrees with PyYAML on {path}"
    return ref


# --- compose variable interpolation (${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}, $$) --

VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def compose_vars(value) -> set[str]:
    if isinstance(value, dict):
        return set().union(*(compose_vars(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(compose_vars(v) for v in value)) if value else set()
    if isinstance(value, str):
        return {m.group(1) or m.group(4) for m in VAR.finditer(value) if m.group(0) != "$$"}
    return set()


def interpolate(value: str, env: dict[str, str]) -> str:
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3)
        val = env.get(name)
        if op in (":?", "?") and (val is None or (op == ":?" and val == "")):
            raise KeyError(f"{name}: {arg}")
        if op in (":-", "-") and (val is None or (op == ":-" and val == "")):
            return arg
        return "" if val is None else val

    return VAR.sub(sub, value)


# Site tokens are secrets.token_urlsafe(32): one in 64 starts with '-', which argparse takes for an
# option unless it is passed as `--token=VALUE`; the fake tokens start with '-' to catch that.
FAKE_ENV = {"XCLP_ADMIN_TOKEN": "-admin-token-0123456789abcdefghijklmnop",  # ≥ 32 characters, as the coordinator wants
            **{f"XCLP_SITE{i}_TOKEN": f"-token-of-site{i}-abcdef" for i in range(len(AGENTS))}}


def command_argv(service: dict) -> list[str]:
    cmd = service.get("command")
    assert cmd, "no command"
    argv = shlex.split(cmd) if isinstance(cmd, str) else [str(x) for x in cmd]
    return [interpolate(a, FAKE_ENV) for a in argv]


def parse(argv: list[str]):
    try:
        return cli.build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse's way of refusing a command line
        raise AssertionError(f"`xclp {' '.join(argv)}` is not a valid command line (exit {exc.code})") from None


def mounts(service: dict) -> list[dict]:
    """Short-syntax volume strings as {source, target, read_only}."""
    out = []
    for v in service.get("volumes") or []:
        assert isinstance(v, str), f"use the short volume syntax: {v!r}"
        parts = v.split(":")
        assert len(parts) in (2, 3), f"volume {v!r}: expected SOURCE:TARGET[:MODE]"
        mode = parts[2].split(",") if len(parts) == 3 else []
        out.append({"source": parts[0], "target": parts[1], "read_only": "ro" in mode})
    return out


def mount_of(service: dict, path: str) -> dict | None:
    """The (deepest) mount whose target contains `path`."""
    p = PurePosixPath(path)
    best = None
    for m in mounts(service):
        t = PurePosixPath(m["target"])
        if (p == t or t in p.parents) and (best is None or len(t.parts) > len(PurePosixPath(best["target"]).parts)):
            best = m
    return best


def is_named_volume(source: str) -> bool:
    return not source.startswith((".", "/", "~", "$"))


@pytest.fixture(scope="module")
def compose() -> dict:
    assert COMPOSE.is_file(), f"{COMPOSE} is missing"
    return load_compose()


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


# --- the loader itself ------------------------------------------------------------------------------

def test_mini_yaml_loader_handles_the_subset_and_refuses_the_rest():
    doc = mini_yaml_load('a:\n  b: "x: y"  # c\n  c:\n    - 1\n    - \'q\'\n  d: [ "A", b ]\n  e:\nf: true\n')
    assert doc == {"a": {"b": "x: y", "c": [1, "q"], "d": ["A", "b"], "e": None}, "f": True}
    assert mini_yaml_load("k:\n- a\n- b\n") == {"k": ["a", "b"]}
    for bad in ("a: &anchor 1\n", "a: |\n  text\n", "a:\n  - b: c\n", "a: 1\na: 2\n", "a: {b: 1}\n"):
        with pytest.raises(MiniYamlError):
            mini_yaml_load(bad)


def test_interpolation_follows_compose_rules():
    assert interpolate("${A:-x}/${B-y}/$$C/${D}", {"A": "", "B": ""}) == "x//$C/"
    with pytest.raises(KeyError):
        interpolate("${A:?need A}", {"A": ""})
    assert interpolate("${A?need A}", {"A": ""}) == ""


# --- compose.yaml -----------------------------------------------------------------------------------

def test_services_are_db_coordinator_and_three_agents(services):
    assert set(services) == {"db", "coordinator", *AGENTS}


def test_db_is_postgres_15_with_healthcheck_and_volume(compose, services):
    db = services["db"]
    assert re.fullmatch(r"postgres:15([.-].*)?", db["image"]), db["image"]
    test = db["healthcheck"]["test"]
    assert "pg_isready" in (test if isinstance(test, str) else " ".join(test))
    data = mount_of(db, "/var/lib/postgresql/data")
    assert data is not None and is_named_volume(data["source"]) and not data["read_only"]
    assert data["source"] in (compose.get("volumes") or {}), "the database volume is not declared"


def test_xclp_services_share_one_image_built_from_docker_dockerfile(services):
    images = set()
    for name in ["coordinator", *AGENTS]:
        svc = services[name]
        images.add(svc["image"])
        build = svc.get("build")
        if build is not None:
            ctx = (COMPOSE.parent / build["context"]).resolve()
            assert ctx == ROOT, f"{name}: build context should be the repository root, is {ctx}"
            assert (ctx / build["dockerfile"]).resolve() == DOCKERFILE.resolve(), name
    assert len(images) == 1, f"coordinator and agents should run one image, not {images}"
    assert services["coordinator"].get("build"), "the coordinator's service builds the image"


def secret_file(compose: dict, service: dict, path: str) -> Path:
    """The host file behind `path`, a compose secret the service is given (/run/secrets/NAME)."""
    target = PurePosixPath(path)
    assert target.parent == PurePosixPath("/run/secrets"), f"{path}: not a compose secret (/run/secrets/NAME)"
    assert target.name in (service.get("secrets") or []), f"{path}: the service is not given the secret {target.name}"
    declared = (compose.get("secrets") or {}).get(target.name) or {}
    assert "file" in declared, f"secret {target.name}: give it as a file"
    return Path(declared["file"])


def test_coordinator_command_parses_and_matches_the_db_service(compose, services):
    svc = services["coordinator"]
    args = parse(command_argv(svc))
    assert args.func is cli.cmd_coordinator_serve
    assert args.host == "0.0.0.0", "inside a container the coordinator must listen on all interfaces"
    url = make_url(args.database)
    env = services["db"]["environment"]
    assert url.drivername == "postgresql+psycopg2"
    assert url.host == "db" and (url.port or 5432) == 5432
    assert url.username == env["POSTGRES_USER"]
    assert url.database == env["POSTGRES_DB"]
    # the password: one secret file, read by PostgreSQL and by the coordinator; never in the URL or this file
    assert url.password is None, "a password in --database shows in ps and docker inspect"
    assert "POSTGRES_PASSWORD" not in env, "the password inline in compose.yaml"
    ours = secret_file(compose, svc, args.database_password_file)
    theirs = secret_file(compose, services["db"], env["POSTGRES_PASSWORD_FILE"])
    assert ours == theirs and ours.parts[-2] == "secrets"
    assert svc["depends_on"]["db"]["condition"] == "service_healthy"


def test_no_secret_is_on_a_command_line_or_in_the_compose_files(compose, services):
    for path in (COMPOSE, DOCKER / "site" / "compose.yaml"):
        text = path.read_text()
        assert not re.search(r"postgresql\S*://[^@\s/]*:[^@\s]*@", text), f"{path}: a password in a database URL"
        assert "XCLP_ADMIN_TOKEN" not in text and "XCLP_TOKEN" not in text, f"{path}: a token in the environment"


def test_admin_token_comes_from_a_secret_file_not_the_command_line(compose, services):
    svc = services["coordinator"]
    argv = [str(a) for a in svc["command"]]
    assert "--admin-token" not in argv, "a token on the command line shows in `ps` and `docker inspect`"
    args = parse(command_argv(svc))
    assert args.admin_token is None
    assert secret_file(compose, svc, args.admin_token_file).name == "admin_token"


def test_coordinator_port_is_published_and_health_checked(services):
    svc = services["coordinator"]
    port = parse(command_argv(svc)).port
    published = [str(p) for p in svc.get("ports") or []]
    assert any(p.split(":")[-1] == str(port) for p in published), published
    assert svc.get("healthcheck", {}).get("disable") is not True
    health = [a for k, a in instructions() if k == "HEALTHCHECK"]
    assert health, "no HEALTHCHECK"
    m = re.search(r'CMD \["python", "-m", "cli\.healthcheck", "(\d+)"\]', health[-1])
    assert m and int(m.group(1)) == port, health[-1]
    from cli import healthcheck

    assert callable(healthcheck.healthy)  # the module the check runs ships in the image (cli/)


def test_coordinator_serves_https_reachable_from_other_hosts(services):
    svc = services["coordinator"]
    args = parse(command_argv(svc))
    assert args.tls_cert and args.tls_key, "the coordinator must serve HTTPS (--tls-cert, --tls-key)"
    assert not args.insecure_http
    for path in (args.tls_cert, args.tls_key):
        m = mount_of(svc, path)
        assert m is not None and m["read_only"], f"{path} must lie in a read-only mount"
        assert not is_named_volume(m["source"]), f"{path}: mount the host's certificate folder"
    port = args.port
    for p in (str(p) for p in svc.get("ports") or []):
        if p.split(":")[-1] == str(port):
            host_ip = p.split(":")[0] if p.count(":") == 2 else "0.0.0.0"
            assert host_ip in ("0.0.0.0", "::"), f"port {p} is reachable from this host only"


@pytest.mark.parametrize("site", AGENTS)
def test_agent_verifies_the_coordinator_with_the_mounted_ca(services, site):
    svc = services[site]
    args = parse(command_argv(svc))
    assert urlsplit(args.coordinator).scheme == "https"
    assert not args.insecure_http
    assert args.ca_file, f"{site}: no --ca-file: a self-made certificate would not verify"
    m = mount_of(svc, args.ca_file)
    assert m is not None and m["read_only"], f"{site}: --ca-file must lie in a read-only mount"
    coord = services["coordinator"]
    server_side = mount_of(coord, parse(command_argv(coord)).tls_cert)
    assert (PurePosixPath(server_side["source"]) / PurePosixPath(args.ca_file).name) == PurePosixPath(m["source"]), \
        f"{site}: the CA file should be the ca.pem beside the coordinator's certificate"
    assert PurePosixPath(m["source"]).name == "ca.pem", "only the CA certificate goes to the agents, not the key"


def test_readme_certificate_covers_the_names_agents_and_operators_use(services, tmp_path):
    from cryptography import x509
    from cryptography.x509.verification import PolicyBuilder, Store

    text = (DOCKER / "README.md").read_text()
    m = re.search(r"^(?:\.\./\.venv/bin/)?xclp (tls make-dev-ca [^\n]*)$", text, re.M)
    assert m, "docker/README.md no longer shows the `xclp tls make-dev-ca` command"
    argv = shlex.split(m.group(1).replace("$(hostname -f)", "host.example"))
    out = argv.index("--out") + 1
    assert argv[out] == mount_of(services["coordinator"], "/tls/server.pem")["source"].removeprefix("./")
    argv[out] = str(tmp_path / "tls")
    args = parse(argv)
    assert args.func(args) == 0
    ca = x509.load_pem_x509_certificate((tmp_path / "tls" / "ca.pem").read_bytes())
    leaf = x509.load_pem_x509_certificates((tmp_path / "tls" / "server.pem").read_bytes())[0]
    names = {urlsplit(parse(command_argv(services[s])).coordinator).hostname for s in AGENTS} | {"localhost"}
    for name in names:
        PolicyBuilder().store(Store([ca])).build_server_verifier(x509.DNSName(name)).verify(leaf, [])
    assert not (tmp_path / "tls" / "ca-key.pem").exists()
    assert (tmp_path / "tls" / "server-key.pem").stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("site", AGENTS)
def test_agent_command_parses_and_points_at_its_volumes(services, site):
    svc = services[site]
    args = parse(command_argv(svc))
    assert args.func is cli.cmd_agent_run
    assert args.site == site
    coord = urlsplit(args.coordinator)
    assert coord.hostname == "coordinator" and coord.port == parse(command_argv(services["coordinator"])).port
    data = mount_of(svc, args.data)
    assert data is not None, f"{site}: --data {args.data} is not inside a mounted volume"
    assert data["read_only"], f"{site}: its data volume must be mounted read-only"
    out = mount_of(svc, args.out)
    assert out is not None, f"{site}: --out {args.out} is not inside a mounted volume"
    assert not out["read_only"], f"{site}: the output volume must be writable"
    assert out is not data
    assert svc["depends_on"]["coordinator"]["condition"] == "service_healthy"
    assert svc["healthcheck"]["disable"] is True, "the image's /health check does not apply to an agent"


def test_agents_have_their_own_tokens_and_volumes(compose, services):
    tokens, sources = set(), []
    declared = compose.get("volumes") or {}
    for site in AGENTS:
        svc = services[site]
        # the mounts the agents share, read-only and public: the CA certificate and the consortium's membership
        ca = mount_of(svc, parse(command_argv(svc)).ca_file)
        members = mount_of(svc, parse(command_argv(svc)).membership)
        argv = [str(a) for a in svc["command"]]
        # A token on the command line shows in `ps` and `docker inspect`: the agent reads a secret file.
        assert not any(a == "--token" or a.startswith("--token=") for a in argv), f"{site}: token in argv"
        args = parse(command_argv(svc))
        assert args.token is None and "XCLP_TOKEN" not in (svc.get("environment") or {})
        tokens.add(secret_file(compose, svc, args.token_file))
        for m in mounts(svc):
            if m in (ca, members):
                assert m["read_only"]
                continue
            sources.append(m["source"])
            if is_named_volume(m["source"]):
                assert m["source"] in declared, f"{site}: volume {m['source']} is not declared"
    assert len(tokens) == len(AGENTS), tokens
    assert len(set(sources)) == len(sources), f"agents share a volume: {sources}"


# --- Dockerfile -------------------------------------------------------------------------------------

def dockerfile_text() -> str:
    return DOCKERFILE.read_text()


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, cur = [], ""
    for line in dockerfile_text().splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def test_dockerfile_base_user_and_entrypoint():
    ins = instructions()
    assert ins[0] == ("FROM", "python:3.11-slim")
    users = [i for i, (k, _) in enumerate(ins) if k == "USER"]
    assert users, "no USER: the image would run as root"
    user = ins[users[-1]][1].split(":")[0]
    assert user not in ("root", "0"), user
    if not user.isdigit():  # a name must be created in the image
        assert re.search(rf"useradd\b[^&]*\b{re.escape(user)}\b", dockerfile_text())
    entry = [a for k, a in ins if k == "ENTRYPOINT"]
    assert entry and entry[-1].replace(" ", "") in ('["xclp"]', "xclp"), entry
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "xclp" in scripts, "the entry point must be the console script pyproject.toml installs"


def test_dockerfile_runtime_user_owns_the_agent_output_mount(services):
    text = dockerfile_text()
    outs = {parse(command_argv(services[s])).out for s in AGENTS}
    for out in outs:
        target = mount_of(services[AGENTS[0]], out)["target"]
        assert re.search(rf"chown\s+\S+\s+(?:\S+\s+)*{re.escape(target)}(\s|$)", text), \
            f"{target} must belong to the runtime user, or a fresh named volume there is not writable"


def test_dockerfile_installs_torch_cpu_pinned_like_the_makefile_then_the_package():
    text = dockerfile_text()
    make = re.search(r"torch==([0-9][0-9.]*)", (ROOT / "Makefile").read_text())
    assert make, "the Makefile no longer pins torch"
    pin = make.group(1)
    arg = re.search(r"^ARG TORCH_VERSION=(\S+)", text, re.M)
    version = arg.group(1) if arg else (re.search(r"torch==([0-9][0-9.]*)", text) or [None, None])[1]
    assert version == pin, f"Dockerfile torch {version} vs Makefile torch {pin}"
    runs = [a for k, a in instructions() if k == "RUN"]
    torch_at = next(i for i, r in enumerate(runs) if "download.pytorch.org/whl/cpu" in r and "torch==" in r)
    pkg_at = next(i for i, r in enumerate(runs) if re.search(r"pip install (\S+ )*\"?\.(\[[a-z,]+\])?\"?(\s|;|$)", r))
    assert torch_at < pkg_at, "torch's CPU wheel must be installed before `pip install .`"


def test_dockerfile_installs_the_parquet_extra_and_from_a_wheelhouse_when_given_one():
    runs = [a for k, a in instructions() if k == "RUN"]
    copies = [a.split() for k, a in instructions() if k == "COPY"]
    house = next((c[-1] for c in copies if c[0] == "docker/wheelhouse"), None)
    assert house, "docker/wheelhouse is not copied in: an offline build has nowhere to take its wheels from"
    assert (DOCKER / "wheelhouse").is_dir(), "the wheelhouse folder must exist (COPY fails on a missing one)"
    offline = f"--no-index --find-links {house}"
    torch = next(r for r in runs if "torch==" in r)
    pkg = next(r for r in runs if "[parquet]" in r)
    # each install: from the wheelhouse, with no index, when it holds wheels; else from the network
    for run in (torch, pkg):
        assert offline in run and f"ls {house}/*.whl" in run, run
    assert '".[parquet]"' in pkg, "the image lacks the parquet extra: a site's .parquet file would not load"
    ignored = [ln.strip() for ln in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()]
    assert not any(ln and not ln.startswith("#") and "docker/wheelhouse".startswith(ln.rstrip("/*")) for ln in ignored)
    for private in ("docker/secrets", "docker/tls", "docker/site/secrets", "docker/site/data"):
        assert private in ignored, f"{private} would enter the build context (and maybe the image)"


def test_dockerfile_copies_everything_pip_install_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = set()
    for k, a in instructions():
        if k in ("COPY", "ADD"):
            copied.update(PurePosixPath(p).parts[0] for p in a.split()[:-1] if not p.startswith("--"))
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= {pat.rstrip("*") for pat in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert needed <= copied, f"not copied into the image: {sorted(needed - copied)}"
