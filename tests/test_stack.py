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


@given(initial=st.lists(st.integers(0, 65535), max_size=80), seq=ops, capacity=st.integers(0, 200), share=st.booleans())
def test_stack_matches_a_list(initial: list[int], seq: list, capacity: int, share: bool) -> None:
    """Also with share=True: a pop that lies wholly in the payload is a view of it, and every
    popped array keeps its values through all later pushes and pops."""
    payload = np.array(initial, np.uint16)
    payload.setflags(write=False)
    stack, model = SymbolStack(16, payload, capacity=capacity), list(initial)
    popped: list[tuple[np.ndarray, list[int]]] = []
    in_payload = len(initial)  # the model's bottom entries that are still the payload's
    for kind, arg in seq:
        if kind == "push":
            stack.push(np.array(arg, np.uint16))
            model.extend(arg)
        elif arg > len(model):
            with pytest.raises(FormatError):
                stack.pop(arg, share)
        else:
            from_payload = len(model) <= in_payload  # nothing pushed is left above the payload
            got = stack.pop(arg, share)
            want = model[len(model) - arg :]
            del model[len(model) - arg :]
            in_payload = min(in_payload, len(model))
            assert got.tolist() == want
            if arg:
                assert np.shares_memory(got, payload) == (share and from_payload)
            popped.append((got, want))
        assert len(stack) == len(model)
        assert stack.symbols().tolist() == model
    assert payload.tolist() == initial
    assert all(got.tolist() == want for got, want in popped)
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
