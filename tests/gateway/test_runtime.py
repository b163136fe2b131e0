"""The process's parts (``gateway.runtime.Gateway``): where a model's requests go, with
which key and headers."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from dataclasses import replace

import pytest

from gateway.config import AnthropicSettings, Settings, UpstreamSettings
from gateway.errors import InvalidRequest
from gateway.providers.anthropic import AnthropicUpstream
from gateway.providers.openai import Upstream
from gateway.runtime import _WARM_REQUEST, Gateway, _malloc_trim, _resident
from gateway.tenancy.auth import Caller
from pipelines import TokenCounter
from tests.harness import GatewayServer

CLIENT = {
    "authorization": "Bearer sk-caller-0001",
    "anthropic-version": "2023-06-01",
    "connection": "keep-alive",
    "x-contextgate-policy": "trigger=0.6",
}


def build(**settings: object) -> Gateway:
    return Gateway.build(Settings(**settings))  # type: ignore[arg-type]


def passthrough(gateway: Gateway) -> Caller:
    return Caller("ns", gateway.tenants.passthrough)


async def test_claude_goes_to_anthropic_and_anything_else_to_the_openai_upstream() -> None:
    gateway = build()
    try:
        caller = passthrough(gateway)
        claude = gateway.target(caller, "claude-sonnet-4", CLIENT)
        assert isinstance(claude.provider, AnthropicUpstream)
        # A router's name for Claude is the router's to serve.
        routed = gateway.target(caller, "anthropic/claude-sonnet-4", CLIENT)
        assert isinstance(routed.provider, Upstream)
        assert isinstance(gateway.target(caller, "gpt-4o", CLIENT).provider, Upstream)
    finally:
        await gateway.aclose()


async def test_with_anthropic_off_claude_goes_to_the_openai_upstream() -> None:
    gateway = build(anthropic=AnthropicSettings(enabled=False))
    try:
        target = gateway.target(passthrough(gateway), "claude-sonnet-4", CLIENT)
        assert isinstance(target.provider, Upstream)
    finally:
        await gateway.aclose()


async def test_the_headers_sent_are_the_clients_less_hop_and_gateway_ones() -> None:
    gateway = build()
    try:
        target = gateway.target(passthrough(gateway), "gpt-4o", CLIENT)
        assert target.model == "gpt-4o"
        assert target.headers == {
            "authorization": "Bearer sk-caller-0001",
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
        }
    finally:
        await gateway.aclose()


async def test_a_tenants_keys_replace_the_callers_and_claude_needs_one() -> None:
    gateway = build(upstream=UpstreamSettings(api_key="sk-upstream-0001"))
    try:
        profile = replace(gateway.tenants.passthrough, tenant="blue")
        caller = Caller("ns", replace(profile, upstream_api_key="sk-blue-openai-0001"))
        sent = gateway.target(caller, "gpt-4o", CLIENT).headers
        assert sent["authorization"] == "Bearer sk-blue-openai-0001"
        with pytest.raises(InvalidRequest) as refused:
            gateway.target(caller, "claude-sonnet-4", CLIENT)
        assert refused.value.code == "provider_not_configured"
        keyed = Caller("ns", replace(profile, anthropic_api_key="sk-ant-blue-0001"))
        sent = gateway.target(keyed, "claude-sonnet-4", CLIENT).headers
        assert sent["authorization"] == "Bearer sk-ant-blue-0001"
    finally:
        await gateway.aclose()


async def test_warming_loads_the_encoding_and_the_sdk_only_where_an_anthropic_key_is_set() -> None:
    # Nothing is loaded when the parts are built (the port opens first); ``warm`` loads,
    # in the background, what the first requests would otherwise wait for.
    for settings, sdk in (
        ({}, False),
        ({"anthropic": AnthropicSettings(api_key="sk-ant-operator")}, True),
        ({"anthropic": AnthropicSettings(api_key="sk-ant-operator", enabled=False)}, False),
    ):
        gateway = build(**settings)
        try:
            counter = gateway.pipeline.counter("o200k_base")
            assert not gateway.anthropic.loaded
            gateway.warm()
            gateway.warm()  # once
            assert gateway._warming is not None
            await gateway._warming
            assert counter.loaded
            assert counter.count_text("hello world") == 2
            assert gateway.anthropic.loaded is sdk
        finally:
            await gateway.aclose()


async def test_the_sdk_is_loaded_once_by_concurrent_first_requests() -> None:
    gateway = build()
    try:
        first = await asyncio.gather(*(gateway.anthropic.load() for _ in range(5)))
        assert all(client is first[0] for client in first)
    finally:
        await gateway.aclose()


def test_the_server_warms_the_gateway_once_its_port_is_open() -> None:
    settings = Settings()
    with GatewayServer(settings) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass
        assert server.warmed == [True]


_THREAD_ALLOCATES = """
import ctypes, sys, threading
from gateway.runtime import one_malloc_arena
print(one_malloc_arena())
kept = []
thread = threading.Thread(target=lambda: kept.extend(bytes(2000) for _ in range(100)))
thread.start()
thread.join()
ctypes.CDLL("libc.so.6").malloc_stats()  # one "Arena n:" paragraph per arena, on stderr
"""


@pytest.mark.skipif(_malloc_trim() is None, reason="glibc's allocator only")
@pytest.mark.parametrize("arenas", [None, "8"])
def test_one_arena_serves_every_thread_unless_the_operator_says_otherwise(
    arenas: str | None,
) -> None:
    """``one_malloc_arena`` has a worker thread allocate from the main arena; where
    ``MALLOC_ARENA_MAX`` is set it leaves glibc as told (the thread gets its own)."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    if arenas is not None:
        env["MALLOC_ARENA_MAX"] = arenas
    done = subprocess.run(
        [sys.executable, "-c", _THREAD_ALLOCATES], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(arenas is None)
    assert ("Arena 1:" in done.stderr) is (arenas is not None)


@pytest.mark.skipif(_malloc_trim() is None, reason="glibc's malloc_trim: nothing to trim")
async def test_the_allocator_is_trimmed_while_idle_until_shutdown() -> None:
    gateway = build()
    gateway.warm()
    trimming = gateway._trimming
    assert trimming is not None
    await asyncio.sleep(0)
    assert not trimming.done()  # glibc here: the loop runs, waiting for its next turn
    await gateway.aclose()
    await asyncio.sleep(0)
    assert trimming.cancelled()


@pytest.mark.skipif(_malloc_trim() is None, reason="glibc's malloc_trim: nothing to trim")
async def test_what_a_burst_freed_goes_back_to_the_system_once_it_is_over() -> None:
    """A burst's freed memory, which glibc keeps below what is still held, is given back
    within seconds once nothing is in flight, not left at the burst's peak."""
    gateway = build()
    gateway.warm()
    assert gateway._warming is not None
    await gateway._warming
    await asyncio.sleep(0.1)  # the trim's floor is read once the warm-up is done
    try:
        burst = [bytes(1024) for _ in range(40_000)]  # 40 MiB, each block malloc's own
        kept = bytes(1024)  # allocated above the burst: the heap's top cannot shrink
        peak = _resident()
        del burst
        given_back = 0
        for _ in range(50):  # 5 s: a trim comes 0.5-1 s after the last request
            await asyncio.sleep(0.1)
            given_back = peak - _resident()
            if given_back >= 24 * 1024 * 1024:
                break
        assert given_back >= 24 * 1024 * 1024, f"{given_back / 2**20:.1f} MiB given back"
        assert kept
    finally:
        await gateway.aclose()


@pytest.mark.skipif(_malloc_trim() is None, reason="glibc's malloc_trim: nothing to trim")
async def test_what_the_warm_up_freed_goes_back_to_the_system_when_it_ends() -> None:
    """The memory the warm-up used and freed (the encoding's build does) does not stay
    with the process at rest: it is given back as the warm-up ends, before any request."""
    gateway = build()
    kept: list[bytes] = []
    peak = 0
    warming = False

    class Building(TokenCounter):
        async def ready(self) -> None:
            nonlocal peak
            await super().ready()
            if not warming or kept:  # a burst once, in the warm-up, as a build is made once
                return
            burst = [bytes(1024) for _ in range(40_000)]  # 40 MiB, each block malloc's own
            kept.extend(burst[::64])  # a block kept every 64 KiB: free() alone returns none
            peak = _resident()
            del burst

    gateway.pipeline._counters["o200k_base"] = Building()
    await gateway.pipeline.compact(_WARM_REQUEST)  # what the warm-up loads, loaded before
    warming = True
    try:
        gateway.warm()
        assert gateway._warming is not None
        await gateway._warming
        await asyncio.sleep(0.2)  # the trimming task's turn, well before its first tick
        given_back = (peak - _resident()) / 2**20
        assert given_back >= 24, f"{given_back:.1f} MiB of the 40 freed given back"
        assert kept
    finally:
        await gateway.aclose()


async def test_a_failed_warm_up_is_logged_and_not_reported_warm(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gateway = build()
    try:

        class Unreadable(TokenCounter):
            async def ready(self) -> None:
                raise OSError("rank file unreadable")

        gateway.pipeline._counters["o200k_base"] = Unreadable()
        gateway.warm()
        assert gateway._warming is not None
        await gateway._warming
        assert not gateway.warmed
        assert "the warm-up failed" in caplog.text
    finally:
        await gateway.aclose()
