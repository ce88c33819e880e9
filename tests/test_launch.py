"""Launch helpers: when a repeated call may reuse a bound launch, and when it must not."""

from collections import Counter

import pytest
import torch

from fusionplan.runtime.folding import args_fingerprint
from fusionplan.runtime.launch import Launcher, Repeat, RepeatCache, extent_bytes, needs_int64, specialization
from fusionplan.tools.verify import add_chain

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


def test_constexpr_values_and_descriptor_blocks_specialize():
    """A constexpr argument is compiled in: 0 and 32 (both divisible by 16) are different kernels,
    as are descriptors of other blocks or ranks over the same tensor. Launch records on disk are
    found by this key, across plans whose kernels share a source: a kernel compiled for another
    value must never be loaded for this one."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    t = torch.empty(64, 64)
    base = specialization([t, 0, 64], frozenset({1}))
    assert specialization([torch.empty(64, 64), 0, 48], frozenset({1})) == base  # a runtime int: same
    assert specialization([t, 32, 64], frozenset({1})) != base  # constexpr 0 -> 32
    assert specialization([t, 32, 64]) == specialization([t, 0, 64])  # as runtime ints: same

    def desc(shape, strides, block):
        return TensorDescriptor(t, shape, strides, block)

    flat = specialization([desc([64, 64], [64, 1], [16, 64])])
    assert specialization([desc([64, 64], [64, 1], [16, 64])]) == flat
    assert specialization([desc([64, 64], [64, 1], [32, 64])]) != flat  # another block
    assert specialization([desc([8, 8, 64], [512, 64, 1], [2, 8, 64])]) != flat  # another rank


def test_launcher_knows_its_kernels_constexpr_parameters():
    """(Compiled kernels' parameters: the interpreter's functions have none, and launch through Triton.)"""
    pytest.importorskip("triton")
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    def kernel(x_ptr, n, BLOCK: tl.constexpr, FLAG: tl.constexpr):
        pass

    assert Launcher(JITFunction(kernel)).constexprs == frozenset({2, 3})


def test_own_scratch_serves_our_launches_whatever_allocator_is_set_and_restores_it():
    """Our kernels' descriptor scratch comes from fusionplan's per-stream buffers, in a fresh thread
    (no allocator) and under another library's allocator (torch Inductor sets one that allocates on
    every launch); the allocator set before is set again afterwards."""
    import threading

    triton = pytest.importorskip("triton")
    from triton.runtime import _allocation

    from fusionplan.runtime import launch

    seen = {}

    class FakeKernel:  # what launch_compiled calls: records the allocator a launch would use
        function = packed_metadata = None
        metadata = type("Metadata", (), {"global_scratch_size": 128})()

        def launch_metadata(self, *args):
            return None

        def run(self, *args):
            seen.setdefault("during", []).append(_allocation._allocator.get())

    def launches():
        seen["before"] = _allocation._allocator.get()
        launch.with_own_scratch(launch.launch_compiled, FakeKernel(), (1, 1, 1), [])
        seen["after_none"] = _allocation._allocator.get()

        def mine(size, alignment, stream):
            return torch.empty(size, dtype=torch.int8)

        triton.set_allocator(mine)
        launch.with_own_scratch(launch.launch_compiled, FakeKernel(), (1, 1, 1), [])
        seen["after_mine"] = _allocation._allocator.get()

    original_stream = launch.current_raw_stream
    launch.current_raw_stream = lambda device=None: 0  # no CUDA here
    try:
        t = threading.Thread(target=launches)  # a new thread starts without an allocator (context variable)
        t.start()
        t.join()
    finally:
        launch.current_raw_stream = original_stream
    assert isinstance(seen["before"], _allocation.NullAllocator)
    assert seen["during"] == [launch._torch_scratch, launch._torch_scratch]
    assert isinstance(seen["after_none"], _allocation.NullAllocator)
    assert seen["after_mine"].__name__ == "mine"
    assert launch._needs_scratch(FakeKernel()) and not launch._needs_scratch(object())


def test_bound_launch_calls_a_known_tritons_c_launcher_directly_with_own_scratch(monkeypatch):
    """BoundLaunch's direct path passes Triton 3.6's C launcher its arguments in that launcher's
    order: the bound arguments with the new pointers swapped in, and fusionplan's scratch address."""
    triton = pytest.importorskip("triton")
    from fusionplan.runtime import launch

    calls = []

    class CudaLauncher:  # the shape of Triton 3.6's launcher object
        launch_cooperative_grid, launch_pdl = False, True
        global_scratch_size, global_scratch_align, profile_scratch_size, num_ctas = 64, 128, 0, 1

        def launch(self, *args):
            calls.append(args)

    class FakeKernel:
        function, packed_metadata = 1234, (4, 1, 0)
        metadata = type("Metadata", (), {"global_scratch_size": 64})()
        run = CudaLauncher()

    scratch = torch.empty(6 * 64, dtype=torch.int8)
    asked = []
    monkeypatch.setattr(launch, "RAW_LAUNCHER_VERSIONS", (triton.__version__,))
    monkeypatch.setattr(launch, "current_raw_stream", lambda device=None: 77)
    monkeypatch.setattr(launch, "_launch_hooks", lambda: (None, None))  # no hook set
    monkeypatch.setattr(
        launch, "_torch_scratch", lambda size, align, stream: asked.append((size, align, stream)) or scratch
    )
    bound = launch.BoundLaunch(FakeKernel(), (3, 2, 1), [10, 20, 30, 5], (0, 1, 2))
    bound.launch((11, 21, 31))
    assert asked == [(6 * 64, 128, 77)]
    assert calls == [
        (3, 2, 1, 77, 1234, False, True, scratch.data_ptr(), None, (4, 1, 0), None, None, None, 11, 21, 31, 5)
    ]
    monkeypatch.setattr(launch, "RAW_LAUNCHER_VERSIONS", ("0.0.",))
    assert launch.raw_launcher(FakeKernel()) is None  # another Triton: its own launch path


def test_empty_launch_hook_chains_count_as_no_hooks():
    """Triton keeps its launch hooks as chains; an empty chain is no hook (no launch metadata to
    build, nothing to call), a chain with a hook in it is passed on."""
    pytest.importorskip("triton")
    from triton import knobs

    from fusionplan.runtime.launch import _launch_hooks

    enter = knobs.runtime.launch_enter_hook
    if not hasattr(enter, "add"):
        pytest.skip("this Triton keeps its launch hooks as plain values")
    assert not enter.calls and _launch_hooks() == (None, None)

    def hook(metadata):
        pass

    enter.add(hook)
    try:
        assert _launch_hooks()[0] is enter
    finally:
        enter.remove(hook)
    assert _launch_hooks() == (None, None)


def test_bound_launch_keeps_its_bound_tensors_alive_and_not_the_calls_input_and_output():
    """A repeat outlives its first call: holding that call's input and output would keep a whole
    network's activations alive; the tensors bound for good (weights, workspaces) must stay."""
    import weakref

    from fusionplan.runtime.launch import BoundLaunch

    x, y, w = torch.randn(64), torch.randn(64), torch.randn(16)
    refs = [weakref.ref(t) for t in (x, y, w)]
    bound = BoundLaunch(object(), (1, 1, 1), [x, w, y, y, 7], (0, 2, 3))
    del x, y, w
    assert refs[0]() is None and refs[1]() is None  # the call's input and output are gone
    assert refs[2]() is not None and bound.args[1] == refs[2]().data_ptr()  # the weights stay


def test_bound_launch_passes_a_descriptor_slot_over_each_calls_address(monkeypatch):
    """A host tensor descriptor of the input (gluon-window) in a pointer slot: each launch gets a
    copy over the new address (shape, strides, block and layout kept), the bound one keeps neither
    the first call's tensor alive nor changes; such launches go through Triton's own wrapper (it
    encodes descriptors), never the C launcher directly."""
    import weakref

    pytest.importorskip("triton")
    hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from triton.experimental.gluon import language as gl

    from fusionplan.runtime import launch

    launched = []
    monkeypatch.setattr(launch, "launch_compiled", lambda kernel, grid, args: launched.append(args))
    monkeypatch.setattr(launch, "raw_launcher", lambda kernel: ("c launcher",))
    x, w = torch.randn(4, 8, 8, 64), torch.randn(128, 64)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=4)
    x_desc = hopper.TensorDescriptor(x, [4, 8, 8, 64], [4096, 512, 64, 1], [1, 4, 4, 32], layout)
    w_desc = hopper.TensorDescriptor.from_tensor(w, [64, 32], gl.NVMMASharedLayout(128, 32, rank=2))
    ref = weakref.ref(x)
    bound = launch.BoundLaunch(object(), (2, 1, 1), [x_desc, w_desc, 4096, 4096, 3], (0, 2, 3))
    assert bound.raw is None
    del x, x_desc
    assert ref() is None
    bound.launch((1 << 20, 2 << 20, 3 << 20))
    bound.launch((5 << 20, 6 << 20, 7 << 20))
    first, second = launched
    assert first[0].base.data_ptr() == 1 << 20 and second[0].base.data_ptr() == 5 << 20
    assert second[0].shape == [4, 8, 8, 64] and second[0].block_shape == [1, 4, 4, 32]
    assert second[0].base.dtype == torch.float32 and second[0].layout == layout
    assert first[1] is w_desc and first[2:] == [2 << 20, 3 << 20, 3]
    assert bound.args[0].base.data_ptr() != 5 << 20  # the bound descriptor is not moved


def triton36_wrapper(launcher, signature, tensordesc_meta, encode):
    """A launcher wrapper of the shape Triton 3.6 builds around a kernel's C launcher when the
    kernel takes host tensor descriptors (its ``wrap_handle_tensordesc``): the closure holds the C
    launcher, the descriptors' positions and their metadata; its globals the encoding function."""
    namespace = {"make_tensordesc_arg": encode, "BASE": 13}
    exec(
        "def wrap(launcher, tensordesc_indices, tensordesc_meta):\n"
        "    def inner(*args):\n"
        "        final_args = list(args[:BASE])\n"
        "        k = 0\n"
        "        for i, arg in enumerate(args[BASE:]):\n"
        "            if i in tensordesc_indices:\n"
        "                final_args.extend(make_tensordesc_arg(arg, tensordesc_meta[k]))\n"
        "                k += 1\n"
        "            else:\n"
        "                final_args.append(arg)\n"
        "        return launcher(*final_args)\n"
        "    return inner\n",
        namespace,
    )
    indices = {i for i, sig in enumerate(signature) if sig.startswith("tensordesc")}
    return namespace["wrap"](launcher, indices, tensordesc_meta)


def encoded_launches(monkeypatch, wrapper_of, encode, input_pointer=False):
    """A kernel (input descriptor in a slot, weight descriptor bound, two pointers, a scalar; with
    ``input_pointer``, the input's pointer first, in the descriptor's slot) bound and launched over
    three calls' addresses (the first again last), once through BoundLaunch's direct path and once
    through the wrapper as Triton's launch path calls it; the C launcher's argument lists of both."""
    pytest.importorskip("triton")
    hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from triton.experimental.gluon import language as gl

    from fusionplan.runtime import launch

    direct, through_wrapper = [], []
    signature = ["tensordesc<fp32[1, 4, 4, 32]>", "tensordesc<fp32[64, 32]>", "*fp32", "*fp32", "i32"]
    metadata = [{"swizzle": 3, "block_size": [1, 4, 4, 32]}, {"swizzle": 3, "block_size": [64, 32]}]

    class CudaLauncher:  # the shape of Triton 3.6's launcher object
        launch_cooperative_grid, launch_pdl = False, False
        global_scratch_size, global_scratch_align, profile_scratch_size, num_ctas = 0, 1, 0, 1

        def __init__(self, sink):
            self.launch = wrapper_of(lambda *args: sink.append(args), signature, metadata, encode)

        def __call__(self, gx, gy, gz, stream, function, *args):  # no scratch to allocate
            self.launch(gx, gy, gz, stream, function, False, False, None, None, *args)

    class FakeKernel:
        function, packed_metadata = 1234, (4, 1, 0)
        metadata = type("Metadata", (), {"global_scratch_size": 0})()

        def __init__(self, sink):
            self.run = CudaLauncher(sink)

    monkeypatch.setattr(launch, "RAW_LAUNCHER_VERSIONS", (__import__("triton").__version__,))
    monkeypatch.setattr(launch, "current_raw_stream", lambda device=None: 77)
    monkeypatch.setattr(launch, "_launch_hooks", lambda: (None, None))
    x, w = torch.randn(4, 8, 8, 64), torch.randn(128, 64)
    x_desc = hopper.TensorDescriptor(
        x, [4, 8, 8, 64], [4096, 512, 64, 1], [1, 4, 4, 32], gl.NVMMASharedLayout(128, 32, rank=4)
    )
    w_desc = hopper.TensorDescriptor.from_tensor(w, [64, 32], gl.NVMMASharedLayout(128, 32, rank=2))
    args = [x_desc, w_desc, 4096, 4096, 3]
    slots = (0, 2, 3)
    if input_pointer:
        signature.insert(0, "*fp32")
        args, slots = [x.data_ptr(), *args], ((0, 1), 3, 4)
    bound = launch.BoundLaunch(FakeKernel(direct), (2, 1, 1), args, slots)
    assert bound.encoder is not None and "encoded once" in bound.path()
    first = 1 if input_pointer else 0  # the input descriptor's position
    assert launch.DescriptorEncoder.refusal(bound.kernel, [first, first + 1]) is None
    wrong = launch.DescriptorEncoder.refusal(bound.kernel, [first])
    assert f"positions ({first}, {first + 1}) in the wrapper, ({first},) bound" in wrong
    reference = FakeKernel(through_wrapper)
    calls = [(1 << 20, 2 << 20, 3 << 20), (5 << 20, 6 << 20, 7 << 20), (1 << 20, 2 << 20, 3 << 20)]
    for x_at, y_at, p_at in calls:
        bound.launch((x_at, y_at, p_at))
        called = [launch.rebased(x_desc, x_at), w_desc, y_at, p_at, 3]
        launch.launch_compiled(reference, (2, 1, 1), [x_at, *called] if input_pointer else called)
    return direct, through_wrapper, w.data_ptr()


def test_bound_launch_encodes_descriptors_once_per_address_for_the_c_launcher(monkeypatch):
    """Descriptor kernels on Triton 3.6: BoundLaunch passes the C launcher the arguments Triton's
    wrapper would (each descriptor replaced by its encoding, the rest in place), encoding each
    descriptor once per address: the bound weights once, the input once per call's address."""
    encodings = []

    def encode(desc, meta):  # Triton's make_tensordesc_arg: a tensor map, then shape and strides
        encodings.append((desc.base.data_ptr(), tuple(meta["block_size"])))
        return [("map", desc.base.data_ptr(), tuple(desc.block_shape)), *desc.shape, *desc.strides]

    direct, through_wrapper, w_at = encoded_launches(monkeypatch, triton36_wrapper, encode)
    assert direct == through_wrapper and len(direct) == 3
    first = direct[0][13:]
    assert first[0] == ("map", 1 << 20, (1, 4, 4, 32)) and first[1:9] == (4, 8, 8, 64, 4096, 512, 64, 1)
    assert first[9] == ("map", w_at, (64, 32)) and first[-3:] == (2 << 20, 3 << 20, 3)
    # the wrapper encodes both descriptors at each of its 3 launches; the direct path each (descriptor,
    # address) once: the weights once, the input at 1 << 20 once although launched there twice
    counts = Counter(encodings)
    assert counts[(w_at, (64, 32))] == 3 + 1
    assert counts[(1 << 20, (1, 4, 4, 32))] == 2 + 1 and counts[(5 << 20, (1, 4, 4, 32))] == 1 + 1


def test_bound_launch_encodes_a_descriptor_sharing_its_pointers_slot(monkeypatch):
    """A slot holding both the input's pointer and its descriptor (triton-gemm-nchw's): the pointer
    in place and the descriptor encoded at it, as Triton's wrapper passes them."""

    def encode(desc, meta):
        return [("map", desc.base.data_ptr(), tuple(desc.block_shape)), *desc.shape, *desc.strides]

    direct, through_wrapper, _ = encoded_launches(monkeypatch, triton36_wrapper, encode, input_pointer=True)
    assert direct == through_wrapper and len(direct) == 3
    assert direct[1][13] == 5 << 20 and direct[1][14] == ("map", 5 << 20, (1, 4, 4, 32))


def test_bound_launch_leaves_other_descriptor_wrappers_to_triton(monkeypatch):
    """A wrapper without the metadata of every descriptor (device-side descriptors) or of another
    shape: Triton's own launch path."""
    from fusionplan.runtime import launch

    def inner(*args):
        return args

    kernel = type("K", (), {"run": type("R", (), {"launch": staticmethod(inner)})()})()
    assert launch.DescriptorEncoder.of(kernel, [0]) is None
    assert "not Triton 3.6's descriptor wrapper" in launch.DescriptorEncoder.refusal(kernel, [0])


def test_bound_launch_encodes_like_triton_36(monkeypatch):
    """With Triton 3.6 installed: its own wrapper and encoding function (the driver's tensor-map
    fill replaced by a recorder, there being no GPU) against BoundLaunch's direct path."""
    triton = pytest.importorskip("triton")
    if not triton.__version__.startswith("3.6."):
        pytest.skip("Triton 3.6's launcher wrapper")
    from triton.backends.nvidia import driver as nvidia

    fills = []

    class Utils:
        @staticmethod
        def fill_tma_descriptor(address, swizzle, elem_size, elem_type, block, shape, strides, padding):
            fills.append(address)
            return ("map", address, tuple(block), tuple(shape), tuple(strides), padding)

    monkeypatch.setattr(triton.runtime.driver, "_active", type("Driver", (), {"utils": Utils})(), raising=False)
    monkeypatch.setattr(type(triton.runtime.driver), "active", property(lambda self: self._active), raising=False)

    def wrapper_of(launcher, signature, metadata, encode):
        meta = [dict(m, elem_size=4, elem_type=7, fp4_padded=False) for m in metadata]
        return nvidia.wrap_handle_tensordesc(launcher, dict(enumerate(signature)), meta)

    direct, through_wrapper, _ = encoded_launches(monkeypatch, wrapper_of, None)
    # the weights, both calls' inputs, and the input's bound address (its layout, once, when bound)
    assert direct == through_wrapper and len(set(fills)) == 4


def test_a_kept_kernel_prefers_the_smallest_carveout_it_fits(monkeypatch):
    """fit_carveout: once a kernel is kept and loaded, its preferred shared-memory carve-out is set
    to the smallest percentage of the multiprocessor's shared memory that holds one program and
    the driver's reservation (through the driver's cuFuncSetAttribute); launchers without it, and
    kernels not loaded yet, are left alone; without a driver library nothing is called."""
    from fusionplan.runtime import carveout

    calls = []

    class FakeDriver:
        def cuFuncSetAttribute(self, function, attribute, value):
            calls.append((function.value, attribute, value))
            return 0

    class Props:
        shared_memory_per_multiprocessor = 233472
        regs_per_multiprocessor = 65536
        max_threads_per_multi_processor = 2048

    class Kernel:  # r50_15's: 12 warps of 168 registers, one program a multiprocessor
        function = 1234
        n_regs = 168
        metadata = type("Metadata", (), {"shared": 143644, "num_warps": 12})()

    monkeypatch.setattr(carveout, "_cuda_driver", lambda: FakeDriver())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    fitting = Launcher(lambda: None, fit_carveout=True)
    fitting._loaded(Kernel())
    assert calls == [(1234, 9, 62)]  # 144,668 of 233,472 bytes
    Launcher(lambda: None)._loaded(Kernel())
    unloaded = Kernel()
    unloaded.function = None  # a kernel whose binary is not on the device yet
    fitting._loaded(unloaded)
    assert len(calls) == 1
    monkeypatch.setattr(carveout, "_cuda_driver", lambda: None)
    fitting._loaded(Kernel())
    assert len(calls) == 1


def test_carveout_percent_holds_the_program_and_the_drivers_reservation():
    from fusionplan.runtime.carveout import carveout_percent

    assert carveout_percent(143644, 233472) == 62  # r50_15: 144,668 of 233,472 bytes
    assert carveout_percent(232448, 233472) == 100
    assert carveout_percent(0, 233472) == 1
    assert carveout_percent(240000, 233472) == 100  # never past the whole
    assert carveout_percent(50 * 1024, 233472, programs=2) == 45  # two programs' 102 KB


def test_programs_per_multiprocessor_takes_the_tightest_limit():
    from fusionplan.runtime.carveout import programs_per_multiprocessor

    class H100:
        shared_memory_per_multiprocessor = 233472
        regs_per_multiprocessor = 65536
        max_threads_per_multi_processor = 2048

    assert programs_per_multiprocessor(384, 168, 143644, H100) == 1  # registers: 64,512 of 65,536
    assert programs_per_multiprocessor(128, 96, 50 * 1024, H100) == 4  # shared memory: 4 x 52 KB
    assert programs_per_multiprocessor(128, 32, 8 * 1024, H100) == 16  # threads: 16 x 128
    assert programs_per_multiprocessor(128, 255, 0, H100) == 2  # 256 registers a thread: 32 K a program
    assert programs_per_multiprocessor(32, 16, 0, H100) == 32  # at most 32 programs


def test_one_lock_per_specialization_record(tmp_path):
    """Threads compiling one specialization (one record path) share a lock; no record, no lock."""
    from fusionplan.runtime.launch import _compiling

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert _compiling(a) is _compiling(tmp_path / "a.json")
    assert _compiling(a) is not _compiling(b)
    with _compiling(None):
        with _compiling(None):  # a null context: nesting does not wait
            pass


def test_records_are_named_by_what_compiles_not_by_where_the_caches_are(monkeypatch, tmp_path):
    """An imported cache lies in another directory (Triton's cache inside it): its records must
    keep their names there, while a setting that changes the code names another record."""
    pytest.importorskip("triton")
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    def kernel(x_ptr, n, BLOCK: tl.constexpr):
        pass

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "a" / "triton"))
    launcher = Launcher(JITFunction(kernel))
    first = launcher._record_path(("key",), 4, 2)
    monkeypatch.setenv("FUSIONPLAN_CACHE_DIR", str(tmp_path / "b"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "b" / "triton"))
    moved = launcher._record_path(("key",), 4, 2)
    assert first is not None and first.name == moved.name and moved.parent == tmp_path / "b" / "launch"
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    assert launcher._record_path(("key",), 4, 2).name != first.name


def test_a_first_launch_failed_by_cpythons_ast_race_is_tried_again(monkeypatch):
    """A kernel compiled (in the interpreter, rewritten) at its first launch can meet CPython 3.11's
    AST race with another thread: a SystemError raised before the kernel runs. The launch is tried
    once more and the plan's result is right; any other SystemError is the plan's InternalError."""
    import fusionplan as fp
    from fusionplan.oracle.reference import run_reference
    from fusionplan.runtime import launch as launch_module

    monkeypatch.setenv("FUSIONPLAN_BACKEND", "triton")
    real, calls = launch_module.with_own_scratch, []

    def raced_once(fn, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=51, after=44)")
        return real(fn, *args, **kwargs)

    x = make_input((2, 5, 4, 3), torch.float32)
    plan = add_chain(plan_for(x), "NA")
    handle = fp.Handle("cpu")
    assert plan.compile(handle) == "triton-pointwise"
    args = random_args(plan)
    monkeypatch.setattr(launch_module, "with_own_scratch", raced_once)
    y = torch.full(plan.output_desc.dims, float("nan"))
    plan.execute(handle, x, y, args)
    assert len(calls) == 2
    expected = run_reference(plan.ops, x, [args.get(op) for op in plan.ops], None, torch.float64).output
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-6)

    def other_error(fn, *args, **kwargs):
        raise SystemError("error return without exception set")

    monkeypatch.setattr(launch_module, "with_own_scratch", other_error)
    other = add_chain(plan_for(make_input((2, 6, 4, 3), torch.float32)), "NA")
    other.compile(handle)
    with pytest.raises(fp.InternalError, match="SystemError: error return"):
        other.execute(handle, make_input((2, 6, 4, 3), torch.float32), torch.empty(2, 6, 4, 3), random_args(other))
