"""The shedder: a cap on requests in flight and a limit that falls while work waits for the
event loop, refused with a 503 ``gateway_overloaded`` and ``Retry-After``; counted by
reason."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx

from gateway.config import AnthropicSettings, Settings, UpstreamSettings
from gateway.edge.overload import EARLY, FLOOR, GRACE, TICK, Shedder
from gateway.errors import Overloaded
from tests.harness import GatewayServer
from tests.mock_upstream import JSONReply, MockUpstream, chat_completion

AUTH = {"authorization": "Bearer sk-test"}
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}
CLAUDE = {
    "model": "claude-sonnet-4-6",
    "max_tokens": 20,
    "messages": [{"role": "user", "content": "Hi"}],
}


def test_past_max_in_flight_a_request_is_refused_and_counted() -> None:
    """Two slots: the third request is refused with Retry-After; a release frees one."""
    shedder = Shedder(max_in_flight=2, max_queue_delay=None)
    assert shedder.admit() is None
    assert shedder.admit() is None
    refused = shedder.admit()
    assert isinstance(refused, Overloaded)
    assert refused.status == 503
    assert refused.code == "gateway_overloaded"
    assert refused.headers == {"retry-after": "1"}
    assert shedder.shed == {"in_flight": 1, "loop_wait": 0}
    shedder.release()
    assert shedder.admit() is None
    assert shedder.in_flight == 2


def test_without_limits_nothing_is_refused() -> None:
    """Both signals off: any number of requests is admitted."""
    shedder = Shedder(max_in_flight=None, max_queue_delay=None)
    assert not any(shedder.admit() for _ in range(10_000))
    assert shedder.in_flight == 10_000


async def _stuck_mid_trip(shedder: Shedder, seconds: float) -> None:
    """Block the loop for ``seconds`` while the probe is on its way through the loop: the
    next trip to start (looked for at every turn: a trip on an idle loop is over within a
    millisecond, and one missed would have raised the limit)."""
    while not shedder.probing:
        await asyncio.sleep(0)
    time.sleep(seconds)  # noqa: ASYNC251 -- the point: the loop is stuck


async def _trip_over(shedder: Shedder) -> None:
    """Run the loop until the probe's trip under way is over (its wait just measured)."""
    while shedder.probing:
        await asyncio.sleep(0)


async def test_a_long_step_with_few_requests_in_flight_is_not_overload() -> None:
    """The loop stuck for 0.5 s (a huge request worked on) with 3 requests in flight: the
    next ones are admitted all the same, up to the 3 and a margin of twice the floor; past
    that, work still coming while the loop is late, the limit is cut, never below the
    floor."""
    shedder = Shedder(max_in_flight=1024, max_queue_delay=0.1)
    shedder.start()
    try:
        for _ in range(3):
            assert shedder.admit() is None
        await _stuck_mid_trip(shedder, 0.5)
        assert all(shedder.admit() is None for _ in range(2 * FLOOR + 1))
        assert shedder.limit == 1024
        assert isinstance(shedder.admit(), Overloaded)
        assert shedder.limit == FLOOR
    finally:
        shedder.stop()


async def test_a_cut_never_lifts_the_limit_above_a_cap_under_the_floor() -> None:
    """``max_in_flight`` 1 (under the floor of 8) and the loop stuck past the grace: the
    cut keeps the cap, and a second request is refused."""
    shedder = Shedder(max_in_flight=1, max_queue_delay=0.1)
    shedder.start()
    try:
        assert shedder.admit() is None
        await _stuck_mid_trip(shedder, 0.4)
        assert isinstance(shedder.admit(), Overloaded)
        assert shedder.limit == 1
    finally:
        shedder.stop()


async def test_a_burst_is_taken_whole() -> None:
    """200 requests in flight and the loop stuck for 0.25 s, past EARLY but under GRACE
    times max_queue_delay (a burst being worked through): as answers go out, their clients
    send their next requests, never more than the burst held: nothing is cut or refused."""
    assert 0.1 * EARLY < 0.25 < 0.1 * GRACE
    shedder = Shedder(max_in_flight=1024, max_queue_delay=0.1)
    shedder.start()
    try:
        assert not any(shedder.admit() for _ in range(200))
        await _stuck_mid_trip(shedder, 0.25)
        for _ in range(100):
            shedder.release()
        assert not any(shedder.admit() for _ in range(100))
        assert shedder.limit == 1024
        await asyncio.sleep(TICK * 2)  # the late trip ends: late, but not past GRACE
        assert shedder.limit == 1024
    finally:
        shedder.stop()


async def test_a_flood_still_growing_while_the_loop_is_late_is_cut_before_the_grace() -> None:
    """200 requests in flight when the trip starts, the loop stuck for 0.25 s (past EARLY,
    under GRACE times max_queue_delay), and requests still coming: once more than the
    trip's 200 and their margin (25) are held, the limit is cut to what is in flight
    times 0.1 s over the trip's time (about 90), and the rest are refused."""
    shedder = Shedder(max_in_flight=1024, max_queue_delay=0.1)
    shedder.start()
    try:
        assert not any(shedder.admit() for _ in range(200))
        await _stuck_mid_trip(shedder, 0.25)
        answers = [shedder.admit() for _ in range(100)]
        assert not any(answers[:26])
        assert all(isinstance(a, Overloaded) for a in answers[26:])
        assert shedder.shed == {"in_flight": 0, "loop_wait": 74}
        assert shedder.limit is not None
        assert 80 <= shedder.limit <= 92
    finally:
        shedder.stop()


async def test_a_flood_on_a_stuck_loop_is_cut_at_once_and_the_limit_comes_back() -> None:
    """200 requests in flight and the loop stuck for 0.4 s, and requests still coming:
    past the 200 and their margin (25) the next request is refused, before the probe's
    trip is over, the limit cut to what is in flight times 0.1 s over the trip's time.
    Once the loop keeps up again the limit climbs back to max_in_flight within a few
    seconds."""
    shedder = Shedder(max_in_flight=1024, max_queue_delay=0.1)
    shedder.start()
    try:
        assert not any(shedder.admit() for _ in range(200))
        await _stuck_mid_trip(shedder, 0.4)
        assert not any(shedder.admit() for _ in range(26))
        refused = shedder.admit()
        assert isinstance(refused, Overloaded)
        assert "event loop" in refused.message
        assert shedder.shed == {"in_flight": 0, "loop_wait": 1}
        assert shedder.limit is not None
        assert 45 <= shedder.limit <= 57
        for _ in range(226):
            shedder.release()
        deadline = time.monotonic() + 10
        while shedder.limit != 1024 and time.monotonic() < deadline:
            await asyncio.sleep(TICK)
        assert shedder.limit == 1024
        assert shedder.wait < 0.1
        assert not any(shedder.admit() for _ in range(1000))
    finally:
        shedder.stop()


async def test_a_closed_loop_late_past_the_grace_is_not_cut() -> None:
    """64 requests in flight, each answered one replaced by its client's next (a closed
    loop), and the loop stuck past GRACE times max_queue_delay: no more work than the
    clients are, none refused: the limit stays where it was."""
    shedder = Shedder(max_in_flight=1024, max_queue_delay=0.1)
    shedder.start()
    try:
        assert not any(shedder.admit() for _ in range(64))
        await _stuck_mid_trip(shedder, 0.35)
        for _ in range(64):
            shedder.release()
            assert shedder.admit() is None
        await _trip_over(shedder)
        assert shedder.wait > 0.1 * GRACE
        assert shedder.limit == 1024
    finally:
        shedder.stop()


async def test_clients_resending_at_once_do_not_hold_the_limit_down() -> None:
    """The limit cut, then refusal after refusal while the loop stays stuck (clients
    resending at once): at the next cut the limit doubles instead of falling. And a later
    trip, late but under the grace, that saw more than RESENT refusals per admission
    raises it by a sixteenth as it ends, as a trip in time would: refusing is what keeps
    it late."""
    shedder = Shedder(max_in_flight=1024, max_queue_delay=0.1)
    shedder.start()
    try:
        assert not any(shedder.admit() for _ in range(200))
        await _stuck_mid_trip(shedder, 0.4)
        assert not any(shedder.admit() for _ in range(26))
        assert all(isinstance(shedder.admit(), Overloaded) for _ in range(500))
        cut = shedder.limit
        assert cut is not None
        assert cut < 60
        time.sleep(0.15)  # noqa: ASYNC251 -- still stuck, the same trip under way
        shedder.admit()
        assert shedder.limit == 2 * cut
        for _ in range(226 - 2 * cut):
            shedder.release()  # as many in flight as the limit: the next are refused
        await _trip_over(shedder)
        await _stuck_mid_trip(shedder, 0.15)
        assert all(isinstance(shedder.admit(), Overloaded) for _ in range(100))
        await _trip_over(shedder)
        assert 0.1 < shedder.wait < 0.1 * GRACE
        assert shedder.limit == 2 * cut + max(1, 2 * cut // 16)
    finally:
        shedder.stop()


def test_over_the_cap_routes_answer_503_in_their_envelope_and_probes_still_answer(
    upstream: MockUpstream,
) -> None:
    """One slot, held by a slow request: chat gets the OpenAI envelope, messages
    Anthropic's, both with Retry-After; /healthz, /readyz and /metrics answer 200."""
    settings = Settings(
        upstream=UpstreamSettings(base_url=upstream.base_url),
        anthropic=AnthropicSettings(base_url=upstream.base_url.removesuffix("/v1")),
        summaries=False,
        max_in_flight=1,
    )
    upstream.push(JSONReply(chat_completion(), delay=1.0))
    with GatewayServer(settings) as server, httpx.Client(base_url=server.url) as client:
        holder = threading.Thread(
            target=client.post,
            args=("/v1/chat/completions",),
            kwargs={"json": CHAT, "headers": AUTH},
        )
        holder.start()
        deadline = time.monotonic() + 5
        while not upstream.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        chat = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
        messages = client.post("/v1/messages", json=CLAUDE, headers=AUTH)
        probes = [client.get(path).status_code for path in ("/healthz", "/readyz", "/metrics")]
        holder.join()
        metrics = client.get("/metrics").text
    assert chat.status_code == 503
    assert chat.headers["retry-after"] == "1"
    assert chat.json()["error"]["type"] == "server_error"
    assert chat.json()["error"]["code"] == "gateway_overloaded"
    assert messages.status_code == 503
    assert messages.headers["retry-after"] == "1"
    assert messages.json()["type"] == "error"
    assert messages.json()["error"]["type"] == "api_error"
    assert probes == [200, 200, 200]
    assert 'contextgate_overload_shed_total{reason="in_flight"} 2.0' in metrics
    assert "contextgate_admitted_in_flight 0.0" in metrics


async def test_an_overload_growing_slowly_trip_after_trip_is_cut() -> None:
    """Open-loop arrivals a little past capacity: each late trip (past GRACE) ends with 15
    more requests held than it began with, under the margin (25 of 200), and nothing is
    refused yet. The growth is counted from the late episode's start, not the trip's: it
    adds up, and the limit is cut before max_in_flight are held."""
    shedder = Shedder(max_in_flight=1024, max_queue_delay=0.1)
    shedder.start()
    try:
        assert not any(shedder.admit() for _ in range(200))
        for _ in range(4):
            await _stuck_mid_trip(shedder, 0.35)
            for _ in range(15):
                shedder.admit()
            await _trip_over(shedder)
            assert shedder.wait > 0.1 * GRACE
        assert shedder.in_flight <= 260
        assert shedder.limit is not None
        assert shedder.limit < 1024
    finally:
        shedder.stop()


async def test_one_long_turn_under_the_grace_with_a_few_arrivals_is_not_cut() -> None:
    """A single 0.25 s turn (under GRACE x 0.1 s) with 3 in flight, during which 12
    requests of a light load arrived: all taken, the limit untouched (the margin is
    twice the floor: a stall's few arrivals are not a flood)."""
    shedder = Shedder(max_in_flight=1024, max_queue_delay=0.1)
    shedder.start()
    try:
        for _ in range(3):
            assert shedder.admit() is None
        await _stuck_mid_trip(shedder, 0.25)
        assert not any(shedder.admit() for _ in range(12))
        assert shedder.limit == 1024
    finally:
        shedder.stop()
