"""The console's sessions and login throttle as pure objects, on a hand-moved clock."""

from __future__ import annotations

from services.console.auth import MASTER, VIEWER, LoginThrottle, Sessions


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sessions_are_random_expire_and_end_at_logout() -> None:
    clock = Clock()
    sessions = Sessions("master-key", "viewer-key", ttl_s=60, clock=clock)
    one, two, viewer = sessions.login("master-key"), sessions.login("master-key"), sessions.login("viewer-key")
    assert one and two and viewer and len({one, two, viewer}) == 3
    assert sessions.login("wrong") is None and sessions.login("") is None
    assert (sessions.role(one), sessions.role(viewer)) == (MASTER, VIEWER)
    for forged in (None, "", "master", "master.00", "\xff\xe9", "\udc80", one + "x"):
        assert sessions.role(forged) is None
    sessions.logout(one)
    assert sessions.role(one) is None and sessions.role(two) == MASTER
    clock.now += 60
    assert sessions.role(two) is None and sessions.role(viewer) is None


def test_wrong_keys_shut_an_address_out_for_longer_each_time() -> None:
    clock = Clock()
    throttle = LoginThrottle(free=2, longest_s=8, forget_s=100, clock=clock)
    for _ in range(2):
        assert throttle.wait_s("a") == 0
        throttle.failed("a")
    assert throttle.wait_s("a") == 0  # the free ones are answered at once
    waits = []
    for _ in range(6):
        throttle.failed("a")
        waits.append(throttle.wait_s("a"))
        clock.now += waits[-1]
    assert waits == [1, 2, 4, 8, 8, 8]
    assert throttle.wait_s("b") == 0  # per address
    throttle.failed("a")
    clock.now += 100  # quiet for forget_s: a fresh start
    assert throttle.wait_s("a") == 0
    throttle.failed("a")
    throttle.failed("a")
    assert throttle.wait_s("a") == 0
    throttle.succeeded("a")
    throttle.failed("a")
    throttle.failed("a")
    assert throttle.wait_s("a") == 0
