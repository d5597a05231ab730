"""``zepp.planner.intsort``: the stable order of integer keys, read off one plain sort of packed
``key * 2**b + index`` values, is numpy's stable argsort element for element, on random keys and
on the edges where the packing does not fit (negative keys, keys near 2**62, non-integer dtypes)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from planner_cases import SETTINGS
from zepp.planner.intsort import _packable, sorted_unique, sorted_with_order, stable_argsort

INT_DTYPES = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)


def check_same(key) -> None:
    key = np.asarray(key)
    if key.dtype != bool:
        np.testing.assert_array_equal(sorted_unique(key), np.unique(key), strict=True)
    want = np.argsort(key, kind="stable")
    got = stable_argsort(key)
    np.testing.assert_array_equal(got, want)
    ks, order = sorted_with_order(key)
    np.testing.assert_array_equal(order, want)
    np.testing.assert_array_equal(ks, key[want].astype(np.int64))
    assert ks.dtype == np.int64


@SETTINGS
@given(st.sampled_from(INT_DTYPES).flatmap(
    lambda dt: hnp.arrays(dt, st.integers(0, 300), elements=hnp.from_dtype(np.dtype(dt)))))
def test_any_integer_keys_match_numpy(key):
    check_same(key)


@SETTINGS
@given(st.integers(0, 2000), st.integers(1, 50), st.integers(0, 2**32 - 1))
def test_few_distinct_keys_keep_index_order(n, distinct, seed):
    """Many ties: the packed path must keep each tie in index order."""
    key = np.random.default_rng(seed).integers(0, distinct, size=n)
    assert _packable(key) is not None or n < 2
    check_same(key)


@pytest.mark.parametrize("key", [
    [],  # empty
    [7],  # one key: nothing to pack
    [3, 3, 3, 3],  # all equal
    [5, 4, 3, 2, 1, 0],  # descending
    [0, -1, 2, -3, 0, -1],  # negative keys: numpy's own argsort
    [2**61 - 1, 0, 2**61 - 1, 1],  # packed values would pass 2**62: numpy's own argsort
    np.array([True, False, True, False]),  # bool keys pack as 0/1
])
def test_edge_cases_match_numpy(key):
    check_same(key)


def test_packing_bounds():
    assert _packable(np.arange(4)) == 2  # 4 indices need 2 bits
    assert _packable(np.array([1 << 59, 0, 0, 0])) == 2
    assert _packable(np.array([1 << 60, 0, 0, 0])) is None  # (1 << 60) << 2 reaches 2**62
    assert _packable(np.array([-1, 0])) is None
    assert _packable(np.array([0.5, 1.5])) is None  # not integers
    assert _packable(np.array([3])) is None


def test_float_keys_fall_back_to_numpy():
    key = np.array([0.5, -1.0, 0.5, 2.0])
    np.testing.assert_array_equal(stable_argsort(key), np.argsort(key, kind="stable"))
