"""The benchmark's figures (``zepp.sim.plots``): ``bars`` and ``gantt`` write PNGs of the size
their layout asks for, ``bars`` refuses rows it cannot normalise, ``gantt`` draws the ranks asked
for."""

import struct

import numpy as np
import pytest

from zepp.sim.plots import rank_of, bars, gantt
from zepp.sim.run import run_system
from simcases import skewed_config

DPI = 110  # plots.py saves every figure at 110 dpi


def png_size(path) -> tuple[int, int]:
    """``(width, height)`` of a PNG file, read from its header (fails on anything else)."""
    data = open(path, "rb").read(32)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG file"
    return struct.unpack(">II", data[16:24])


def row(model, nodes, mb, **lat):
    return dict(model=model, nodes=nodes, budget_mb=mb, latency_ms=lat)


ROWS = [row("k2", 4, 1.0, a2av=4.0, fast=5.0, zepp=2.0), row("k2", 8, 1.0, a2av=8.0, fast=6.0, zepp=3.0),
        row("qwen", 4, 1.0, a2av=2.0, zepp=1.5)]


@pytest.fixture(scope="module")
def timeline():
    return run_system("zepp-overlap", skewed_config(0, 2, 2, 24, hidden=1024, ffn=512), keep_timeline=True).timeline


def test_bars_draws_one_panel_per_model(tmp_path):
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    bars(ROWS[:2], ["a2av", "fast", "zepp"], str(one), title="t")
    bars(ROWS, ["a2av", "fast", "zepp"], str(two))
    (w1, h1), (w2, h2) = png_size(one), png_size(two)
    assert (w1, h1) == (round(9.0 * DPI), round(4.2 * DPI))  # narrow tables keep the 9-inch minimum
    assert w2 == w1 and h2 == 2 * h1  # a second model adds a 4.2-inch panel


def test_bars_widen_with_the_configurations_shown(tmp_path):
    many = [row("k2", n, mb, a2av=1.0 + n, zepp=1.0) for n in (2, 4, 8, 16) for mb in (1.0, 4.0, 16.0)]
    path = tmp_path / "wide.png"
    systems = ["a2av", "fast", "comet", "eplb", "zepp"]
    bars(many, systems, str(path))
    w, h = png_size(path)
    assert w == round(0.9 * len(many) * (len(systems) + 1) / 4 * DPI) and h == round(4.2 * DPI)


def test_bars_refuses_rows_it_cannot_normalise(tmp_path):
    path = tmp_path / "x.png"
    with pytest.raises(ValueError, match="no rows"):
        bars([], ["a2av", "zepp"], str(path))
    with pytest.raises(ValueError, match=r"row\(s\) \[1\]"):
        bars([ROWS[0], row("k2", 8, 1.0, zepp=1.0)], ["a2av", "zepp"], str(path))
    with pytest.raises(ValueError, match="none given"):
        bars(ROWS, ["zepp"], str(path))
    assert not path.exists()  # refused before anything was drawn


def test_gantt_draws_the_ranks_asked_for(tmp_path, timeline):
    path = tmp_path / "g.png"
    drawn = gantt(timeline, str(path), ranks=[1, 6])
    assert len(drawn) == 1
    names = drawn[0]
    assert names and {rank_of(n) for n in names} == {1, 6}
    assert {"gpu1.compute", "gpu6.compute"} <= set(names)
    # every resource of those ranks that holds a task of some length is a row
    busy = {r for r, s, e in zip(timeline.resource, timeline.start, timeline.end) if r != "-" and e > s}
    assert set(names) == {r for r in busy if rank_of(r) in (1, 6)}
    w, h = png_size(path)
    assert w == 13 * DPI and h == round((max(2.0, 0.26 * len(names) + 0.8) + 0.8) * DPI)


def test_gantt_stacks_compared_timelines_and_caps_rows(tmp_path, timeline):
    path = tmp_path / "cmp.png"
    drawn = gantt([("a", timeline), ("b", timeline)], str(path), title="two", max_rows=3)
    assert [len(d) for d in drawn] == [3, 3] and drawn[0] == drawn[1]
    ranks = [rank_of(n) for n in drawn[0]]
    assert ranks == sorted(ranks)  # rank-major order, rank 0 first
    w, h = png_size(path)
    assert w == 13 * DPI and h == round((2 * max(2.0, 0.26 * 3 + 0.8) + 0.8) * DPI)


def test_png_size_reads_only_pngs(tmp_path):
    p = tmp_path / "not.png"
    p.write_bytes(np.zeros(32, np.uint8).tobytes())
    with pytest.raises(AssertionError, match="not a PNG"):
        png_size(p)
