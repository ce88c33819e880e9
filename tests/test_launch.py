"""Launch helpers: when a repeated call may reuse a bound launch, and when it must not."""

import pytest
import torch

from fusionplan.folding import args_fingerprint
from fusionplan.launch import Repeat, RepeatCache, extent_bytes, needs_int64, specialization
from fusionplan.testing import add_chain

from .util import make_input, plan_for, random_args


class FakeBound:
    def __init__(self) -> None:
        self.launched: list[tuple[int, ...]] = []

    def launch(self, pointers) -> None:
        self.launched.append(tuple(pointers))


@pytest.fixture
def setup():
    x = make_input((2, 8, 5, 6), torch.float32)
    plan = add_chain(plan_for(x), "CBNA", k=8, r=1, s=1)
    args = random_args(plan)
    records = [args.get(op) for op in plan.ops]
    y = torch.empty(plan.output_desc.dims)

    def repeat(prior_given=False, in_place_ok=False, prior_read=False):
        versions = args_fingerprint(records)
        nbytes = extent_bytes(y)
        return Repeat(
            FakeBound(), records, versions, extent_bytes(x), nbytes, prior_given, in_place_ok, prior_read, nbytes
        )

    return x, y, records, repeat


def test_a_matching_call_launches_with_the_new_pointers(setup):
    x, y, records, repeat = setup
    r = repeat()
    x2, y2 = x.clone(), torch.empty_like(y)
    assert r.try_launch(x2, y2, records, None)
    assert r.bound.launched == [(x2.data_ptr(), y2.data_ptr(), y2.data_ptr())]
    r = repeat(prior_given=True)
    assert r.try_launch(x2, y2, records, y2)


def test_changed_records_or_prior_refuse(setup):
    x, y, records, repeat = setup
    r = repeat()
    assert not r.try_launch(x, y, list(records), None)  # an equal list, another object
    assert not r.try_launch(x, y, records, y)  # a prior where the bound call had none
    records[0].weight.mul_(2.0)  # in place: derived data is stale
    assert not r.try_launch(x, y, records, None)
    assert r.bound.launched == []


def test_a_separate_prior_is_read_unless_it_partly_overlaps_the_output(setup):
    x, y, records, repeat = setup
    prior = torch.empty_like(y)
    r = repeat(prior_given=True, prior_read=True)
    assert r.try_launch(x, y, records, prior)
    assert r.bound.launched == [(x.data_ptr(), y.data_ptr(), prior.data_ptr())]
    placeholder = repeat(prior_given=True)  # the kernel was built without reading the prior
    assert placeholder.try_launch(x, y, records, prior)
    assert placeholder.bound.launched == [(x.data_ptr(), y.data_ptr(), y.data_ptr())]
    storage = torch.empty(2 * y.numel())
    out, shifted = storage[: y.numel()].view(y.shape), storage[4 : 4 + y.numel()].view(y.shape)
    assert not r.try_launch(x, out, records, shifted)
    assert r.try_launch(x, out, records, out)  # the output itself: each element read, then written


def test_misaligned_or_overlapping_tensors_refuse(setup):
    x, y, records, repeat = setup
    r = repeat()
    shifted = torch.empty(x.numel() + 1)[1:].view(x.shape)  # 4 bytes into its storage
    assert not r.try_launch(shifted, y, records, None)
    assert not r.try_launch(y, y, records, None)  # output is the input, not allowed here
    assert repeat(in_place_ok=True).try_launch(y, y, records, None)
    storage = torch.empty(2 * y.numel())
    a, b = storage[: y.numel()].view(y.shape), storage[4 : 4 + y.numel()].view(y.shape)  # partly overlapping
    assert not repeat(in_place_ok=True).try_launch(a, b, records, None)
    assert r.bound.launched == []


def test_extents_bound_offsets():
    big = torch.empty_strided((2, 3), (2**31, 1), device="meta", dtype=torch.float16)
    assert extent_bytes(big) == (2**31 + 3) * 2
    assert needs_int64(big)
    small = torch.empty_strided((4, 5), (1, 4), device="meta")
    assert extent_bytes(small) == 20 * 4 and not needs_int64(small)
    assert extent_bytes(torch.empty(0, 3)) == 0


def test_repeat_cache_is_per_records_and_bounded(setup):
    x, y, records, repeat = setup
    cache = RepeatCache(size=2)
    r = repeat()
    cache.put(r)
    assert cache.get(records) is r and cache.get(list(records)) is None
    for _ in range(3):
        other = list(records)
        cache.put(Repeat(FakeBound(), other, (), 0, 0, False))
    assert len(cache._by_records) <= 2


def test_specialization_follows_everything_triton_compiles_for():
    t = torch.empty(64)
    base = specialization([t, 64, 3, 1.5, True, "ieee"])
    assert specialization([torch.empty(64), 64, 3, 2.5, True, "ieee"]) == base  # other data, same kernel
    for changed in (
        [t.half(), 64, 3, 1.5, True, "ieee"],  # element type
        [t[1:], 64, 3, 1.5, True, "ieee"],  # alignment
        [t, 48, 3, 1.5, True, "ieee"],  # 48 % 16 == 0 but 48 != 64: same
        [t, 65, 3, 1.5, True, "ieee"],  # no longer divisible by 16
        [t, 64, 1, 1.5, True, "ieee"],  # equal to 1
        [t, 64, 2**31, 1.5, True, "ieee"],  # 64-bit
        [t, 64, 3, 1.5, False, "ieee"],  # constexpr
        [t, 64, 3, 1.5, True, "tf32"],
    ):
        assert (specialization(changed) == base) == (changed[1] == 48), changed


def test_scratch_allocator_is_set_where_none_is_and_a_users_is_kept():
    import threading

    triton = pytest.importorskip("triton")
    from triton.runtime import _allocation

    from fusionplan.launch import ensure_scratch_allocator

    seen = {}

    def in_a_fresh_thread():  # a new thread starts without an allocator (context variable)
        seen["before"] = _allocation._allocator.get()
        ensure_scratch_allocator()
        seen["after"] = _allocation._allocator.get()

        def mine(size, alignment, stream):
            return torch.empty(size, dtype=torch.int8)

        triton.set_allocator(mine)
        ensure_scratch_allocator()
        seen["kept"] = _allocation._allocator.get() is mine

    t = threading.Thread(target=in_a_fresh_thread)
    t.start()
    t.join()
    assert isinstance(seen["before"], _allocation.NullAllocator)
    assert not isinstance(seen["after"], _allocation.NullAllocator)
    assert seen["kept"]
