"""The relay of every OpenAI route the gateway does not manage, driven by the official
openai SDK through a real gateway against the loopback mock: each answer equals the one
the SDK gets from the mock directly, and the mock sees the same request."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import openai
import pytest

from gateway.config import Settings, TenantSettings, UpstreamSettings
from gateway.routes.relay import route_label, upstream_target
from gateway.tenancy.tenants import hash_key
from tests.conftest import settings_for
from tests.harness import GatewayServer, ServeProcess
from tests.mock_upstream import (
    Hang,
    JSONReply,
    MockUpstream,
    OpenAIRoutes,
    Received,
    SSEReply,
    responses_stream,
)

T = TypeVar("T")


def client(base_url: str, api_key: str = "sk-test-key") -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)


@pytest.fixture
def routes(upstream: MockUpstream) -> OpenAIRoutes:
    """The mock answering the relayed OpenAI routes."""
    upstream.handler = handler = OpenAIRoutes()
    return handler


def same_request(sent: Received, relayed: Received) -> None:
    """The mock saw the same method, request-target (path and query, byte for byte) and
    body from the gateway as from the SDK directly."""
    assert (relayed.method, relayed.path, relayed.body) == (sent.method, sent.path, sent.body)


def both(upstream: MockUpstream, base_url: str, call: Callable[[openai.OpenAI], T]) -> tuple[T, T]:
    """``call``'s result directly against the mock, then through the gateway at
    ``base_url``; the mock received the same request both times."""
    with client(upstream.base_url) as direct, client(base_url) as via:
        expected = call(direct)
        sent = upstream.received[-1]
        got = call(via)
        relayed = upstream.received[-1]
    assert relayed is not sent
    same_request(sent, relayed)
    return expected, got


def get_target(base: str, target: bytes) -> httpx.Response:
    """``GET`` with ``target`` as the request line's target, byte for byte."""
    with httpx.Client() as http:
        return http.get(base, extensions={"target": target})


def dumped(value: Any) -> Any:
    return value.model_dump() if hasattr(value, "model_dump") else value


def test_embeddings_equal_direct(
    gateway: GatewayServer, upstream: MockUpstream, routes: OpenAIRoutes
) -> None:
    """``embeddings.create`` through the gateway equals the direct call."""
    expected, got = both(
        upstream,
        gateway.base_url,
        lambda c: c.embeddings.create(model="text-embedding-3-small", input="hello"),
    )
    assert dumped(got) == dumped(expected)
    assert got.data[0].embedding == [0.25, -0.5, 0.125]


def test_stored_completions_equal_direct(
    gateway: GatewayServer, upstream: MockUpstream, routes: OpenAIRoutes
) -> None:
    """Stored chat completions (list with ``metadata[...]`` filters, retrieve, update,
    messages, delete) are relayed, query strings byte for byte; none runs the pipeline."""
    calls: list[Callable[[openai.OpenAI], Any]] = [
        lambda c: c.chat.completions.list(metadata={"team": "a b", "k[x]": "1"}, limit=2),
        lambda c: c.chat.completions.retrieve("chatcmpl-abc123"),
        lambda c: c.chat.completions.update("chatcmpl-abc123", metadata={"stage": "done"}),
        lambda c: c.chat.completions.messages.list("chatcmpl-abc123", limit=5, order="asc"),
        lambda c: c.chat.completions.delete("chatcmpl-abc123"),
    ]
    for call in calls:
        expected, got = both(upstream, gateway.base_url, call)
        assert dumped(got) == dumped(expected)
    listed = upstream.received[0]
    assert listed.method == "GET"
    assert "metadata%5Bteam%5D=a+b" in listed.path
    assert [r.method for r in upstream.received[-2:]] == ["DELETE", "DELETE"]
    updated = [r for r in upstream.received if r.method == "POST"]
    assert updated[-1].json() == {"metadata": {"stage": "done"}}


def test_model_id_with_colons(
    gateway: GatewayServer, upstream: MockUpstream, routes: OpenAIRoutes
) -> None:
    """A fine-tuned model's id, colons and all, reaches the upstream as the SDK sent it,
    to retrieve and to delete it."""
    model = "ft:gpt-4o-mini:org:suffix:abc123"
    for call in (lambda c: c.models.retrieve(model), lambda c: c.models.delete(model)):
        expected, got = both(upstream, gateway.base_url, call)
        assert dumped(got) == dumped(expected)
        assert got.id == model
    assert upstream.received[-1].path == f"/v1/models/{model}"


def test_audio_speech_is_binary(
    gateway: GatewayServer, upstream: MockUpstream, routes: OpenAIRoutes
) -> None:
    """A binary audio answer arrives byte for byte, with its content type."""
    expected, got = both(
        upstream,
        gateway.base_url,
        lambda c: c.audio.speech.with_raw_response.create(
            model="gpt-4o-mini-tts", voice="alloy", input="Hello."
        ),
    )
    assert got.content == expected.content == OpenAIRoutes.SPEECH
    assert got.headers["content-type"] == "audio/mpeg"
    assert got.headers["x-contextgate-request-id"].startswith("cg-")


def test_streamed_responses_equal_direct(
    gateway: GatewayServer, upstream: MockUpstream, routes: OpenAIRoutes
) -> None:
    """A streamed ``responses.create`` yields the same events through the gateway as
    directly, and the bytes on the wire are the upstream's."""
    expected, got = both(
        upstream,
        gateway.base_url,
        lambda c: [
            e.model_dump() for e in c.responses.create(model="gpt-4o", input="Hi", stream=True)
        ],
    )
    assert got == expected
    assert got[-1]["type"] == "response.completed"
    assert "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta") == (
        "Hello from the mock."
    )
    body = {"model": "gpt-4o", "input": "Hi", "stream": True}
    with httpx.stream("POST", f"{gateway.base_url}/responses", json=body) as raw:
        assert raw.headers["content-type"].startswith("text/event-stream")
        assert raw.read() == b"".join(responses_stream("gpt-4o"))


def test_file_upload_and_download(
    gateway: GatewayServer, upstream: MockUpstream, routes: OpenAIRoutes
) -> None:
    """A multipart file upload reaches the upstream as the SDK wrote it, and the file's
    content comes back byte for byte."""
    content = os.urandom(300_000)
    with client(upstream.base_url) as direct, client(gateway.base_url) as via:
        expected = direct.files.create(file=("data.jsonl", content), purpose="batch")
        sent = upstream.received[-1]
        got = via.files.create(file=("data.jsonl", content), purpose="batch")
        relayed = upstream.received[-1]
        assert via.files.content(got.id).content == content
        assert direct.files.content(got.id).content == content
    assert got.model_dump() | {"id": ""} == expected.model_dump() | {"id": ""}
    assert _unbounded(relayed) == _unbounded(sent)
    assert relayed.headers["content-length"] == str(len(relayed.body))


def _unbounded(received: Received) -> bytes:
    """A multipart body with its (random) boundary replaced by a fixed one."""
    boundary = received.headers["content-type"].split("boundary=")[1].strip('"')
    return received.body.replace(boundary.encode(), b"BOUNDARY")


def test_request_target_is_byte_identical(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """Path and query arrive upstream exactly as the client sent them: nothing decoded,
    re-encoded or reordered."""
    target = b"/v1/vector_stores/vs_1:a%3Ab/files?b[]=1&a=%2F&c=x%20y+z&d=%7e&&e"
    for base in (upstream.base_url, gateway.base_url):
        upstream.push(JSONReply({"ok": True}))
        answer = get_target(base, target)
        assert answer.json() == {"ok": True}
    assert [r.path.encode() for r in upstream.received] == [target, target]


def test_headers_and_callers_key(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """In passthrough mode the caller's key goes upstream with its other headers; the
    gateway's own headers, cookies and hop-by-hop headers do not; the upstream's headers
    come back with the gateway's request id."""
    upstream.push(JSONReply({"ok": True}, headers={"openai-processing-ms": "7"}))
    answer = httpx.post(
        f"{gateway.base_url}/moderations",
        content=b'{"input": "hi"}',
        headers={
            "authorization": "Bearer sk-caller",
            "content-type": "application/json",
            "openai-organization": "org-1",
            "x-contextgate-conversation": "c1",
            "cookie": "a=b",
            "te": "trailers",
        },
    )
    assert answer.status_code == 200
    assert answer.headers["openai-processing-ms"] == "7"
    assert answer.headers["x-request-id"] == "req_mock"
    assert answer.headers["x-contextgate-request-id"].startswith("cg-")
    sent = upstream.received[-1]
    assert sent.headers["authorization"] == "Bearer sk-caller"
    assert sent.headers["openai-organization"] == "org-1"
    assert not {"x-contextgate-conversation", "cookie", "te"} & set(sent.headers)
    assert sent.body == b'{"input": "hi"}'


def test_upstream_error_relayed_with_key_redacted(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """An upstream error comes back with its status and body, minus the key it quotes."""
    error = {"error": {"message": "Incorrect API key provided: sk-secret-123.", "code": "k"}}
    upstream.push(JSONReply(error, status=401))
    with (
        client(gateway.base_url, "sk-secret-123") as via,
        pytest.raises(openai.AuthenticationError) as caught,
    ):
        via.files.list()
    assert caught.value.status_code == 401
    assert "sk-secret-123" not in caught.value.response.text
    assert "[redacted]" in caught.value.response.text


def test_unknown_and_refused_paths(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """Unknown paths outside ``/v1/`` and under the gateway's own ``/v1/messages`` and
    ``/v1/context`` are 404s in their API's envelope, a path that climbs with ``..`` is a
    400, and none reaches the upstream; the gateway's own routes still answer."""
    for path in ("/nope", "/v2/files", "/v1/context/nope", "/v1/messages/batches"):
        answer = httpx.get(f"{gateway.url}{path}")
        assert answer.status_code == 404, path
        if path.startswith("/v1/messages"):  # Anthropic's envelope on its API's paths
            assert answer.json()["error"]["type"] == "not_found_error"
        else:
            assert answer.json()["error"]["code"] == "not_found"
    answer = get_target(gateway.url, b"/v1/files/%2e%2e/x")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_path"
    assert upstream.received == []
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200
    assert httpx.get(f"{gateway.url}/schema/openapi.json").status_code == 200


def test_claude_model_on_a_relayed_route(
    anthropic_gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A model the Anthropic provider serves, on a route Anthropic does not have, is a
    clear 400 and nothing goes upstream."""
    with client(anthropic_gateway.base_url) as via, pytest.raises(openai.BadRequestError) as caught:
        via.embeddings.create(model="claude-sonnet-4-5", input="hi")
    assert caught.value.code == "unsupported_route"
    assert upstream.received == []


def test_metrics_label_relayed_routes_without_ids(
    gateway: GatewayServer, upstream: MockUpstream, routes: OpenAIRoutes
) -> None:
    """Relayed requests are counted under their resource, never under an id."""
    with client(gateway.base_url) as via:
        via.chat.completions.retrieve("chatcmpl-labelcheck")
        via.models.retrieve("ft:gpt-4o-mini:org:labelcheck")
    text = httpx.get(f"{gateway.url}/metrics").text
    assert 'route="/v1/chat/*"' in text
    assert 'route="/v1/models/*"' in text
    assert "labelcheck" not in text


@pytest.fixture
def tenant_gateway(upstream: MockUpstream) -> Iterator[GatewayServer]:
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        tenants=(
            TenantSettings(
                "alpha",
                (hash_key("cg-alpha-key"),),
                upstream_api_key="sk-alpha-upstream",
                models=("text-embedding-*",),
            ),
        ),
        summaries=False,
    )
    with GatewayServer(settings) as server:
        yield server


def test_tenants_on_relayed_routes(
    tenant_gateway: GatewayServer, upstream: MockUpstream, routes: OpenAIRoutes
) -> None:
    """With tenants, a relayed request needs a gateway key, goes up with the tenant's
    upstream key, and may only name the tenant's models."""
    with client(tenant_gateway.base_url, "cg-alpha-key") as via:
        via.embeddings.create(model="text-embedding-3-small", input="hi")
        assert upstream.received[-1].headers["authorization"] == "Bearer sk-alpha-upstream"
        with pytest.raises(openai.PermissionDeniedError):
            via.embeddings.create(model="gpt-4o", input="hi")
    with (
        client(tenant_gateway.base_url, "cg-unknown") as stranger,
        pytest.raises(openai.AuthenticationError),
    ):
        stranger.files.list()
    assert len(upstream.received) == 1


def test_upstream_base_path_prefix(upstream: MockUpstream) -> None:
    """The path under the gateway's ``/v1`` goes after the upstream base URL's own path."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=f"http://127.0.0.1:{upstream.port}/api/v1/"),
        summaries=False,
    )
    with GatewayServer(settings) as gateway:
        upstream.push(JSONReply({"ok": True}))
        assert httpx.get(f"{gateway.base_url}/batches/b1?limit=2").json() == {"ok": True}
    assert upstream.received[-1].path == "/api/v1/batches/b1?limit=2"


@pytest.fixture
def small_gateway(upstream: MockUpstream) -> Iterator[GatewayServer]:
    """A gateway taking files up to 64 KiB and other bodies up to 4 KiB."""
    settings = settings_for(upstream, max_file_bytes=65_536, max_body_bytes=4_096)
    with GatewayServer(settings) as server:
        yield server


def test_body_limits(small_gateway: GatewayServer, upstream: MockUpstream) -> None:
    """A file over ``max_file_bytes`` and a JSON body over ``max_body_bytes`` are 413s
    that never reach the upstream; a file between the two limits goes through."""
    upstream.handler = OpenAIRoutes()
    with client(small_gateway.base_url) as via:
        with pytest.raises(openai.APIStatusError) as caught:
            via.files.create(file=("big.bin", b"x" * 70_000), purpose="batch")
        assert caught.value.status_code == 413
        with pytest.raises(openai.APIStatusError) as caught:
            via.embeddings.create(model="text-embedding-3-small", input="x" * 5_000)
        assert caught.value.status_code == 413
        assert upstream.received == []
        assert via.files.create(file=("ok.bin", b"x" * 20_000), purpose="batch").bytes == 20_000


def test_streamed_upload_over_limit_is_aborted(
    small_gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A chunked upload found too large while it streams is a 413, and the upstream
    never gets a whole request."""

    def chunks() -> Iterator[bytes]:
        for _ in range(20):
            yield b"y" * 8_192

    answer = httpx.post(
        f"{small_gateway.base_url}/uploads/u1/parts",
        content=chunks(),
        headers={"content-type": "multipart/form-data; boundary=b"},
    )
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "request_too_large"
    assert upstream.received == []
    with client(small_gateway.base_url) as via:
        upstream.push(JSONReply({"object": "list", "data": [], "has_more": False}))
        assert via.files.list().data == []


def _memory_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


def test_large_file_is_streamed_not_held(upstream: MockUpstream, tmp_path: Any) -> None:
    """A 16 MiB upload and its download through a ``contextgate serve`` process grow its
    peak memory by well under the file's size: the bytes stream through."""
    routes = upstream.handler = OpenAIRoutes()
    config = f"upstream:\n  base_url: {upstream.base_url}\nsummaries: false\n"
    content = os.urandom(16 * 1024 * 1024)
    with ServeProcess(config, str(tmp_path)) as process, client(process.base_url) as via:
        pid = process.process.pid
        warm = via.files.create(file=("warm.bin", content[:600_000]), purpose="batch")
        assert via.files.content(warm.id).content == content[:600_000]
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")  # the peak (VmHWM) starts again from the current size
        before = _memory_kib(pid, "VmRSS")
        uploaded = via.files.create(file=("big.bin", content), purpose="batch")
        assert routes.files[uploaded.id] == content
        assert via.files.content(uploaded.id).content == content
        growth = _memory_kib(pid, "VmHWM") - before
    print(f"gateway peak RSS growth over a 16 MiB upload and download: {growth} KiB")
    # Holding the file in either direction costs at least its size. Streaming it measured
    # 3.7 MiB or 7.3-7.5 MiB (in about a third of runs, on a busy host; the same with 8 MiB
    # and 16 MiB files, so an allocation of the process's and not the file's bytes).
    assert growth < 12 * 1024, growth


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/v1/embeddings", "/v1/embeddings"),
        ("/v1/files/file-abc/content", "/v1/files/*"),
        ("/v1/chat/completions/chatcmpl-1/messages", "/v1/chat/*"),
        ("/v1/made-up/thing", "/v1/*"),
        ("/v1/files/", "/v1/files"),
    ],
)
def test_route_label(path: str, label: str) -> None:
    """Route labels name the resource, never an id or an unknown path."""
    assert route_label(path) == label


@pytest.mark.parametrize(
    ("base", "target"),
    [
        ("https://api.openai.com/v1", b"/v1/files/f%3A1?a[b]=1"),
        ("https://openrouter.ai/api/v1/", b"/api/v1/files/f%3A1?a[b]=1"),
        ("http://localhost:11434", b"/files/f%3A1?a[b]=1"),
    ],
)
def test_upstream_target(base: str, target: bytes) -> None:
    """The client's path after ``/v1`` follows the base URL's path, bytes unchanged."""
    assert upstream_target(base, b"/v1/files/f%3A1", b"a[b]=1") == target


def test_no_re_encoding_of_query() -> None:
    """An empty query string adds no ``?``."""
    assert re.fullmatch(rb"/v1/x", upstream_target("http://h/v1", b"/v1/x", b""))


def test_client_leaving_a_relayed_stream_closes_the_upstream(
    gateway: GatewayServer, upstream: MockUpstream
) -> None:
    """A client that leaves a relayed stream midway has the upstream request closed
    within a second."""
    upstream.push(SSEReply(responses_stream("gpt-4o"), interval=2.0))
    body = {"model": "gpt-4o", "input": "Hi", "stream": True}
    with httpx.stream("POST", f"{gateway.base_url}/responses", json=body) as raw:
        assert next(raw.iter_raw()).startswith(b"event: response.created")
    left_at = time.monotonic()
    closed_at = upstream.wait_for_disconnect(3.0)
    assert closed_at is not None
    assert closed_at - left_at < 1.0


@pytest.mark.parametrize("upload", [False, True])
def test_client_leaving_before_the_answer_closes_the_upstream(
    gateway: GatewayServer, upstream: MockUpstream, upload: bool
) -> None:
    """A client that gives up while the upstream thinks (after a JSON body, or after a
    streamed upload) has the upstream request closed within a second."""
    upstream.push(Hang())
    request: dict[str, Any] = (
        {"content": iter([b"z" * 1_000] * 3), "headers": {"content-type": "audio/wav"}}
        if upload
        else {"json": {"model": "gpt-image-1", "prompt": "a cat"}}
    )
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.base_url}/images/generations", timeout=0.5, **request)
    left_at = time.monotonic()
    closed_at = upstream.wait_for_disconnect(3.0)
    assert closed_at is not None
    assert closed_at - left_at < 1.0
    assert len(upstream.received[-1].body) == (3_000 if upload else 40)


def test_only_json_bodies_are_read(gateway: GatewayServer, upstream: MockUpstream) -> None:
    """A body declared JSON that is not is a 400 before anything goes upstream; a body of
    another type (JSON Lines here) is relayed as it is, unread."""
    bad = httpx.post(
        f"{gateway.base_url}/embeddings",
        content=b'{"model": ',
        headers={"content-type": "application/json"},
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "invalid_json"
    assert upstream.received == []
    upstream.push(JSONReply({"ok": True}))
    lines = b'{"a": 1}\n{"b": \n'
    relayed = httpx.post(
        f"{gateway.base_url}/uploads/u1/parts",
        content=lines,
        headers={"content-type": "application/jsonl"},
    )
    assert relayed.json() == {"ok": True}
    assert upstream.received[-1].body == lines
