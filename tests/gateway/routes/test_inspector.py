"""The inspector's page at /ui/: a key given once in a form opens a signed session that
shows its namespace's conversations only, everything from the ledger escaped, every
response under a strict CSP, and nothing at all when the page is switched off."""

from __future__ import annotations

import base64
import contextlib
import re
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import orjson
import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.config import Settings, StoreSettings, TenantSettings, UpstreamSettings
from gateway.config.inspector import InspectorSettings
from gateway.routes.inspector import CONTENT_SECURITY_POLICY, TEMPLATES
from gateway.routes.inspector.chart import chart_of
from gateway.routes.inspector.engine import InspectorTemplates
from gateway.routes.inspector.formats import ago, money, percent, tokens
from gateway.routes.inspector.session import COOKIE, LIFETIME, opened, sealed
from gateway.runtime import Gateway
from gateway.store import Stores
from gateway.store.ledger import LedgerEntry, Totals
from gateway.tenancy.tenants import hash_key
from tests.harness import GatewayServer

ACME_KEY = "cg-acme-inspector-key-0123456789"
GLOBEX_KEY = "cg-globex-inspector-key-0123456789"
UPSTREAM = "http://127.0.0.1:9/v1"
REF = "ctx_" + "A1b2C3d4E5f6G7h8I9j0K1"
NOW = time.time()


# ---- the ledger, written per its contract (docs/API.md, "The ledger") ----------------


def summary(
    request_id: str,
    at: float,
    *,
    client: int,
    upstream: int,
    budget: int = 191_808,
    model: str = "claude-sonnet-4-5",
    api: str = "messages",
    compaction: bool = False,
    verdict: str = "warm",
    reason: str | None = None,
    cost: tuple[float | None, float | None] = (0.05, 0.11),
    stages: Sequence[dict[str, Any]] | None = None,
    refs: Sequence[dict[str, Any]] = (),
    checkpoint: dict[str, Any] | None = None,
    restores: int = 0,
    status: int = 200,
    detail: bool = True,
    cached: int | None = None,
) -> dict[str, Any]:
    """An entry's summary as the ledger writer makes it."""
    if stages is None:
        stages = [
            stage("guard_inbound", client, client),
            stage("filter", client, upstream, changed=client != upstream, note="offloaded=1"),
            stage("cache_markers", upstream, upstream, changed=True),
        ]
    ratio = {"prepare": 0.4, "light": 0.5, "trigger": 0.7, "emergency": 0.9, "target": 0.45}
    return {
        "id": request_id,
        "at": at,
        "api": api,
        "model": model,
        "tenant": None,
        "stream": True,
        "status": status,
        "attempts": 1,
        "tokens": {
            "client": client,
            "upstream": upstream,
            "budget": budget,
            "window": 200_000,
            "exact": True,
        },
        "thresholds": {name: round(value * budget) for name, value in ratio.items()},
        "stages": list(stages),
        "refs": list(refs),
        "compaction": compaction,
        "summary": checkpoint,
        "native": None,
        "applied_edits": [],
        "cache": {
            "verdict": verdict,
            "reason": reason,
            "cached": cached if cached is not None else upstream - 900,
            "uncached": 900,
            "written": 0,
        },
        "cost": {"with": cost[0], "without": cost[1], "currency": "USD"},
        "restores": {"calls": restores},
        "detail": detail,
    }


def stage(
    name: str, before: int, after: int, *, changed: bool = False, note: str | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "changed": changed,
        "before": before,
        "after": after,
        "ms": 0.8,
        "error": None,
        "note": note,
    }


def message(
    fate: str, role: str, client: str | None, upstream: str | None, refs: Sequence[str] = ()
) -> dict[str, Any]:
    """A row of an entry's detail (each side's first 300 characters and its length)."""

    def side(text: str | None) -> dict[str, Any] | None:
        return {"text": text[:300], "chars": len(text)} if text is not None else None

    return {
        "fate": fate,
        "role": role,
        "client": side(client),
        "upstream": side(upstream),
        "refs": list(refs),
    }


def entry(
    body: dict[str, Any], messages: Sequence[dict[str, Any]] | None = None, title: str = ""
) -> LedgerEntry:
    """The ledger entry of ``body`` (a summary), with its detail when ``messages`` given,
    adding to its conversation's row as the writer's totals do."""
    tokens, cache, cost = body["tokens"], body["cache"], body["cost"]
    priced = cost["with"] is not None and cost["without"] is not None
    totals = Totals(
        add={
            "requests": 1,
            "client_tokens": tokens["client"],
            "upstream_tokens": tokens["upstream"],
            "input_tokens": (cache["cached"] or 0) + (cache["uncached"] or 0),
            "cached_tokens": cache["cached"] or 0,
            "cost_with": cost["with"] or 0.0,
            "cost_without": cost["without"] or 0.0,
            "priced": int(priced),
            "compactions": int(body["compaction"]),
            "cache_breaks": int(cache["verdict"] == "break"),
            "restores": body["restores"]["calls"],
            "refs": len(body["refs"]),
        },
        latest={"model": body["model"], "api": body["api"], "tenant": "", "last_at": body["at"]},
        first={"first_at": body["at"], "title": title},
    )
    detail = {"messages": list(messages), "truncated": False} if messages is not None else None
    return LedgerEntry(
        body["id"],
        body["at"],
        orjson.dumps(body),
        orjson.dumps(detail) if detail is not None else None,
        totals,
    )


# ---- the app ---------------------------------------------------------------------------


def tenanted(store: StoreSettings | None = None, **inspector: Any) -> Settings:
    """Acme and Globex, an inspector with ``inspector``'s settings."""
    return Settings(
        upstream=UpstreamSettings(base_url=UPSTREAM, api_key="sk-upstream"),
        tenants=(
            TenantSettings("acme", (hash_key(ACME_KEY),)),
            TenantSettings("globex", (hash_key(GLOBEX_KEY),)),
        ),
        inspector=InspectorSettings(**inspector),
        store=store or StoreSettings(),
        summaries=False,
    )


def passthrough(**inspector: Any) -> Settings:
    return Settings(
        upstream=UpstreamSettings(base_url=UPSTREAM),
        inspector=InspectorSettings(**inspector),
        summaries=False,
    )


@contextlib.asynccontextmanager
async def serving(settings: Settings, **options: Any) -> AsyncIterator[AsyncTestClient[Any]]:
    """The app on Litestar's test client, which does not follow redirects."""
    async with AsyncTestClient(create_app(settings), **options) as test_client:
        test_client.follow_redirects = False
        yield test_client


@pytest.fixture
async def client() -> AsyncIterator[AsyncTestClient[Any]]:
    async with serving(tenanted()) as test_client:
        yield test_client


def gateway_of(client: AsyncTestClient[Any]) -> Gateway:
    gateway: Gateway = client.app.state.gateway
    return gateway


async def log_in(client: AsyncTestClient[Any], key: str = ACME_KEY) -> None:
    response = await client.post("/ui/session", data={"key": key})
    assert response.status_code == 303, response.text


async def fill(
    client: AsyncTestClient[Any], namespace: str, conversation: str, **what: Any
) -> None:
    """A conversation of two requests: a plain one, then a compaction with a cache break."""
    title = what.pop("title", "Fix the failing login test")
    ledger = gateway_of(client).stores.ledger
    first = summary("cg-first", NOW - 120, client=12_000, upstream=12_000, verdict="cold")
    await ledger.add(namespace, conversation, entry(first, None, title))
    written = {
        "ref": REF,
        "stage": "filter",
        "kind": "tool output",
        "bytes": 53_211,
        "replaced": None,
    }
    second = summary(
        "cg-second",
        NOW - 60,
        client=150_000,
        upstream=80_000,
        compaction=True,
        verdict="break",
        reason="system",
        refs=[written],
        **what,
    )
    rows = [
        message("kept", "user", title, title),
        message("offloaded", "tool", "x" * 900, f"[53,211 characters offloaded: {REF}]", [REF]),
        message("pruned", "assistant", "An old answer", None),
        message("added", "user", None, "[Context note] the earlier turns were shortened"),
    ]
    await ledger.add(namespace, conversation, entry(second, rows, title))


def headers_are_strict(response: Any) -> None:
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.headers["cache-control"] == "no-store"


# ---- access ----------------------------------------------------------------------------


async def test_without_a_session_the_page_is_the_key_form(client: AsyncTestClient[Any]) -> None:
    """``GET /ui/`` without a cookie asks for a key in a form posted to /ui/session."""
    response = await client.get("/ui/")
    assert response.status_code == 200
    assert '<form method="post" action="/ui/session">' in response.text
    assert 'name="key" type="password"' in response.text
    headers_are_strict(response)


async def test_a_good_key_opens_a_session_whose_cookie_holds_no_key(
    client: AsyncTestClient[Any],
) -> None:
    """The cookie is HttpOnly, SameSite=Strict, scoped to /ui, lasts 12 hours, names the
    tenant's namespace and not the key; with it the page is the tenant's list."""
    response = await client.post("/ui/session", data={"key": ACME_KEY})
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=v1.")
    attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/ui", f"max-age={LIFETIME}"} <= attributes
    assert "secure" not in attributes
    assert ACME_KEY not in cookie
    assert hash_key(ACME_KEY).removeprefix("sha256:") not in cookie
    value = cookie.split(";")[0].split("=", 1)[1]
    assert opened(value, await gateway_of(client).stores.secret(), time.time()) == "tenant:acme"
    page = await client.get("/ui/")
    assert "Conversations" in page.text
    assert "tenant acme" in page.text


async def test_the_cookie_is_secure_behind_https() -> None:
    """Over https, or behind a proxy that says it was (x-forwarded-proto), the cookie is
    Secure."""
    async with serving(tenanted(), base_url="https://inspector.test") as c:
        response = await c.post("/ui/session", data={"key": ACME_KEY})
        assert "secure" in response.headers["set-cookie"].lower()
    async with serving(tenanted()) as c:
        response = await c.post(
            "/ui/session", data={"key": ACME_KEY}, headers={"x-forwarded-proto": "https"}
        )
        assert "secure" in response.headers["set-cookie"].lower()


@pytest.mark.parametrize("key", ["cg-not-a-key-0123456789abcdef", "", "   "])
async def test_a_bad_key_is_the_form_again_with_a_401(
    client: AsyncTestClient[Any], key: str
) -> None:
    """A key no tenant has, or none, where the API needs one: the form, a message, 401,
    and no cookie."""
    response = await client.post("/ui/session", data={"key": key})
    assert response.status_code == 401
    assert 'role="alert"' in response.text
    assert "set-cookie" not in response.headers
    headers_are_strict(response)


async def test_without_tenants_a_key_names_its_own_namespace_and_none_the_anonymous() -> None:
    """Without tenants, any upstream key opens its keyed-hash namespace (as the API places
    it) and an empty key the anonymous one, where the gateway shows it."""
    async with serving(passthrough(anonymous=True)) as c:
        gateway = gateway_of(c)
        secret = await gateway.stores.secret()
        for key, namespace in [
            ("sk-alice", await gateway.stores.namespace_of("sk-alice")),
            ("", "anonymous"),
        ]:
            response = await c.post("/ui/session", data={"key": key})
            assert response.status_code == 303
            value = response.cookies[COOKIE]
            assert opened(value, secret, time.time()) == namespace
            assert namespace.startswith("key:") or namespace == "anonymous"


async def test_requests_without_a_key_are_not_shown_unless_asked() -> None:
    """Keyless callers share one namespace: by default neither the form nor the API opens
    it, and its requests are not recorded."""
    async with serving(passthrough()) as c:
        refused = await c.post("/ui/session", data={"key": ""})
        assert refused.status_code == 401
        assert COOKIE not in refused.cookies
        assert "inspector.anonymous" in refused.text
        listed = await c.get("/v1/context/conversations")
        assert listed.status_code == 404
        assert "inspector.anonymous" in listed.json()["error"]["message"]
        gateway = gateway_of(c)
        assert gateway.ledger is not None
        assert not gateway.ledger.keeps("anonymous")
        assert not gateway.ledger.keeps("unresolved")
        assert gateway.ledger.keeps(await gateway.stores.namespace_of("sk-alice"))
        value = sealed("anonymous", await gateway.stores.secret(), time.time())
        c.cookies.set(COOKIE, value)
        assert "The API key your client sends" in (await c.get("/ui/")).text


async def test_a_large_form_is_refused_before_it_is_read(client: AsyncTestClient[Any]) -> None:
    """The session route is open to anyone: a form of more than 4 KiB is a 413 page, with
    the page's headers, before the gateway parses it."""
    response = await client.post(
        "/ui/session",
        content=b"a=&" * 100_000,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 413
    headers_are_strict(response)


async def test_a_malformed_cookie_is_the_form_never_an_error(
    client: AsyncTestClient[Any],
) -> None:
    """A cookie with a MAC that is not ASCII, or an expiry of thousands of digits, opens no
    session and breaks nothing."""
    for value in (b"v1.9999999999.YWNtZQ.\xe9t\xe9", b"v1." + b"9" * 5_000 + b".YWNtZQ.x"):
        response = await client.get("/ui/", headers={"cookie": COOKIE.encode() + b"=" + value})
        assert response.status_code == 200
        assert "Your gateway key" in response.text
        headers_are_strict(response)


async def test_a_forged_altered_or_expired_cookie_is_the_form(
    client: AsyncTestClient[Any],
) -> None:
    """A cookie signed under another secret, naming another namespace, or past its expiry
    opens nothing: the form, and the cookie cleared."""
    gateway = gateway_of(client)
    await fill(client, "tenant:globex", "globex-1", title="Globex secret plans")
    secret = await gateway.stores.secret()
    good = sealed("tenant:acme", secret, time.time())
    version, expires, _, mac = good.split(".")
    globex = base64.urlsafe_b64encode(b"tenant:globex").rstrip(b"=").decode()
    for value in [
        sealed("tenant:globex", b"another gateway's secret", time.time()),
        ".".join([version, expires, globex, mac]),
        sealed("tenant:acme", secret, time.time() - LIFETIME - 1),
        "tenant:globex",
    ]:
        client.cookies.set(COOKIE, value, path="/ui")
        response = await client.get("/ui/")
        assert response.status_code == 200
        assert 'name="key"' in response.text
        assert "Globex secret plans" not in response.text
        assert "session has ended" in response.text
        assert f'{COOKIE}=""' in response.headers["set-cookie"]
        client.cookies.clear()


async def test_a_session_ends_with_its_tenant() -> None:
    """A tenant no longer configured (the same store's secret, so its cookie still
    verifies) sees the form again; so does a passthrough session once there are tenants."""
    secret = b"the store's shared secret, 0123456789"
    cookies = [sealed("tenant:initech", secret, time.time())]
    cookies.append(sealed("key:0123456789abcdef", secret, time.time()))
    async with serving(tenanted(StoreSettings(secret=secret.decode()))) as c:
        for value in cookies:
            c.cookies.set(COOKIE, value, path="/ui")
            assert 'name="key"' in (await c.get("/ui/")).text
            c.cookies.clear()
        c.cookies.set(COOKIE, sealed("tenant:acme", secret, time.time()), path="/ui")
        assert "tenant acme" in (await c.get("/ui/")).text


async def test_a_form_from_another_site_opens_no_session(client: AsyncTestClient[Any]) -> None:
    """A login or logout posted from another site (forged) is refused."""
    for headers in [{"sec-fetch-site": "cross-site"}, {"origin": "https://evil.test"}]:
        response = await client.post("/ui/session", data={"key": ACME_KEY}, headers=headers)
        assert response.status_code == 403
        assert "set-cookie" not in response.headers
        headers_are_strict(response)


async def test_logging_out_clears_the_cookie(client: AsyncTestClient[Any]) -> None:
    """After ``POST /ui/logout`` the page is the form again."""
    await log_in(client)
    response = await client.post("/ui/logout")
    assert response.status_code == 303
    assert "max-age=0" in response.headers["set-cookie"].lower()
    assert 'name="key"' in (await client.get("/ui/")).text


async def test_a_link_followed_without_a_session_returns_there_after_the_form(
    client: AsyncTestClient[Any],
) -> None:
    """A deep link opens the form, which goes back to it; never to another site."""
    await fill(client, "tenant:acme", "acme-1")
    page = await client.get("/ui/conversations/acme-1")
    assert 'name="next" value="/ui/conversations/acme-1"' in page.text
    response = await client.post(
        "/ui/session", data={"key": ACME_KEY, "next": "/ui/conversations/acme-1"}
    )
    assert response.headers["location"] == "/ui/conversations/acme-1"
    for elsewhere in ["https://evil.test/", "//evil.test/ui/", "/ui/\\evil", "/ui//evil.test"]:
        response = await client.post("/ui/session", data={"key": ACME_KEY, "next": elsewhere})
        assert response.headers["location"] == "/ui/"


# ---- what a viewer sees ----------------------------------------------------------------


async def test_a_viewer_sees_its_own_namespace_only(client: AsyncTestClient[Any]) -> None:
    """Acme's list has Acme's conversation and not Globex's; Globex's conversation, its
    requests and its refs are 404s for Acme."""
    await fill(client, "tenant:acme", "acme-1", title="Acme's migration")
    await fill(client, "tenant:globex", "globex-1", title="Globex secret plans")
    await gateway_of(client).stores.objects.put("tenant:globex", b"globex only", ttl=60)
    ref = await gateway_of(client).stores.objects.put("tenant:globex", b"globex only", ttl=60)
    await log_in(client, ACME_KEY)
    listed = await client.get("/ui/")
    assert "Acme&#39;s migration" in listed.text
    assert "Globex" not in listed.text
    for path in [
        "/ui/conversations/globex-1",
        "/ui/conversations/globex-1/requests/cg-second",
        f"/ui/objects/{ref}",
    ]:
        response = await client.get(path)
        assert response.status_code == 404
        assert "Globex" not in response.text
        assert "globex only" not in response.text
        headers_are_strict(response)
    await log_in(client, GLOBEX_KEY)
    assert "Globex secret plans" in (await client.get("/ui/")).text
    assert "globex only" in (await client.get(f"/ui/objects/{ref}")).text


async def test_the_list_says_how_to_start_when_there_is_nothing(
    client: AsyncTestClient[Any],
) -> None:
    """An empty namespace says that nothing has gone through for this key, and where to
    point a client."""
    await log_in(client)
    page = await client.get("/ui/")
    assert "Nothing has gone through the gateway for this key yet." in page.text
    assert "OPENAI_BASE_URL=http://testserver.local/v1" in page.text


async def test_the_list_shows_each_conversations_figures(client: AsyncTestClient[Any]) -> None:
    """Title, model, requests, tokens sent and sent up, cost with and without, saved,
    cache hits and last activity, numbers with thousands separators."""
    await fill(client, "tenant:acme", "acme-1")
    await log_in(client)
    page = (await client.get("/ui/")).text
    assert "Fix the failing login test" in page
    assert 'href="/ui/conversations/acme-1"' in page
    assert "claude-sonnet-4-5" in page
    assert ">162,000<" in page  # 12,000 + 150,000 sent by the client
    assert "92,000" in page  # 12,000 + 80,000 went up
    for cost in ["$0.100", "$0.220", "$0.120"]:  # with, without, saved
        assert cost in page
    assert "min ago" in page
    assert " UTC" in page


async def test_an_unknown_price_is_unknown_and_a_partial_one_says_so(
    client: AsyncTestClient[Any],
) -> None:
    """A conversation without prices shows ``unknown``, never $0; one priced for some
    requests only says how many."""
    await fill(client, "tenant:acme", "partly", cost=(None, None), title="Partly priced")
    ledger = gateway_of(client).stores.ledger
    unpriced = summary("cg-x", NOW, client=10, upstream=10, cost=(None, None))
    await ledger.add("tenant:acme", "unpriced", entry(unpriced, None, "Never priced"))
    await log_in(client)
    page = (await client.get("/ui/")).text
    never = page[page.index("Never priced") : page.index("Partly priced")]
    assert never.count(">unknown<") == 3
    assert "$0.0" not in never
    assert "priced 1 of 2" in page


async def test_ledger_text_is_escaped_everywhere(client: AsyncTestClient[Any]) -> None:
    """A conversation whose title and messages hold markup shows it as text: in the list,
    the timeline and the request."""
    script = "<script>alert(1)</script>"
    await fill(client, "tenant:acme", "acme-1", title=f"Run {script} now")
    await log_in(client)
    for path in [
        "/ui/",
        "/ui/conversations/acme-1",
        "/ui/conversations/acme-1/requests/cg-second",
    ]:
        page = (await client.get(path)).text
        assert "<script>alert" not in page, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, path


async def test_the_timeline_charts_the_requests_and_lists_them(
    client: AsyncTestClient[Any],
) -> None:
    """The chart has both series, the levels and a marker each for the compaction and the
    cache break; the table lists the requests newest first, each linking to its page."""
    await fill(client, "tenant:acme", "acme-1")
    await log_in(client)
    page = (await client.get("/ui/conversations/acme-1")).text
    assert '<svg viewBox="0 0 1200 300"' in page
    for mark in ["series client", "series upstream", "level level-budget", "level-trigger"]:
        assert mark in page
    assert page.count('class="marker compaction"') == 2  # the request's, and the legend's
    assert page.count('class="marker cache-break"') == 2
    table = page[page.index("<tbody>", page.index("Requests")) :]
    assert table.index("cg-second") < table.index("cg-first")
    assert 'href="/ui/conversations/acme-1/requests/cg-second"' in page
    assert "150,000" in page
    assert "80,000" in page
    assert ">filter<" in page
    assert "system" in page  # the cache break's cause


async def test_a_request_shows_its_stages_messages_refs_and_checkpoint(
    client: AsyncTestClient[Any],
) -> None:
    """The stage table, the messages side by side with their fates, each ref a link to
    its object, the checkpoint's fields, the cache's counts."""
    fields = {
        "user_goal": "Make the login test pass",
        "active_task": "Fixing the session cookie",
        "completed_actions": ["Read auth.py", "Ran the tests"],
        "files_modified": ["auth.py"],
    }
    checkpoint = {"start": 3, "end": 57, "fields": fields, "refs": []}
    await fill(client, "tenant:acme", "acme-1", checkpoint=checkpoint, restores=1)
    await log_in(client)
    page = (await client.get("/ui/conversations/acme-1/requests/cg-second")).text
    assert '<span class="stage">filter</span>' in page
    assert "offloaded=1" in page
    for fate in ["kept", "offloaded", "pruned", "added"]:
        assert f'<span class="fate {fate}">{fate}</span>' in page
    # In the message and in the table of refs.
    assert page.count(f'href="/ui/objects/{REF}"') == 2
    assert "53,211" in page
    assert "Make the login test pass" in page
    assert "<li>Ran the tests</li>" in page
    assert "Pending user asks" in page
    assert "messages 3–57 summarised" in page
    assert "79,100" in page  # tokens read from the cache


async def test_an_older_request_says_its_messages_are_no_longer_kept(
    client: AsyncTestClient[Any],
) -> None:
    """A request whose detail was not kept says so, with how many are."""
    await fill(client, "tenant:acme", "acme-1")
    await log_in(client)
    page = (await client.get("/ui/conversations/acme-1/requests/cg-first")).text
    assert "no longer kept" in page
    assert "latest 5 requests" in page


async def test_a_conversation_id_with_a_slash_has_its_pages(client: AsyncTestClient[Any]) -> None:
    """An id the client named with a ``/`` is linked escaped and found."""
    await fill(client, "tenant:acme", "team/run-7")
    await log_in(client)
    assert 'href="/ui/conversations/team%2Frun-7"' in (await client.get("/ui/")).text
    timeline = await client.get("/ui/conversations/team%2Frun-7")
    assert timeline.status_code == 200
    assert 'href="/ui/conversations/team%2Frun-7/requests/cg-second"' in timeline.text
    request = await client.get("/ui/conversations/team%2Frun-7/requests/cg-second")
    assert request.status_code == 200
    assert (await client.get("/ui/conversations/team/run-7")).status_code == 404


async def test_an_object_shows_its_text_or_its_image(client: AsyncTestClient[Any]) -> None:
    """A text object in a <pre>, escaped; an image part as an <img> with its data: URL;
    anything else under /ui/objects a 404 page."""
    objects = gateway_of(client).stores.objects
    text_ref = await objects.put("tenant:acme", b"line 1\n<b>line 2</b>\n", ttl=60)
    png = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
    part = {"type": "image_url", "image_url": {"url": png}}
    image_ref = await objects.put("tenant:acme", orjson.dumps(part), ttl=60)
    await log_in(client)
    text = await client.get(f"/ui/objects/{text_ref}")
    assert '<pre class="object">line 1\n&lt;b&gt;line 2&lt;/b&gt;\n</pre>' in text.text
    image = await client.get(f"/ui/objects/{image_ref}")
    assert f'<img src="{png}"' in image.text
    for missing in ["ctx_" + "Z" * 24, "not-a-ref"]:
        response = await client.get(f"/ui/objects/{missing}")
        assert response.status_code == 404
        assert "Not found" in response.text
        headers_are_strict(response)


async def test_the_live_part_of_a_page_is_answered_alone(client: AsyncTestClient[Any]) -> None:
    """With ``x-contextgate-fragment: live`` the list and the timeline answer only what
    changes; without a session, a bare 401 (the poller then reloads into the form)."""
    live = {"x-contextgate-fragment": "live"}
    assert (await client.get("/ui/", headers=live)).status_code == 401
    await fill(client, "tenant:acme", "acme-1")
    await log_in(client)
    for path in ["/ui/", "/ui/conversations/acme-1"]:
        response = await client.get(path, headers=live)
        assert response.status_code == 200
        assert "<html" not in response.text
        assert "cg-second" in response.text or "acme-1" in response.text
        headers_are_strict(response)


async def test_every_ui_response_carries_the_strict_headers(client: AsyncTestClient[Any]) -> None:
    """The CSP, nosniff, no referrer and no caching on pages, static files, errors and the
    form, whoever answered them."""
    await fill(client, "tenant:acme", "acme-1")
    await log_in(client)
    responses = [
        await client.get("/ui/"),
        await client.get("/ui/conversations/acme-1"),
        await client.get("/ui/conversations/acme-1/requests/cg-second"),
        await client.get("/ui/static/inspector.css"),
        await client.get("/ui/static/inspector.js"),
        await client.get("/ui/static/missing.css"),
        await client.get("/ui/conversations/nope"),
        await client.get("/ui/no/such/page"),
        await client.delete("/ui/"),
        await client.get("/ui/?page=zero"),
    ]
    assert [r.status_code for r in responses] == [200, 200, 200, 200, 200, 404, 404, 404, 405, 400]
    for response in responses:
        headers_are_strict(response)
    assert responses[3].headers["content-type"].startswith("text/css")
    assert "<script>" not in responses[0].text  # no inline script, only the file
    assert "style=" not in "".join(r.text for r in responses[:3])


async def test_the_root_leads_to_the_inspector(client: AsyncTestClient[Any]) -> None:
    response = await client.get("/")
    assert response.status_code == 302
    assert response.headers["location"] == "/ui/"


@pytest.mark.parametrize("switch", [{"ui": False}, {"enabled": False}])
async def test_switched_off_every_ui_route_is_404(switch: dict[str, bool]) -> None:
    """With the page (or the whole inspector) off, nothing under /ui/ is served, nor the
    root's redirect."""
    async with serving(tenanted(**switch)) as c:
        for method, path in [
            ("GET", "/ui/"),
            ("GET", "/ui/conversations/x"),
            ("GET", "/ui/objects/" + REF),
            ("GET", "/ui/static/inspector.css"),
            ("POST", "/ui/session"),
            ("GET", "/"),
        ]:
            response = await c.request(method, path)
            assert response.status_code == 404, path


# ---- the parts -------------------------------------------------------------------------


def test_the_templates_are_loaded_with_the_first_page_and_keep_what_was_registered() -> None:
    """The engine is made when the first template is asked for, with the inspector's
    filters and the callables registered before it (Litestar's, at start-up)."""
    engine = InspectorTemplates(TEMPLATES)
    engine.register_template_callable("shout", lambda context, text: text.upper())
    assert not engine.loaded
    rendered = engine.render_string("{{ shout('ok') }} {{ 1234567 | tokens }}", {})
    assert engine.loaded
    assert rendered == "OK 1,234,567"
    engine.register_template_callable("whisper", lambda context, text: text.lower())
    assert engine.render_string("{{ whisper('OK') }} {{ '<b>' }}", {}) == "ok &lt;b&gt;"
    assert engine.get_template("error.html").render(
        status=404, detail="gone", viewer=None, signed_in=False
    )


def test_a_session_opens_only_as_it_was_sealed() -> None:
    """The namespace comes back under the same secret before expiry, and not otherwise."""
    value = sealed("key:0123abcd", b"secret", 1_000.0)
    assert opened(value, b"secret", 1_000.0 + LIFETIME - 1) == "key:0123abcd"
    assert opened(value, b"secret", 1_000.0 + LIFETIME) is None
    assert opened(value, b"other", 1_000.0) is None
    assert opened(value[:-1] + ("A" if value[-1] != "A" else "B"), b"secret", 1_000.0) is None
    assert opened(None, b"secret", 1_000.0) is None


def test_the_chart_puts_the_oldest_left_and_draws_levels_as_steps() -> None:
    """Requests left to right in time; a steady budget is one flat line; the compaction
    and the break are on their requests."""
    entries = [
        summary("a", 1, client=10_000, upstream=10_000),
        summary("b", 2, client=150_000, upstream=80_000, compaction=True),
        summary("c", 3, client=160_000, upstream=90_000, verdict="break"),
    ]
    chart = chart_of(entries)
    assert [c.id for c in chart.columns] == ["a", "b", "c"]
    xs = [c.x for c in chart.columns]
    assert xs == sorted(xs)
    upstream_y = [c.upstream_y for c in chart.columns]
    assert upstream_y[0] > upstream_y[1]  # more tokens: higher up, a smaller y
    assert [c.compaction for c in chart.columns] == [False, True, False]
    assert [c.cache_break for c in chart.columns] == [False, False, True]
    budget = next(level for level in chart.levels if level.name == "budget")
    assert len(set(re.findall(r"[ML][\d.]+ ([\d.]+)", budget.path))) == 1
    assert {level.name for level in chart.levels} == {"budget", "emergency", "trigger", "target"}
    assert chart.y_ticks[0][1] == "0"


def test_the_chart_of_requests_without_counts_is_empty_not_broken() -> None:
    """A refused request without tokens leaves a gap."""
    broken = summary("x", 1, client=1, upstream=1)
    broken["tokens"] = None
    broken["thresholds"] = None
    chart = chart_of([broken, summary("y", 2, client=5_000, upstream=4_000)])
    assert chart.columns[0].upstream_y is None
    assert chart.upstream.count("M") == 1
    assert chart_of([]).columns == []


def test_numbers_read_as_a_person_reads_them() -> None:
    """Thousands separators, unknown for unknown money, shares as percentages, times
    relative."""
    assert tokens(1_234_567) == "1,234,567"
    assert tokens(None) == "—"
    assert money(None) == "unknown"
    assert money(0.12345) == "$0.123"
    assert money(0.012345) == "$0.0123"
    assert money(1234.5) == "$1,234.50"
    assert money(-0.5) == "−$0.500"
    assert percent(0.456) == "46%"
    assert percent(0.05) == "5.0%"
    assert ago(100.0, now=220.0) == "2 min ago"
    assert ago(100.0, now=101.0) == "just now"
    assert ago(0.0, now=3 * 86_400) == "3 days ago"


async def test_with_redis_a_session_holds_on_every_replica(redis_url: str) -> None:
    """Two replicas on one Redis (real sockets) share the store's secret and the ledger: a
    session opened on one shows the conversation on the other."""
    base = tenanted()
    settings = Settings(
        upstream=base.upstream, tenants=base.tenants, redis_url=redis_url, summaries=False
    )
    conversation = f"replicated-{time.time_ns()}"
    stores = Stores.build(settings)
    title = "Seen from either replica"
    body = summary("cg-replicated", time.time(), client=9_000, upstream=9_000)
    await stores.ledger.add("tenant:acme", conversation, entry(body, None, title))
    await stores.aclose()
    with GatewayServer(settings) as first, GatewayServer(settings) as second:
        async with httpx.AsyncClient() as http:
            opened_on_first = await http.post(f"{first.url}/ui/session", data={"key": ACME_KEY})
            assert opened_on_first.status_code == 303
            cookie = f"{COOKIE}={opened_on_first.cookies[COOKIE]}"
            page = await http.get(
                f"{second.url}/ui/conversations/{conversation}", headers={"cookie": cookie}
            )
    assert page.status_code == 200
    assert title in page.text
