"""Fuzzing the sampling settings (issue 6): arbitrary values for every field of `Sampling` through `validate` and
`merged`, and arbitrary durations / ABC budgets through `Budgets`. Only RequestError may escape; an accepted setting
lies inside the reference's ranges (runtime.md §2: temperature [0, 5], top_p (0, 1], top_k ≥ 1, penalty > 0, window
[1, 100], 0 ≤ min ≤ max, max ≥ 1, exact ints for the integer fields)."""
from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yue2_core.errors import RequestError
from yue2_core.pipeline import Budgets
from yue2_core.protocol import Sampling, seconds_to_tokens

pytestmark = pytest.mark.usefixtures("single_thread")
EXAMPLES = 2500
ANY = st.one_of(
    st.integers(-(10 ** 6), 10 ** 6), st.integers(-(10 ** 400), 10 ** 400), st.floats(), st.booleans(), st.none(),
    st.text(max_size=3),
    st.sampled_from([np.float64(0.5), np.int64(3), np.float32(0.5), np.bool_(True), Fraction(1, 2), Decimal("0.5"),
                     complex(1, 0), [], {}, b"1", 10 ** 400, -(10 ** 400), float("nan"), float("inf"), 1e-320]),
)
FIELDS = {
    "temperature": st.one_of(st.floats(0, 5), ANY),
    "top_p": st.one_of(st.floats(0, 1), ANY),
    "top_k": st.one_of(st.integers(-3, 1000), ANY),
    "repetition_penalty": st.one_of(st.floats(0, 3), ANY),
    "penalty_window": st.one_of(st.integers(-3, 105), ANY),
    "min_tokens": st.one_of(st.integers(-3, 10_000), ANY),
    "max_tokens": st.one_of(st.integers(-3, 30_000), ANY),
}


def _accepted(s: Sampling) -> None:
    for name in ("top_k", "penalty_window", "min_tokens", "max_tokens"):
        assert type(getattr(s, name)) is int
    for name in ("temperature", "top_p", "repetition_penalty"):
        v = getattr(s, name)
        assert not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    assert 0 <= s.temperature <= 5 and 0 < s.top_p <= 1 and s.top_k >= 1 and s.repetition_penalty > 0
    assert 1 <= s.penalty_window <= 100 and 1 <= s.max_tokens and 0 <= s.min_tokens <= s.max_tokens


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None)
@given(values=st.fixed_dictionaries({}, optional=FIELDS), phase=st.sampled_from(["", "abc", "semantic"]),
       overrides=st.dictionaries(st.one_of(st.sampled_from(sorted(FIELDS)), st.text(max_size=6)), ANY, max_size=3))
def test_fuzz_sampling_validation(values, phase, overrides):
    try:
        s = Sampling(**values).validate(phase)
    except RequestError as error:
        assert str(error).startswith(f"{phase} sampling" if phase else "sampling")
    else:
        _accepted(s)
    try:
        merged = Sampling().merged(overrides).validate()
    except RequestError as error:
        assert str(error)
    else:
        _accepted(merged)


@settings(max_examples=EXAMPLES // 2, deadline=None, derandomize=True, database=None)
@given(seconds=st.one_of(st.floats(0, 1000), ANY), abc_tokens=st.one_of(st.integers(-3, 30_000), ANY))
def test_fuzz_budgets(seconds, abc_tokens):
    """`--max-seconds` / `--max-abc-tokens` values: RequestError or a validated budget that respects the cap."""
    budgets = Budgets(max_seconds=seconds, max_abc_tokens=abc_tokens)
    try:
        sem = budgets.semantic_sampling()
    except RequestError as error:
        assert "max duration" in str(error) or "sampling" in str(error)
    else:
        _accepted(sem)
        if seconds is not None:
            assert sem.max_tokens == seconds_to_tokens(seconds) and sem.min_tokens <= sem.max_tokens
    try:
        abc = budgets.abc_sampling()
    except RequestError as error:
        assert str(error)
    else:
        _accepted(abc)
        if abc_tokens is not None:
            assert abc.max_tokens == abc_tokens
