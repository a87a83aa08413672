"""Deployment files under deploy/: they parse, and they say what the deployment relies on.

No Docker engine or cluster is needed. `docker compose config` is not used: the Compose CLI
plugin is not installed on the project's machines (`docker compose` is an unknown command there),
so the compose file's structure is checked here instead. `kubectl kustomize` (client-side, no
cluster) is run when kubectl is installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
WEBSOCKET_ROUTES = ("/twilio/stream", "/telnyx/stream", "/vonage/stream", "/calls/x/live")
DEFAULT_DRAIN_TIMEOUT_S = 60.0  # Settings.drain_timeout_s; README: HOTLINE_DRAIN_TIMEOUT_S


def load_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text("utf-8")) if doc is not None]


def kustomization() -> dict[str, Any]:
    doc = yaml.safe_load((K8S / "kustomization.yaml").read_text("utf-8"))
    assert isinstance(doc, dict)
    return doc


def k8s_objects() -> list[dict[str, Any]]:
    """The objects `kubectl apply -k deploy/k8s` applies (not the optional files and patches)."""
    objects = []
    for name in kustomization()["resources"]:
        objects += [doc for doc in load_all(K8S / name) if isinstance(doc, dict) and "kind" in doc]
    return objects


def one(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def seconds(duration: str | int | float) -> float:
    """A compose duration ("90s", "1m30s", "2m") in seconds."""
    if isinstance(duration, int | float):
        return float(duration)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * scale[u] for n, u in parts)


def compose() -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "compose.yaml").read_text("utf-8"))
    assert isinstance(doc, dict)
    return doc


def test_every_yaml_file_parses() -> None:
    paths = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
    assert len(paths) >= 10, paths
    for path in paths:
        assert load_all(path), f"{path} is empty"


def test_deployment_probes_and_grace_period_cover_the_drain() -> None:
    deployment = one("Deployment", "hotline")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert spec["replicas"] == 2
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    (container,) = [c for c in pod["containers"] if c["name"] == "hotline"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == 8080
    requests = container["resources"]["requests"]
    assert requests["cpu"] and requests["memory"]
    assert container["resources"]["limits"]["memory"]
    assert pod["securityContext"]["runAsNonRoot"] is True

    # The drain timeout the pod runs with: its own env, else the ConfigMaps it loads, else
    # Hotline's default. The kubelet must not SIGKILL before the drain is over.
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(one("ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    drain = float(env.get("HOTLINE_DRAIN_TIMEOUT_S", DEFAULT_DRAIN_TIMEOUT_S))
    assert pod["terminationGracePeriodSeconds"] > drain
    assert "HOTLINE_REDIS_URL" in env

    secret_refs = [s["secretRef"]["name"] for s in container["envFrom"] if "secretRef" in s]
    assert secret_refs == ["hotline-secrets"]
    example = yaml.safe_load((K8S / "secret.example.yaml").read_text("utf-8"))
    assert example["metadata"]["name"] == "hotline-secrets"
    assert {"HOTLINE_API_TOKEN", "HOTLINE_TELEPHONY__TWILIO_AUTH_TOKEN"} <= set(
        example["stringData"]
    )


def test_service_selects_the_deployment_pods() -> None:
    service = one("Service", "hotline")
    labels = one("Deployment", "hotline")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] in ("http", 8080)


def test_hpa_scales_the_deployment_on_active_calls() -> None:
    hpa = one("HorizontalPodAutoscaler", "hotline")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "hotline",
    }
    assert hpa["spec"]["minReplicas"] >= 2
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "hotline_active_calls"
    assert metric["pods"]["target"]["type"] == "AverageValue"
    adapter = yaml.safe_load((K8S / "prometheus-adapter-values.yaml").read_text("utf-8"))
    (rule,) = adapter["rules"]["custom"]
    assert "hotline_active_calls" in rule["seriesQuery"]
    assert rule["name"]["as"] == "hotline_active_calls"


def test_redis_statefulset_persists_with_appendonly() -> None:
    redis = one("StatefulSet", "redis")
    spec = redis["spec"]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    (container,) = spec["template"]["spec"]["containers"]
    args = [*container.get("command", []), *container.get("args", [])]
    assert args[args.index("--appendonly") + 1] == "yes"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/data"
    governing = one("Service", spec["serviceName"])
    assert governing["spec"]["clusterIP"] == "None"
    assert one("ConfigMap", "hotline-config")["data"]["HOTLINE_REDIS_URL"].startswith(
        "redis://redis:6379"
    )


def redis_options(args: list[str]) -> dict[str, str]:
    """A `redis-server --name value ...` command line's options, by name."""
    options, name = {}, None
    for arg in args:
        if arg.startswith("--"):
            name = arg[2:]
            options[name] = ""
        elif name is not None:
            options[name] = (options[name] + " " + arg).strip()
    return options


def test_every_bundled_redis_persists_every_second_and_never_evicts() -> None:
    """Redis holds what Hotline promises (turns kept, call ids never reused): it must keep its
    data across a restart (append-only file, fsync every second at least) and must not evict
    keys when full (deploy/README.md, "Redis must persist")."""
    (container,) = one("StatefulSet", "redis")["spec"]["template"]["spec"]["containers"]
    command = compose()["services"]["redis"]["command"]
    bundled = {
        "k8s/redis.yaml": [*container.get("command", []), *container.get("args", [])],
        "compose.yaml": command.split() if isinstance(command, str) else command,
    }
    for where, args in bundled.items():
        options = redis_options([str(a) for a in args])
        assert options.get("appendonly") == "yes", where
        assert options.get("appendfsync") in ("everysec", "always"), where
        assert options.get("maxmemory-policy", "noeviction") == "noeviction", where
        assert "maxmemory-policy" in options, f"{where}: pin noeviction, do not rely on defaults"
    guide = " ".join((DEPLOY / "README.md").read_text("utf-8").split())  # wrapping aside
    assert "## Redis must persist" in guide and "appendfsync everysec" in guide


def test_kustomization_lists_existing_files() -> None:
    resources = kustomization()["resources"]
    for name in resources:
        assert (K8S / name).is_file(), name
    assert {"deployment.yaml", "service.yaml", "redis.yaml", "hpa.yaml"} <= set(resources)
    assert "secret.example.yaml" not in resources  # placeholder secrets are never applied


def test_host_network_patch_targets_the_deployment() -> None:
    patch = yaml.safe_load((K8S / "webrtc-hostnetwork.yaml").read_text("utf-8"))
    assert (patch["kind"], patch["metadata"]["name"]) == ("Deployment", "hotline")
    pod = patch["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    (container,) = pod["containers"]
    assert container["name"] == "hotline"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert env["HOTLINE_WEBRTC__ICE_HOST_ADDRESSES"]["value"] == '["$(NODE_IP)"]'


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_builds() -> None:
    built = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    kinds = {doc["kind"] for doc in yaml.safe_load_all(built.stdout) if doc}
    expected = {"Deployment", "Service", "StatefulSet", "HorizontalPodAutoscaler", "ConfigMap"}
    assert expected <= kinds


def test_compose_has_redis_two_workers_and_a_proxy() -> None:
    services = compose()["services"]
    redis = services["redis"]
    command = redis["command"]
    command = command.split() if isinstance(command, str) else command
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(str(v).endswith(":/data") for v in redis["volumes"])
    assert redis["healthcheck"]["test"]

    workers = {name: s for name, s in services.items() if name.startswith("hotline-")}
    assert set(workers) == {"hotline-a", "hotline-b"}
    for name, worker in workers.items():
        build = worker["build"]
        context = (DEPLOY / build["context"]).resolve()
        assert context == ROOT, name
        assert (context / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
        assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
        environment = worker["environment"]
        assert environment["HOTLINE_REDIS_URL"].startswith("redis://redis:6379")
        drain = float(environment.get("HOTLINE_DRAIN_TIMEOUT_S", DEFAULT_DRAIN_TIMEOUT_S))
        assert seconds(worker["stop_grace_period"]) > drain, name
        assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"

    proxy = services["proxy"]
    assert proxy["image"].startswith("nginx")
    assert any("80" in str(port).split(":")[-1] for port in proxy["ports"])
    mounted = [str(v).split(":") for v in proxy["volumes"]]
    assert any(target == "/etc/nginx/nginx.conf" for _, target, *_ in mounted)
    for source, *_ in mounted:
        assert (DEPLOY / source).exists(), source


def nginx_conf() -> str:
    text = (DEPLOY / "nginx" / "nginx.conf").read_text("utf-8")
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


def test_proxy_passes_websocket_upgrades_to_both_workers() -> None:
    conf = nginx_conf()
    assert re.search(r"map\s+\$http_upgrade\s+\$connection_upgrade\s*\{", conf)
    assert re.search(r"proxy_set_header\s+Upgrade\s+\$http_upgrade\s*;", conf)
    assert re.search(r"proxy_set_header\s+Connection\s+\$connection_upgrade\s*;", conf)
    assert re.search(r"proxy_http_version\s+1\.1\s*;", conf)
    # Hotline builds Twilio's stream URL and checks signatures from these.
    assert re.search(r"proxy_set_header\s+X-Forwarded-Proto\s", conf)
    assert re.search(r"proxy_set_header\s+X-Forwarded-Host\s", conf)

    upstream = re.search(r"upstream\s+(\w+)\s*\{(.*?)\}", conf, re.S)
    assert upstream is not None
    servers = re.findall(r"server\s+([\w.-]+):8080\b", upstream.group(2))
    assert sorted(servers) == ["hotline-a", "hotline-b"]
    assert set(servers) <= set(compose()["services"])

    # Each websocket route reaches the workers through a location with a long read timeout.
    locations = re.findall(r"location\s+(~|=)?\s*(\S+)\s*\{(.*?)\}", conf, re.S)
    for route in WEBSOCKET_ROUTES:
        matching = [
            body
            for modifier, pattern, body in locations
            if modifier == "~" and re.search(pattern, route)
        ]
        assert matching, f"no websocket location for {route}"
        body = matching[0]
        assert f"proxy_pass http://{upstream.group(1)}" in body
        timeout = re.search(r"proxy_read_timeout\s+(\d+)s", body)
        assert timeout is not None and int(timeout.group(1)) >= 600, route


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text("utf-8").replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_runs_hotline_as_non_root_with_models_baked_in() -> None:
    instructions = dockerfile_instructions()
    stages = [arg for op, arg in instructions if op == "FROM"]
    assert stages and all(s.startswith(("python:3.11-slim", "${PYTHON_IMAGE}")) for s in stages)
    args = dict(a.split("=", 1) for op, a in instructions if op == "ARG" and "=" in a)
    assert args.get("PYTHON_IMAGE", "python:3.11-slim").startswith("python:3.11-slim")

    final = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    users = [arg for op, arg in final if op == "USER"]
    assert users, "no USER in the final stage"
    assert users[-1].split(":")[0] not in ("root", "0")
    assert ("EXPOSE", "8080") in final
    assert ("STOPSIGNAL", "SIGTERM") in final
    healthcheck = " ".join(arg for op, arg in final if op == "HEALTHCHECK")
    assert "/healthz" in healthcheck
    (cmd,) = [arg for op, arg in final if op == "CMD"]
    assert yaml.safe_load(cmd) == ["hotline", "serve", "--host", "0.0.0.0", "--port", "8080"]

    runs = " ".join(arg for op, arg in instructions if op == "RUN")
    assert "pip install ." in runs
    assert "[dev]" not in runs
    assert "resolve_model_dir('base')" in runs or 'resolve_model_dir("base")' in runs
    assert any(op == "ENV" and "HOTLINE_CACHE_DIR=" in arg for op, arg in final)


def test_build_context_filter_keeps_what_the_dockerfile_copies() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text("utf-8").splitlines()
    patterns = [p.strip() for p in ignore if p.strip() and not p.startswith("#")]
    assert patterns[0] == "*"  # everything out, then what the image needs back in
    kept = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for op, arg in dockerfile_instructions():
        if op != "COPY" or arg.startswith("--from"):
            continue
        *sources, _target = arg.split()
        for source in sources:
            assert (ROOT / source).exists(), source
            assert source.rstrip("/") in kept, f"{source} is excluded from the build context"
