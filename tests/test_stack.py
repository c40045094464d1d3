"""SymbolStack against a list model: any sequence of pushes and pops over an initial payload
gives what a plain list would, and the payload is never written to."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bbformat.codec.stack import SymbolStack
from bbformat.errors import FormatError

ops = st.lists(st.one_of(st.tuples(st.just("push"), st.lists(st.integers(0, 65535), max_size=40), st.booleans()),
                         st.tuples(st.just("pop"), st.integers(0, 60), st.just(False))), max_size=40)


@given(initial=st.lists(st.integers(0, 65535), max_size=80), seq=ops, capacity=st.integers(0, 200), share=st.booleans())
def test_stack_matches_a_list(initial: list[int], seq: list, capacity: int, share: bool) -> None:
    """Also with share=True: a pop that lies wholly in the payload is a view of it, and every
    popped array keeps its values through all later pushes and pops. Pushes with adopt=True
    (the stack may keep the array itself) of read-only arrays: the stack never writes to them,
    and they keep their values."""
    payload = np.array(initial, np.uint16)
    payload.setflags(write=False)
    stack, model = SymbolStack(16, payload, capacity=capacity), list(initial)
    popped: list[tuple[np.ndarray, list[int]]] = []
    pushed: list[tuple[np.ndarray, list[int]]] = []
    in_payload = len(initial)  # the model's bottom entries that are still the payload's
    for kind, arg, adopt in seq:
        if kind == "push":
            a = np.array(arg, np.uint16)
            a.setflags(write=False)
            stack.push(a, adopt=adopt)
            pushed.append((a, list(arg)))
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
    assert all(a.tolist() == want for a, want in pushed)
    assert stack.take().tolist() == model and len(stack) == 0


def test_a_push_that_fills_the_reserved_room_adopts_the_array_only_when_asked() -> None:
    sym = np.arange(100, dtype=np.uint16)
    for adopt in (False, True):
        stack = SymbolStack(16, capacity=100)
        stack.push(sym, adopt=adopt)
        assert np.shares_memory(stack.take(), sym) == adopt
    stack = SymbolStack(16, capacity=101)  # room for more: copied, so later pushes need no regrowth
    stack.push(sym, adopt=True)
    stack.push(np.array([7], np.uint16), adopt=True)
    out = stack.take()
    assert not np.shares_memory(out, sym) and out.tolist() == list(range(100)) + [7]
    for pop, more in ((1, [9]), (40, [9, 9, 9]), (0, [])):  # after a pop, a push must not land in the adopted array
        mine = np.arange(100, dtype=np.uint16)  # writable: a write into it would go unnoticed
        stack = SymbolStack(16, capacity=100)
        stack.push(mine, adopt=True)
        stack.pop(pop)
        stack.push(np.array(more, np.uint16), adopt=True)
        assert mine.tolist() == list(range(100))
        assert stack.take().tolist() == list(range(100 - pop)) + more


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
