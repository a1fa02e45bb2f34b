"""docker/: Kubernetes manifests pass the Kubernetes JSON schemas (offline, strict) and agree with
each other, with the compose file, with the nginx config, with the CLI and with the README.

No container engine or cluster runs here; these checks are what can be verified without one.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from render_service.http.cli import build_parser
from render_service.http.server import GRACEFUL_SHUTDOWN_SECONDS
from tests.integration.nginx import nginx_quoted

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
K8S = DOCKER / "k8s"
DEPLOYMENT_DOC = REPO / "docs" / "deployment.md"
# The oldest Kubernetes we claim: the preStop `sleep` action is on by default from 1.30.
K8S_VERSIONS = ["1.30", kubernetes_validate.latest_version()]
ROUTES_PROBED = {"/health", "/ready", "/metrics"}


def manifests() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


def by_kind(kind: str) -> dict[str, Any]:
    found = [doc for _, doc in manifests() if doc["kind"] == kind]
    assert len(found) == 1, kind
    return found[0]


def flag_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


# ---- Kubernetes ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    ("name", "doc"), manifests(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_manifest_passes_kubernetes_schema(name: str, doc: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        error = exc.caught
        where = "/".join(str(p) for p in getattr(error, "absolute_path", []))
        pytest.fail(f"{name} at {where or '/'}: {getattr(error, 'message', error)}", pytrace=False)


def test_every_kind_is_there_and_kustomization_lists_every_file() -> None:
    kinds = sorted(doc["kind"] for _, doc in manifests())
    assert kinds == sorted(
        [
            "ConfigMap",
            "Deployment",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget",
            "Service",
        ]
    )
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = sorted(kustomization["resources"])
    assert listed == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def test_no_secret_value_is_shipped() -> None:
    # Regression (issue 14): kustomization.yaml applied a Secret with a placeholder value, so
    # following the docs (create the secret, then apply -k) overwrote it with a public one.
    assert not [name for name, doc in manifests() if doc["kind"] == "Secret"]
    for path in DOCKER.rglob("*"):
        if path.is_file():
            assert "replace-me" not in path.read_text(errors="replace"), path


def test_selectors_and_references_agree() -> None:
    deployment = by_kind("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert by_kind("Service")["spec"]["selector"].items() <= pod_labels.items()
    assert by_kind("PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == selector
    target = by_kind("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])

    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (env,) = container["env"]
    ref = env["valueFrom"]["secretKeyRef"]
    assert env["name"] == "RENDER_SERVICE_STATE_SECRET"
    # The Secret is created out of band, under the name and key docs/deployment.md gives.
    assert (ref["name"], ref["key"]) == ("render-service-state", "RENDER_SERVICE_STATE_SECRET")
    assert "kubectl create secret generic render-service-state" in DEPLOYMENT_DOC.read_text()

    config_map = by_kind("ConfigMap")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    (arg,) = container["args"]
    flags_file = Path(arg.removeprefix("@"))
    flags_volume = volumes[mounts[str(flags_file.parent)]]
    assert flags_volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert flags_file.name in config_map["data"]
    assert "/tmp" in mounts  # the root filesystem is read-only; multiprocess metrics live in /tmp
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_probes_hit_real_routes_and_the_drain_fits_the_grace_period() -> None:
    from render_service.http import app

    source = Path(app.__file__).read_text()
    deployment = by_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    port = container["ports"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == port["name"]
        assert f'Route("{container[probe]["httpGet"]["path"]}"' in source
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    assert annotations["prometheus.io/path"] == "/metrics"
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + GRACEFUL_SHUTDOWN_SECONDS
    assert by_kind("Service")["spec"]["ports"][0]["targetPort"] == port["name"]


@pytest.mark.parametrize(
    "text",
    [
        by_kind("ConfigMap")["data"]["flags"],
        (DOCKER / "render-service.flags").read_text(),
    ],
    ids=["configmap", "compose"],
)
def test_flag_files_parse_with_the_real_cli(text: str) -> None:
    args = build_parser().parse_args(["serve", *flag_lines(text)])
    assert args.command == "serve"
    assert all(not line.startswith("#") for line in flag_lines(text))  # argparse has no comments
    cpu = by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert args.workers == int(cpu["requests"]["cpu"])


# ---- compose and nginx --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    return data


def test_compose_replicas_share_the_secret_behind_nginx(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"render", "lb", "engine"}
    render = services["render"]
    assert render["build"]["dockerfile"] == "docker/Dockerfile"
    assert (DOCKER / render["build"]["context"] / render["build"]["dockerfile"]).is_file()
    secret = render["environment"]["RENDER_SERVICE_STATE_SECRET"]
    assert secret.startswith("${RENDER_SERVICE_STATE_SECRET:?")  # required, never defaulted
    assert "replicas" in render["deploy"]
    grace = int(render["stop_grace_period"].removesuffix("s"))
    assert grace > GRACEFUL_SHUTDOWN_SECONDS
    for volume in [*render["volumes"], *services["lb"]["volumes"]]:
        source = volume.split(":")[0]
        if not source.startswith("$"):
            assert (DOCKER / source).is_file(), source
    (arg,) = render["command"]
    assert f"./render-service.flags:{arg.removeprefix('@')}:ro" in render["volumes"]
    lb = services["lb"]
    assert lb["depends_on"]["render"]["condition"] == "service_healthy"


def test_engine_is_optional_and_tokens_only(compose: dict[str, Any]) -> None:
    engine = compose["services"]["engine"]
    assert engine["profiles"] == ["engine"]
    assert "--tokens-only" in engine["command"]
    key = compose["services"]["render"]["environment"]["VLLM_API_KEY"]
    assert engine["environment"]["VLLM_API_KEY"] == key  # one key guards both tiers


def test_compose_default_paths_exist(compose: dict[str, Any]) -> None:
    """A variable's default in a volume source (``${MODEL_DIR:-./models}``) names a path that
    exists, so `docker compose up` works before anything is set."""
    defaults = [
        match
        for service in compose["services"].values()
        for volume in service.get("volumes", [])
        for match in re.findall(r"\$\{[A-Z_]+:-([^}]+)\}", volume.split(":/")[0])
    ]
    assert "./models" in defaults
    for default in defaults:
        path = Path(default).expanduser()
        if not path.is_absolute() and not default.startswith("~"):
            assert (DOCKER / path).is_dir(), default


def test_nginx_config_matches_compose_and_retries_posts(compose: dict[str, Any]) -> None:
    conf = (DOCKER / "nginx.conf").read_text()
    proxy = (DOCKER / "render-proxy.conf").read_text()
    lb = compose["services"]["lb"]
    mounted = dict(v.split(":")[:2] for v in lb["volumes"])
    assert mounted["./render-proxy.conf"] in conf  # the include points at the mounted file
    assert mounted["./nginx.conf"] == "/etc/nginx/nginx.conf"
    listen = re.search(r"listen (\d+);", conf)
    assert listen is not None
    assert any(p.endswith(f":{listen.group(1)}") for p in lb["ports"])
    upstream = re.search(r"upstream (\w+) \{", conf)
    assert upstream is not None
    assert f"proxy_pass http://{upstream.group(1)};" in proxy
    assert re.search(r"server render:8000 ", conf)  # the compose service name and port
    retry = re.search(r"proxy_next_upstream ([^;]+);", proxy)
    assert retry is not None
    assert {"error", "timeout", "non_idempotent"} <= set(retry.group(1).split())


# ---- Dockerfile ---------------------------------------------------------------------------------


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (DOCKER / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), rest.strip()))
    return stages


def readme_install_command() -> str:
    """The bare-machine install: the README's first command, up to starting the server."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)\n```", readme, re.S)
    assert block is not None
    install, _, start = block.group(1).partition(" && .venv/bin/render-service serve")
    assert start, "README's first command no longer installs and then serves"
    return install.strip()


def test_dockerfile_installs_like_the_readme_and_runs_as_non_root() -> None:
    build, runtime = dockerfile_stages()
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", text, re.M)
    assert build[0] == ("FROM", "${PYTHON_IMAGE} AS build")
    assert runtime[0][1].startswith("${PYTHON_IMAGE}")
    assert ("RUN", readme_install_command()) in build

    def values(stage: list[tuple[str, str]], name: str) -> list[str]:
        return [rest for instruction, rest in stage if instruction == name]

    (user,) = values(runtime, "USER")
    assert user.split(":")[0] not in {"0", "root"}
    runs = " ".join(values(runtime, "RUN"))
    for tool in ("gcc", "build-essential", "apt-get install", "pip install"):
        assert tool not in runs  # the runtime stage gets built artifacts, never builds
    (health,) = values(runtime, "HEALTHCHECK")
    assert "/health" in health
    (exposed,) = values(runtime, "EXPOSE")
    assert f"127.0.0.1:{exposed}/health" in health
    (entrypoint,) = values(runtime, "ENTRYPOINT")
    argv = yaml.safe_load(entrypoint)
    assert argv[:2] == ["render-service", "serve"]
    assert argv[argv.index("--port") + 1] == exposed
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    deployment = by_kind("Deployment")["spec"]["template"]["spec"]
    assert deployment["containers"][0]["ports"][0]["containerPort"] == int(exposed)
    assert deployment["securityContext"]["runAsUser"] == int(user.split(":")[0])
    for instruction, rest in build:
        if instruction == "COPY":
            for source in shlex.split(rest)[:-1]:
                assert (REPO / source).exists(), source


# ---- docs ---------------------------------------------------------------------------------------


def test_deployment_doc_lists_every_serve_flag() -> None:
    doc = (REPO / "docs" / "deployment.md").read_text()
    parser = build_parser()
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    serve = subcommands.choices["serve"]
    flags = [
        option
        for action in serve._actions
        for option in action.option_strings
        if option.startswith("--") and not option.startswith("--no-") and option != "--help"
    ]
    assert flags
    missing = [flag for flag in flags if f"| `{flag}` |" not in doc]
    assert not missing, f"docs/deployment.md has no row for {missing}"


def test_shipped_nginx_conf_passes_nginx_t(tmp_path: Path) -> None:
    """`nginx -t` on docker/nginx.conf, with only what needs Docker swapped out: the service name
    (resolved by Docker's DNS, and `resolve` needs nginx >= 1.27.3) and the container paths."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        pytest.skip("nginx is not installed (.ci/run installs Debian's nginx-light)")
    conf = (DOCKER / "nginx.conf").read_text()
    # Paths are quoted (the checkout or the temp dir may contain spaces), and every swap is made
    # in one pass over the shipped text, so a replacement that itself contains "/tmp/" (a
    # checkout under /tmp) is never rewritten again.
    swaps = {
        "server render:8000 resolve ": "server 127.0.0.1:8000 ",
        "/etc/nginx/render-proxy.conf": nginx_quoted(DOCKER / "render-proxy.conf"),
        "/tmp/nginx.pid": nginx_quoted(tmp_path / "nginx.pid"),
        "/tmp/client_body": nginx_quoted(tmp_path / "client_body"),
        "/tmp/proxy": nginx_quoted(tmp_path / "proxy"),
    }
    for old in swaps:
        assert old in conf, old
    conf = re.sub("|".join(map(re.escape, swaps)), lambda m: swaps[m.group(0)], conf)
    assert "/tmp/" not in re.sub(r'"[^"]*"', "", conf), "a container path was left unswapped"
    (tmp_path / "nginx.conf").write_text(conf)
    check = subprocess.run(
        [
            binary,
            "-t",
            "-p",
            str(tmp_path),
            "-e",
            str(tmp_path / "error.log"),
            "-c",
            str(tmp_path / "nginx.conf"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr
