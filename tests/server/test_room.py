"""The make-room decision on its own: which kernels are suspended, where, and why not."""
from __future__ import annotations

import pytest

from jupyter_gpucr.core.sizes import parse_size
from jupyter_gpucr.server.room import Place, Resident, Rules, decide, keep_free

GiB = 1 << 30
NOW = 10_000.0


def idle(kernel_id: str, idle_s: float, nbytes: int = GiB, **kw) -> Resident:
    return Resident(kernel_id, nbytes, NOW - idle_s, owner=kw.pop("owner", 1000), **kw)


def rules(**kw) -> Rules:
    return Rules(NOW, **{"min_resident_s": 300.0, "owner": 1000, **kw})


def test_a_place_with_room_is_taken_without_suspending():
    places = [Place("a", "on GPU 0", GiB // 2, (idle("x", 1000),)), Place("b", "on GPU 1", 2 * GiB)]
    d = decide(GiB, places, rules())
    assert d.place is places[1] and d.victims == ()


def test_least_recently_used_idle_kernels_go_first_until_it_fits():
    place = Place("a", "on GPU 0", GiB // 2, (idle("recent", 400), idle("oldest", 5000), idle("old", 2000)))
    d = decide(2 * GiB, [place], rules())
    assert [v.kernel_id for v in d.victims] == ["oldest", "old"]
    assert d.message == "waiting for room on GPU 0: suspending 2 idle kernels"


def test_the_place_needing_fewest_suspends_wins():
    small = Place("a", "on GPU 0", 0, (idle("a1", 900, GiB // 2), idle("a2", 800, GiB // 2)))
    big = Place("b", "on GPU 1", 0, (idle("b1", 400, 2 * GiB),))
    d = decide(GiB, [small, big], rules())
    assert d.place is big and [v.kernel_id for v in d.victims] == ["b1"]
    assert d.message == "waiting for room on GPU 1: suspending 1 idle kernel"


def test_busy_recent_moving_and_other_users_kernels_stay():
    place = Place("h", "in host memory", 0, (
        idle("busy", 9000, busy=True), idle("recent", 10), idle("moving", 9000, running=False),
        idle("theirs", 9000, owner=1001)))
    d = decide(GiB, [place], rules())
    assert d.place is None
    assert "running a cell" in d.why and "used in the last 300 s" in d.why and "another user's" in d.why
    d = decide(GiB, [place], rules(evict_others=True))
    assert [v.kernel_id for v in d.victims] == ["theirs"]


def test_own_kernels_go_before_other_users_even_when_theirs_are_older():
    place = Place("h", "in host memory", 0, (idle("theirs", 9000, owner=1001), idle("mine", 500)))
    d = decide(GiB, [place], rules(evict_others=True))
    assert [v.kernel_id for v in d.victims] == ["mine"]


def test_policy_never_refuses_and_says_so():
    place = Place("a", "on GPU 0", 0, (idle("x", 9000),))
    d = decide(GiB, [place], rules(policy="never"))
    assert d.place is None and "room_policy is 'never'" in d.why


def test_room_kept_free_asks_nothing_while_it_is_free():
    place = Place("g", "on GPU 0", 2 * GiB, (idle("x", 9000),))
    assert keep_free(place, 2 * GiB, rules()) is None


def test_a_kernel_grown_into_the_room_kept_free_has_idle_ones_suspended_lru_first_never_itself():
    place = Place("g", "on GPU 0", GiB // 2, (
        idle("grown", 9000, 4 * GiB), idle("old", 5000), idle("older", 6000), idle("busy", 9000, busy=True)))
    d = keep_free(place, 2 * GiB, rules(), spare={"grown"})
    assert d is not None and d.place is not None
    assert [v.kernel_id for v in d.victims] == ["older", "old"]


def test_room_kept_free_says_why_when_only_spared_recent_or_others_kernels_hold_it():
    place = Place("g", "on GPU 0", 0, (idle("grown", 9000), idle("recent", 10), idle("theirs", 9000, owner=1001)))
    d = keep_free(place, GiB, rules(), spare={"grown"})
    assert d is not None and d.place is None and not d.victims
    assert "used in the last 300 s" in d.why and "another user's" in d.why


@pytest.mark.parametrize("value,whole,expected", [
    ("3GiB", None, 3 * GiB), ("768 MiB", None, 768 << 20), (0.5, 8 * GiB, 4 * GiB), ("0.25", 8 * GiB, 2 * GiB),
    ("", None, 0), (2e9, None, 2_000_000_000), ("1073741824", None, GiB)])
def test_sizes(value, whole, expected):
    assert parse_size(value, whole) == expected


def test_a_wrong_size_says_how_to_write_one():
    with pytest.raises(ValueError, match="'3GiB'"):
        parse_size("three gigs")
