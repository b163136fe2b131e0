"""Configuration: defaults, the YAML file with ${ENV} references, environment overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load_settings


def test_no_file_gives_working_defaults() -> None:
    """With no file and no variables: OpenAI upstream, no Redis, 32 MiB bodies, no pool cap,
    summaries on."""
    settings = load_settings(environ={})
    assert settings.upstream.base_url == "https://api.openai.com/v1"
    assert settings.anthropic.base_url == "https://api.anthropic.com"
    assert settings.redis_url is None
    assert settings.max_body_bytes == 32 * 1024 * 1024
    assert settings.upstream.max_connections is None
    assert settings.upstream.api_key is None
    assert settings.summaries is True
    assert (settings.summary_workers, settings.summary_queue) == (2, 64)
    assert settings.stream_keepalive == 15.0


def test_environment_overrides() -> None:
    """The documented variables set the upstreams and Redis."""
    settings = load_settings(
        environ={
            "CONTEXTGATE_UPSTREAM_BASE_URL": "http://127.0.0.1:9999/v1",
            "CONTEXTGATE_ANTHROPIC_BASE_URL": "http://127.0.0.1:9998",
            "REDIS_URL": "redis://127.0.0.1:6390/0",
        }
    )
    assert settings.upstream.base_url == "http://127.0.0.1:9999/v1"
    assert settings.anthropic.base_url == "http://127.0.0.1:9998"
    assert settings.redis_url == "redis://127.0.0.1:6390/0"


def test_yaml_file_with_env_references(tmp_path: Path) -> None:
    """A file from CONTEXTGATE_CONFIG is read, ${NAME} and ${NAME:-default} substituted,
    and its models and policy take effect."""
    path = tmp_path / "contextgate.yaml"
    path.write_text(
        "upstream:\n"
        "  base_url: ${UPSTREAM:-http://127.0.0.1:1/v1}\n"
        "  api_key: ${SECRET_KEY}\n"
        "  read_timeout: 30\n"
        "max_body_bytes: 1048576\n"
        "models:\n"
        "  - {pattern: 'local-*', context_window: 32000, output_reserve: 2000}\n"
        "policy:\n"
        "  trigger: 0.6\n"
        "  keep-images: 3\n"
    )
    settings = load_settings(environ={"CONTEXTGATE_CONFIG": str(path), "SECRET_KEY": "sk-abc"})
    assert settings.upstream.base_url == "http://127.0.0.1:1/v1"
    assert settings.upstream.api_key == "sk-abc"
    assert settings.upstream.read_timeout == 30
    assert settings.max_body_bytes == 1_048_576
    assert settings.models[0].context_window == 32_000
    policy = settings.default_policy()
    assert (policy.trigger, policy.keep_images) == (0.6, 3)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("upstream:\n  base_url: ftp://x\n", "http(s) URL"),
        ("upstream:\n  colour: red\n", "unknown field `colour`"),
        ("upstream:\n  read_timeout: -1\n", "read_timeout must be positive"),
        ("upstream:\n  pool_shards: 0\n", "pool_shards"),
        ("max_body_bytes: ten\n", "Expected `int`"),
        ("policy:\n  trigger: 9\n", "trigger"),
        ("models:\n  - {pattern: x, context_window: 10}\n", "context_window"),
        ("models:\n  - {pattern: x, context_window: 9000, windw: 1}\n", "unknown field 'windw'"),
        ("models:\n  - {pattern: x, context_window: 9000, family: martian}\n", "family"),
        ("prices:\n  - {pattern: x, input: 1, output: 2, cahced_input: 1}\n", "'cahced_input'"),
        ("prices:\n  - {pattern: x, input: 1}\n", "output"),
        ("inspector:\n  requests_per_conversation: 0\n", "requests_per_conversation"),
        ("inspector:\n  detailed_requests: 300\n", "detailed_requests"),
        ("inspector:\n  ui: maybe\n", "Expected `bool`"),
        ("upstream:\n  api_key: ${MISSING_SECRET}\n", "MISSING_SECRET"),
        ("- just\n- a list\n", "mapping"),
        ("upstream: [unclosed\n", "not valid YAML"),
        ("summary_workers: 0\n", "summary_workers must be 1-64"),
        ("stream_keepalive: 0.01\n", "stream_keepalive must be 0 (off)"),
        ("stream_keepalive: -1\n", "stream_keepalive must be 0 (off)"),
    ],
)
def test_bad_configuration_names_the_problem(tmp_path: Path, text: str, fragment: str) -> None:
    """A bad file stops start-up with a message naming the field or reference."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    assert fragment in str(caught.value)


def test_prices_and_the_inspector_from_the_file(tmp_path: Path) -> None:
    """A configured price table extends the built-in one; the inspector can be switched."""
    path = tmp_path / "contextgate.yaml"
    path.write_text(
        "prices:\n  - {pattern: my-model-*, input: 0.5, output: 1.5, cached_input: 0.05}\n"
        "inspector:\n  ui: false\n  requests_per_conversation: 50\n"
    )
    settings = load_settings(path, environ={})
    assert settings.prices[0].cached_input == 0.05
    assert settings.prices[0].cache_write is None
    assert settings.inspector.enabled
    assert not settings.inspector.ui
    assert settings.inspector.requests_per_conversation == 50


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A configuration path that does not exist is reported as such."""
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "absent.yaml", environ={})


def test_example_configuration_loads() -> None:
    """The example file shipped in the repository is a valid configuration."""
    example = Path(__file__).resolve().parents[3] / "contextgate.example.yaml"
    settings = load_settings(example, environ={})
    assert settings.upstream.base_url == "https://api.openai.com/v1"
    assert settings.redis_url is None
    assert settings.models[0].pattern == "my-vllm-*"


def test_example_tenant_loads_when_uncommented(tmp_path: Path) -> None:
    """The commented tenant in the example file is a valid tenant as it stands."""
    example = Path(__file__).resolve().parents[3] / "contextgate.example.yaml"
    lines = example.read_text().splitlines()
    start = lines.index("# tenants:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        block.append(line[2:])
    text = "\n".join(block).replace("<64 hex digits>", "0" * 64)
    (tmp_path / "tenants.yaml").write_text(text)
    environ = {"SEARCH_TEAM_OPENAI_KEY": "sk-a", "SEARCH_TEAM_ANTHROPIC_KEY": "sk-ant-b"}
    tenant = load_settings(tmp_path / "tenants.yaml", environ=environ).tenants[0]
    assert (tenant.name, tenant.models, tenant.limits.concurrency) == (  # type: ignore[union-attr]
        "search-team",
        ("gpt-4o*", "claude-sonnet-*"),
        16,
    )
    assert tenant.bounds["summary-model"] is False
