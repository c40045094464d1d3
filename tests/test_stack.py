"""SymbolStack against a list model: any sequence of pushes and pops over an initial payload
gives what a plain list would, and the payload is never written to."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bbformat.codec.stack import SymbolStack
from bbformat.errors import FormatError

ops = st.lists(st.one_of(st.tuples(st.just("push"), st.lists(st.integers(0, 65535), max_size=40)),
                         st.tuples(st.just("pop"), st.integers(0, 60))), max_size=40)


@given(initial=st.lists(st.integers(0, 65535), max_size=80), seq=ops, capacity=st.integers(0, 200))
def test_stack_matches_a_list(initial: list[int], seq: list, capacity: int) -> None:
    payload = np.array(initial, np.uint16)
    payload.setflags(write=False)
    stack, model = SymbolStack(16, payload, capacity=capacity), list(initial)
    for kind, arg in seq:
        if kind == "push":
            stack.push(np.array(arg, np.uint16))
            model.extend(arg)
        elif arg > len(model):
            with pytest.raises(FormatError):
                stack.pop(arg)
        else:
            got = stack.pop(arg)
            want = model[len(model) - arg :]
            del model[len(model) - arg :]
            assert got.tolist() == want
        assert len(stack) == len(model)
        assert stack.symbols().tolist() == model
    assert payload.tolist() == initial
    assert stack.take().tolist() == model and len(stack) == 0


def test_push_then_pop_restores_the_state() -> None:
    rng = np.random.default_rng(0)
    stack = SymbolStack(16, rng.integers(0, 1 << 16, 50, dtype=np.uint16))
    before = stack.symbols()
    pushed = rng.integers(0, 1 << 16, 30, dtype=np.uint16)
    stack.push(pushed)
    assert np.array_equal(stack.pop(30), pushed)
    assert np.array_equal(stack.symbols(), before)


def test_whole_fresh_payload_is_handed_over() -> None:
    payload = np.arange(10, dtype=np.uint16)
    stack = SymbolStack(16, payload)
    assert stack.pop(10) is payload and len(stack) == 0
