"""PlacementCache: one value per placement object (and key), rebuilt for another object, the last few kept."""

from __future__ import annotations

from zepp.planner.placement_cache import PlacementCache


class _Placement:  # a stand-in: the cache reads only the object's identity
    pass


def test_a_value_is_built_once_per_placement_object_and_key():
    cache, built = PlacementCache(size=2), []

    def build(tag):
        built.append(tag)
        return tag

    a, b = _Placement(), _Placement()
    assert cache.get(a, lambda: build("a")) == "a"
    assert cache.get(a, lambda: build("again")) == "a"  # the same object: no rebuild
    assert cache.get(a, lambda: build("a-cpu"), "cpu") == "a-cpu"  # another key: its own value
    assert cache.get(b, lambda: build("b")) == "b"  # a third entry: the oldest (a) goes
    assert cache.get(a, lambda: build("a2")) == "a2"
    assert built == ["a", "a-cpu", "b", "a2"]
