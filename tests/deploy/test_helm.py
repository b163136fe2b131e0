"""The Helm chart ``helm/contextgate``: it lints, renders, and renders what an operator relies on.

The pinned helm binary at ``.tools/helm`` (``make .tools/helm``) lints and renders the
chart with its default values and with ``ci/full-values.yaml``, which switches every
optional part on; the rendered objects are read back as YAML and checked.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / ".tools" / "helm"
CHART = ROOT / "helm" / "contextgate"
FULL = CHART / "ci" / "full-values.yaml"
CONFIG_PATH = "/etc/contextgate/contextgate.yaml"
CREDENTIALS = (
    "CONTEXTGATE_UPSTREAM_API_KEY",
    "CONTEXTGATE_ANTHROPIC_API_KEY",
    "CONTEXTGATE_STORE_SECRET",
    "REDIS_URL",
    "OTEL_EXPORTER_OTLP_HEADERS",
)

Objects = list[dict[str, Any]]


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    if not HELM.is_file():
        pytest.fail(f"{HELM} is missing: run `make .tools/helm` (it fetches the pinned helm)")
    return subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render(*options: str) -> Objects:
    done = helm("template", "gate", str(CHART), "--namespace", "llm", *options)
    assert done.returncode == 0, done.stderr
    return [item for item in yaml.safe_load_all(done.stdout) if item]


def one(objects: Objects, kind: str, component: str = "gateway") -> dict[str, Any]:
    found = [
        item
        for item in objects
        if item["kind"] == kind
        and item["metadata"]["labels"].get("app.kubernetes.io/component", "gateway") == component
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects for {component}"
    return found[0]


def gateway_container(objects: Objects) -> dict[str, Any]:
    containers = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return next(item for item in containers if item["name"] == "gateway")


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def gateway_yaml(objects: Objects) -> str:
    text: str = one(objects, "ConfigMap")["data"]["contextgate.yaml"]
    return text


@pytest.fixture(scope="module")
def default() -> Objects:
    return render()


@pytest.fixture(scope="module")
def full() -> Objects:
    return render("--values", str(FULL))


def both(default: Objects, full: Objects) -> Iterator[Objects]:
    yield default
    yield full


@pytest.mark.parametrize("values", [[], ["--values", str(FULL)]], ids=["default", "full"])
def test_the_chart_lints_strictly(values: list[str]) -> None:
    """``helm lint --strict`` finds nothing with the default and with the full values."""
    done = helm("lint", "--strict", str(CHART), *values)
    assert done.returncode == 0, done.stdout + done.stderr


def test_probes_watch_healthz_and_readyz(default: Objects, full: Objects) -> None:
    """Liveness asks /healthz and readiness /readyz, on the container's http port."""
    for objects in both(default, full):
        container = gateway_container(objects)
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in container["ports"]


def test_pods_run_non_root_on_a_read_only_root(default: Objects, full: Objects) -> None:
    """The gateway runs as uid 10001, read-only, without privileges or capabilities."""
    for objects in both(default, full):
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        container = gateway_container(objects)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        security = container["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["runAsUser"] == 10001
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        tmp = next(item for item in container["volumeMounts"] if item["mountPath"] == "/tmp")
        volumes = {item["name"]: item for item in pod["volumes"]}
        assert "emptyDir" in volumes[tmp["name"]]


def test_the_config_is_mounted_read_only_where_contextgate_config_points(
    default: Objects, full: Objects
) -> None:
    """The ConfigMap's contextgate.yaml is mounted read-only at CONTEXTGATE_CONFIG's path."""
    for objects in both(default, full):
        configmap = one(objects, "ConfigMap")
        container = gateway_container(objects)
        assert env_of(container)["CONTEXTGATE_CONFIG"]["value"] == CONFIG_PATH
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        volumes = {item["name"]: item for item in pod["volumes"]}
        mount = next(
            item
            for item in container["volumeMounts"]
            if volumes[item["name"]].get("configMap", {}).get("name")
            == configmap["metadata"]["name"]
        )
        # A whole-ConfigMap mount shows each key as a file; a subPath mount shows one key.
        key = mount.get("subPath", "contextgate.yaml")
        path = mount["mountPath"] if "subPath" in mount else f"{mount['mountPath']}/{key}"
        assert key in configmap["data"]
        assert path == CONFIG_PATH
        assert mount["readOnly"] is True


def test_the_config_checksum_rolls_the_pods(default: Objects, full: Objects) -> None:
    """The pod template's config checksum changes with the configuration."""
    sums = {
        one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        for objects in both(default, full)
    }
    assert len(sums) == 2


def test_credentials_come_from_secret_references_only(full: Objects) -> None:
    """Every credential the full values wire is a secretKeyRef, never a literal value."""
    env = env_of(gateway_container(full))
    for name in (*CREDENTIALS, "SEARCH_TEAM_OPENAI_KEY", "SEARCH_TEAM_ANTHROPIC_KEY"):
        assert name in env, name
        assert "value" not in env[name], name
        assert set(env[name]["valueFrom"]) == {"secretKeyRef"}, name
    assert env["CONTEXTGATE_UPSTREAM_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "contextgate-credentials",
        "key": "openai-api-key",
    }
    assert env["REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "contextgate-redis",
        "key": "url",
    }


def test_no_secret_is_rendered(default: Objects, full: Objects) -> None:
    """The chart never creates a Secret: credentials live where the operator keeps them."""
    for objects in both(default, full):
        assert [item["metadata"]["name"] for item in objects if item["kind"] == "Secret"] == []


def test_no_credential_without_a_secret_name(default: Objects) -> None:
    """By default no credential variable is set (passthrough mode, store secret in Redis)."""
    env = env_of(gateway_container(default))
    assert not set(CREDENTIALS[:3]) & set(env)


def test_redis_url_goes_to_the_in_chart_redis_by_default(default: Objects) -> None:
    """The default values run one Redis in the chart and point REDIS_URL at its Service."""
    redis = one(default, "Service", "redis")
    url = env_of(gateway_container(default))["REDIS_URL"]["value"]
    assert url == f"redis://{redis['metadata']['name']}:6379/0"
    assert redis["spec"]["ports"][0]["port"] == 6379
    deployment = one(default, "Deployment", "redis")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("redis:7")
    # Never evict: an evicted object is a ref that can no longer be restored.
    policy = container["args"].index("--maxmemory-policy")
    assert container["args"][policy + 1] == "noeviction"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert redis["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert not any(item["kind"] == "PersistentVolumeClaim" for item in default)


def test_the_gateway_service_selects_only_gateway_pods(default: Objects) -> None:
    """The gateway Service's selector matches the gateway pods and not the Redis pod."""
    selector = one(default, "Service")["spec"]["selector"].items()
    gateway = one(default, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    redis = one(default, "Deployment", "redis")["spec"]["template"]["metadata"]["labels"].items()
    assert selector <= gateway
    assert not selector <= redis


def test_external_redis_replaces_the_in_chart_one(full: Objects) -> None:
    """With an external Redis, no Redis runs in the chart."""
    assert not [item for item in full if item["metadata"]["name"].endswith("-redis")]


@pytest.mark.parametrize(
    ("options", "sleep", "grace", "period"),
    [
        ([], 5, 20, 30),
        (["shutdown.preStopSleepSeconds=10", "shutdown.graceSeconds=45"], 10, 45, 60),
        (["shutdown.preStopSleepSeconds=0", "shutdown.graceSeconds=7.5"], 0, 7.5, 13),
    ],
    ids=["default", "longer", "fractional"],
)
def test_termination_grace_covers_pre_stop_and_shutdown_grace(
    options: list[str], sleep: int, grace: float, period: int
) -> None:
    """terminationGracePeriodSeconds is the preStop sleep, shutdown_grace (rounded up) and 5 s."""
    objects = render(*[word for option in options for word in ("--set", option)])
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] == [
        "sleep",
        str(sleep),
    ]
    assert yaml.safe_load(gateway_yaml(objects))["shutdown_grace"] == grace
    assert pod["terminationGracePeriodSeconds"] == period


def test_otel_variables_only_when_an_endpoint_is_set(default: Objects, full: Objects) -> None:
    """No OTEL_* variable by default; the full values set endpoint, service, sampler."""
    assert not [name for name in env_of(gateway_container(default)) if name.startswith("OTEL_")]
    env = env_of(gateway_container(full))
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == (
        "http://otel-collector.observability.svc:4318"
    )
    assert env["OTEL_SERVICE_NAME"]["value"] == "contextgate-prod"
    assert "deployment.environment=production" in env["OTEL_RESOURCE_ATTRIBUTES"]["value"]
    assert env["OTEL_TRACES_SAMPLER"]["value"] == "parentbased_traceidratio"
    assert env["OTEL_TRACES_SAMPLER_ARG"]["value"] == "0.2"


def test_scaling_and_scraping_objects_only_when_enabled(default: Objects, full: Objects) -> None:
    """HPA, PDB and ServiceMonitor are absent by default and present in the full values."""
    optional = {"HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"}
    assert not optional & {item["kind"] for item in default}
    assert optional <= {item["kind"] for item in full}
    hpa = one(full, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == one(full, "Deployment")["metadata"]["name"]
    assert "replicas" not in one(full, "Deployment")["spec"]
    monitor = one(full, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"][0]["port"] == "http"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        one(full, "Service")["metadata"]["labels"].items()
    )


def test_a_disruption_budget_comes_with_several_replicas() -> None:
    """replicaCount above 1 (with Redis) brings a PodDisruptionBudget over the gateway pods."""
    objects = render("--set", "replicaCount=2")
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= (
        one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )


@pytest.mark.parametrize(
    "options",
    [
        ["--set", "replicaCount=3", "--set", "redis.enabled=false"],
        ["--set", "autoscaling.enabled=true", "--set", "redis.enabled=false"],
    ],
    ids=["replicas", "autoscaling"],
)
def test_several_replicas_without_redis_are_refused(options: list[str]) -> None:
    """Replicas share state only through Redis: several of them without one do not render."""
    done = helm("template", "gate", str(CHART), *options)
    assert done.returncode != 0
    assert "needs Redis" in done.stderr


def test_one_replica_without_redis_renders() -> None:
    """A single replica may keep its store in memory: no Redis, no REDIS_URL."""
    objects = render("--set", "redis.enabled=false")
    assert "REDIS_URL" not in env_of(gateway_container(objects))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--set", "config.shutdown_grace=5"], "shutdown.graceSeconds"),
        (["--set", "secrets.keys.storeSecret=store"], "secrets.existingSecret"),
        (["--set", "externalRedis.url=redis://cache:6379/0"], "choose one Redis"),
    ],
    ids=["shutdown_grace", "key without secret", "two redis"],
)
def test_contradictory_values_are_refused(options: list[str], message: str) -> None:
    """Values that contradict each other stop the render with a message naming the fix."""
    done = helm("template", "gate", str(CHART), *options)
    assert done.returncode != 0
    assert message in done.stderr


@pytest.mark.parametrize("which", ["default", "full"])
def test_the_gateway_accepts_the_rendered_config(
    which: str, default: Objects, full: Objects, tmp_path: Path
) -> None:
    """The ConfigMap's YAML loads with the gateway's settings loader, shutdown_grace included."""
    objects = default if which == "default" else full
    path = tmp_path / "contextgate.yaml"
    path.write_text(gateway_yaml(objects), encoding="utf-8")
    environ = {
        "SEARCH_TEAM_OPENAI_KEY": "sk-search-team",
        "SEARCH_TEAM_ANTHROPIC_KEY": "sk-ant-search-team",
        "CONTEXTGATE_UPSTREAM_API_KEY": "sk-deployment",
    }
    settings = load_settings(path, environ)
    assert settings.shutdown_grace == (20 if which == "default" else 45)
    if which == "full":
        assert [tenant.name for tenant in settings.tenants] == ["search-team", "research"]
        assert settings.tenants[0].upstream_api_key == "sk-search-team"
        assert settings.bounds["mode"] == ["summarize", "truncate", "off"]
