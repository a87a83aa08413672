"""The console's session cookie and sign-in: the cookie carries its issue time and a random id,
signed; the server refuses it once expired, tampered with or signed out (on every worker
sharing the Redis); wrong sign-ins from one source are slowed, others' are not. Units on the
real objects with an injected clock, then two real `hotline serve` sharing a real Redis."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait

import httpx
import pytest
from pydantic import SecretStr

from tests.support.redis_server import RedisServer
from tests.support.server import Server, logged, start_server, stop_server
from voice.server import auth
from voice.server.routes import console

TOKEN = "console-session-api-token-" + uuid.uuid4().hex
SECRET = SecretStr(TOKEN)


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- the cookie --------------------------------------------------------------------------------


def test_a_session_carries_its_issue_time_and_a_random_id() -> None:
    clock = Clock()
    cookie = auth.issue_console_session(SECRET, clock)
    session = auth.read_console_session(SECRET, cookie, clock)
    assert session is not None and session.issued_at == int(clock.now)
    assert session.expires_at == int(clock.now) + 12 * 3600
    again = auth.issue_console_session(SECRET, clock)
    assert again != cookie  # another sign-in, another session
    assert TOKEN not in cookie and TOKEN not in again


def test_a_session_expires_on_the_server_after_12_hours() -> None:
    clock = Clock()
    cookie = auth.issue_console_session(SECRET, clock)
    clock.now += 12 * 3600 - 1
    assert auth.read_console_session(SECRET, cookie, clock) is not None
    clock.now += 1
    assert auth.read_console_session(SECRET, cookie, clock) is None


def test_a_session_from_the_future_is_refused() -> None:
    clock = Clock()
    cookie = auth.issue_console_session(SECRET, Clock(clock.now + 301))  # past the clock skew
    assert auth.read_console_session(SECRET, cookie, clock) is None
    cookie = auth.issue_console_session(SECRET, Clock(clock.now + 299))
    assert auth.read_console_session(SECRET, cookie, clock) is not None


def _tampered(cookie: str) -> list[str]:
    version, issued, session_id, signature = cookie.split(".")
    flip = {"0": "1", "1": "0"}
    return [
        f"{version}.{int(issued) + 3600}.{session_id}.{signature}",  # younger than it is
        f"{version}.{issued}.{session_id[:-1]}{'A' if session_id[-1] != 'A' else 'B'}.{signature}",
        f"{version}.{issued}.{session_id}.{signature[:-1]}{'0' if signature[-1] != '0' else '1'}",
        f"v2.{issued}.{session_id}.{signature}",
        f"{version}.{issued}.{session_id}.{signature.upper()}",
        f"{version}.{issued}.{session_id}",
        cookie + "0",
        cookie[:-1],
        "".join(flip.get(c, c) for c in cookie),
        auth.issue_console_session(SecretStr("another token")),
        "",
        "v1." * 10_000,  # long: refused before the pattern looks at it (the last one)
    ]


def test_a_tampered_or_foreign_session_is_refused() -> None:
    cookie = auth.issue_console_session(SECRET)
    for forged in _tampered(cookie):
        assert auth.read_console_session(SECRET, forged) is None, forged


# -- slowing wrong sign-ins --------------------------------------------------------------------


def test_five_wrong_tokens_in_a_minute_lock_a_source_out_for_longer_each_time() -> None:
    clock = Clock(0.0)
    throttle = console.SignInThrottle(clock)
    locks = []
    for _ in range(8):  # eight rounds of five wrong tokens, each after the lock-out
        started = [throttle.failed("127.0.0.2") for _ in range(5)]
        assert started[:4] == [0, 0, 0, 0]
        locks.append(started[4])
        assert throttle.locked_for("127.0.0.2") == started[4]
        assert throttle.locked_for("127.0.0.3") == 0  # another source is not affected
        clock.now += started[4] - 1
        assert throttle.locked_for("127.0.0.2") == 1
        clock.now += 1
        assert throttle.locked_for("127.0.0.2") == 0
    assert locks == [30, 60, 120, 240, 480, 900, 900, 900]


def test_wrong_tokens_spread_out_or_forgiven_do_not_lock() -> None:
    clock = Clock(0.0)
    throttle = console.SignInThrottle(clock)
    for _ in range(20):  # four a minute, for twenty minutes
        assert [throttle.failed("a") for _ in range(4)] == [0, 0, 0, 0]
        clock.now += 60
    for _ in range(4):
        throttle.failed("b")
    throttle.succeeded("b")  # the right token: its wrong ones are forgiven
    assert [throttle.failed("b") for _ in range(4)] == [0, 0, 0, 0]
    # after an hour without a wrong token, a source starts again from the first lock-out
    for _ in range(5):
        throttle.failed("c")
    clock.now += 3600
    assert [throttle.failed("c") for _ in range(5)][-1] == 30


def test_the_throttle_remembers_a_bounded_number_of_sources() -> None:
    throttle = console.SignInThrottle(Clock(0.0), max_sources=100)
    for i in range(1000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(throttle._sources) == 100


@pytest.mark.parametrize(
    ("host", "source"),
    [
        ("127.0.0.2", "127.0.0.2"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),  # the same /64: one source
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("testclient", "testclient"),
    ],
)
def test_a_source_is_an_address_or_an_ipv6_slash_64(host: str, source: str) -> None:
    assert console.source_of(host) == source


# -- two real workers sharing a real Redis -----------------------------------------------------


@pytest.fixture(scope="module")
def workers(redis_server: RedisServer) -> Iterator[tuple[Server, Server]]:
    env = {
        "HOTLINE_API_TOKEN": TOKEN,
        "HOTLINE_REDIS_URL": redis_server.url,
    }
    with ThreadPoolExecutor(2) as pool:  # both start at once
        starting = [pool.submit(start_server, env) for _ in range(2)]
        wait(starting)
    started = [f.result() for f in starting if f.exception() is None]
    try:
        assert len(started) == 2, [f.exception() for f in starting]
        yield started[0], started[1]
    finally:
        with ThreadPoolExecutor(2) as pool:  # both stop at once
            codes = list(pool.map(stop_server, started))
    assert codes == [0] * len(started), "\n".join(line for s in started for line in s.log[-20:])


def _client(server: Server, source: str = "127.0.0.1") -> httpx.AsyncClient:
    """A client of `server` whose connections come from the loopback address `source`."""
    transport = httpx.AsyncHTTPTransport(local_address=source)
    return httpx.AsyncClient(base_url=server.url, transport=transport, timeout=10)


async def _sign_in(server: Server) -> str:
    async with _client(server) as http:
        response = await http.post("/console/login", data={"token": TOKEN})
    assert response.status_code == 303, response.text
    return response.cookies["hotline_console"]


async def _with_cookie(server: Server, cookie: str) -> int:
    """What the calls API answers to the console's cookie alone."""
    async with _client(server) as http:
        response = await http.get("/calls", headers={"Cookie": f"hotline_console={cookie}"})
    return response.status_code


@pytest.mark.slow
async def test_a_session_works_on_every_worker_until_signed_out_on_one(
    workers: tuple[Server, Server],
) -> None:
    a, b = workers
    cookie = await _sign_in(a)
    assert await _with_cookie(a, cookie) == 200
    assert await _with_cookie(b, cookie) == 200  # signed with a key every worker derives
    other = await _sign_in(b)  # another browser's session
    async with _client(a) as http:
        out = await http.post("/console/logout", headers={"Cookie": f"hotline_console={cookie}"})
    assert out.status_code == 303
    assert "hotline_console=" in out.headers["set-cookie"]  # the browser forgets it too
    assert await _with_cookie(a, cookie) == 401
    assert await _with_cookie(b, cookie) == 401  # revoked in Redis, for every worker
    async with _client(b) as http:
        page = await http.get("/console", headers={"Cookie": f"hotline_console={cookie}"})
    assert page.status_code == 200 and 'id="sign-in"' in page.text  # the sign-in form again
    assert await _with_cookie(b, other) == 200  # only that session was signed out


@pytest.mark.slow
async def test_the_softphone_signs_in_with_the_consoles_form(
    workers: tuple[Server, Server],
) -> None:
    """With a token set, the softphone page is the console's sign-in form until signed in; the
    form comes back to the softphone (and to no page elsewhere), with the console's cookie."""
    a, _ = workers
    async with _client(a) as http:
        form = await http.get("/")
        assert form.status_code == 200 and 'id="sign-in"' in form.text
        assert 'name="next" value="/"' in form.text and 'id="call"' not in form.text
        wrong = await http.post("/console/login", data={"token": "a guess", "next": "/"})
        assert wrong.status_code == 401 and 'name="next" value="/"' in wrong.text
        signed = await http.post("/console/login", data={"token": TOKEN, "next": "/"})
        assert signed.status_code == 303 and signed.headers["location"] == "/"
        elsewhere = {"token": TOKEN, "next": "https://example.com/"}
        away = await http.post("/console/login", data=elsewhere)
        assert away.status_code == 303 and away.headers["location"] == "/console"
        cookie = {"Cookie": f"hotline_console={signed.cookies['hotline_console']}"}
        page = await http.get("/", headers=cookie)
        assert page.status_code == 200 and 'id="call"' in page.text
        # the page's call goes through: refused for its SDP, not for a missing token
        bad = await http.post("/offer", json={"sdp": "v=0", "type": "offer"}, headers=cookie)
        assert bad.status_code == 400, bad.text


@pytest.mark.slow
async def test_an_expired_or_tampered_session_is_refused(workers: tuple[Server, Server]) -> None:
    a, _ = workers
    old = auth.issue_console_session(SECRET, lambda: time.time() - 12 * 3600 - 5)
    assert await _with_cookie(a, old) == 401  # signed right, but issued 12 h ago
    fresh = auth.issue_console_session(SECRET, lambda: time.time() - 12 * 3600 + 60)
    assert await _with_cookie(a, fresh) == 200  # the same, a minute younger than the limit
    cookie = await _sign_in(a)
    for forged in _tampered(cookie)[:-1]:
        assert await _with_cookie(a, forged) == 401, forged


@pytest.mark.slow
async def test_wrong_sign_ins_from_one_source_are_slowed_not_others(
    workers: tuple[Server, Server],
) -> None:
    a, _ = workers
    stranger, neighbour = "127.0.0.2", "127.0.0.3"
    mark = a.log_mark()
    async with _client(a, stranger) as http:
        answers = []
        for _ in range(20):
            response = await http.post("/console/login", data={"token": "a guess"})
            answers.append((response.status_code, response.headers.get("retry-after")))
        assert [status for status, _ in answers[:4]] == [401] * 4
        assert all(status == 429 for status, _ in answers[4:]), answers
        assert all(0 < int(wait or 0) <= 30 for _, wait in answers[4:]), answers
        # during the lock-out the right token is refused too: it is not even looked at
        right = await http.post("/console/login", data={"token": TOKEN})
        assert right.status_code == 429 and "hotline_console" not in right.cookies
        assert "try again in" in right.text
    async with _client(a, neighbour) as http:
        assert (await http.post("/console/login", data={"token": "x"})).status_code == 401
        assert (await http.post("/console/login", data={"token": TOKEN})).status_code == 303
    await logged(a, f"console: wrong token from {stranger}, sign-in locked for 30 s", since=mark)
    said = [line for line in a.log[mark.line :] if f"console: wrong token from {stranger}" in line]
    assert len(said) == 5  # the refused attempts are not logged one by one


@pytest.mark.slow
async def test_a_session_that_cannot_be_checked_is_refused_not_trusted(
    workers: tuple[Server, Server], redis_server: RedisServer
) -> None:
    """Redis unreachable: a console session cannot be checked for a sign-out, so it gets 503
    (the bearer token, which needs no Redis, still works); once Redis is back, it works again."""
    a, _ = workers
    cookie = await _sign_in(a)
    redis_server.stop()
    try:
        async with _client(a) as http:
            page = await http.get("/console", headers={"Cookie": f"hotline_console={cookie}"})
            assert page.status_code == 503, page.text
            bearer = await http.get("/console", headers={"Authorization": f"Bearer {TOKEN}"})
            assert bearer.status_code == 200 and 'id="sign-out"' in bearer.text
    finally:
        redis_server.start()
    assert await _with_cookie(a, cookie) == 200
