"""Launching generated Triton kernels with low host overhead.

Three levels, cheapest last:
- ``Launcher`` goes through Triton's ``fn[grid](...)`` the first time for a specialization key
  (binding, specialization, compilation or cache lookup), then calls the compiled kernel directly.
- ``BoundLaunch`` is one call's compiled kernel, grid and arguments, with the data pointers as
  plain integers; repeating the call only swaps the pointers of the input and output (and, on
  Triton 3.6, calls the kernel's C launcher itself).
- ``Repeat`` holds a ``BoundLaunch`` with what it was bound for (the records, their tensors'
  versions, the tensors' extents), so a solver's ``rerun`` can check in a few comparisons that
  the next call may reuse it; ``launch_fresh`` serves callers that check the rest themselves.

Kernels that build tensor descriptors on the device take their scratch memory from per-stream
buffers of fusionplan's own, whatever allocator Triton has (see ``with_own_scratch``).

Compiled kernels are also found again in a new process without Triton's compile path (whose
first call in a process hashes Triton's own installation, about half a second): after Triton
compiles a kernel, a small record under ``<cache>/launch/`` notes where Triton's cache holds it
and the specialization it was compiled for; a later process with the same launch key loads it
from there directly. Any problem with a record (missing, damaged, Triton's entry gone, another
Triton version) means the normal path: a record can cost a recompilation, never a wrong kernel.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fusionplan.core.caches import LruCache
from fusionplan.core.ops import OpArgs
from fusionplan.core.settings import Settings
from fusionplan.runtime.carveout import fit_shared_carveout
from fusionplan.runtime.codegen import again_after_ast_race, cache_dir, interpreter_active, write_atomic
from fusionplan.runtime.compile_pool import compile_in_worker
from fusionplan.runtime.compile_worker import source_class
from fusionplan.runtime.folding import args_fingerprint
from fusionplan.runtime.launcher_modules import share_launcher_modules
from fusionplan.runtime.tma import DescriptorEncoder, is_host_descriptor, rebased

Tensor = torch.Tensor
log = logging.getLogger("fusionplan")


def current_raw_stream(device: torch.device | None = None) -> int:
    """The current CUDA stream of ``device`` (default the current device), as Triton's launcher
    takes it."""
    index = device.index if device is not None and device.index is not None else None
    get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get_raw is not None:
        return get_raw(torch._C._cuda_getDevice() if index is None else index)
    return torch.cuda.current_stream(index).cuda_stream


_runtime_knobs = None


_SCRATCH: LruCache[tuple, Tensor] = LruCache("launch scratch", 64)
_SPLIT_WORKSPACES: LruCache[tuple, tuple[Tensor, Tensor]] = LruCache("split-reduction workspaces", 64)


def _per_stream(cache: LruCache, key: tuple, make):
    """``make()``'s memory for launches on one stream, kept in ``cache`` under ``key`` (device,
    stream, sizes): launches on a stream run one after another, so one buffer serves them all,
    without an allocation per launch. A launch captured into a CUDA graph gets memory of its own,
    since the graph may be replayed on any stream."""
    if torch.cuda.is_current_stream_capturing():
        return make()
    return cache.get_or_make(key, make)  # one dropped is freed stream-ordered: launches in flight keep it


def _torch_scratch(size: int, alignment: int, stream) -> Tensor:
    """Scratch memory for a launch (the tensor descriptors a kernel builds on the device; each
    launch writes its descriptors before reading them). Per stream: about 4 us less host time per
    launch at batch 1 than an allocation each time."""
    key = (torch.cuda.current_device(), stream, size)
    return _per_stream(_SCRATCH, key, lambda: torch.empty(size, dtype=torch.int8, device="cuda"))


def split_workspace(
    device: torch.device, partials: int, tiles: int, purpose: str = "split reduction"
) -> tuple[Tensor, Tensor]:
    """The fp32 partial sums and int32 arrival counters (zero between launches: the last program
    of a tile resets its counter) of a split reduction, per stream as the scratch above; another
    ``purpose`` (a kernel's other fp32 workspace) gets buffers of its own."""

    def make() -> tuple[Tensor, Tensor]:
        return (
            torch.empty(partials, dtype=torch.float32, device=device),
            torch.zeros(tiles, dtype=torch.int32, device=device),
        )

    if device.type != "cuda":
        return make()
    return _per_stream(_SPLIT_WORKSPACES, (device, current_raw_stream(device), partials, tiles, purpose), make)


_NO_ALLOCATOR_VARIABLE = object()
_allocator_variable = None


def _scratch_allocator_variable():
    """Triton's allocator context variable (None without Triton)."""
    global _allocator_variable
    if _allocator_variable is None:
        try:
            from triton.runtime import _allocation

            _allocator_variable = _allocation._allocator
        except (ImportError, AttributeError):
            _allocator_variable = _NO_ALLOCATOR_VARIABLE
    return None if _allocator_variable is _NO_ALLOCATOR_VARIABLE else _allocator_variable


def with_own_scratch(launch, *args, **kwargs):
    """``launch(*args, **kwargs)`` with fusionplan's per-stream scratch memory as Triton's allocator
    for its duration, whatever allocator is set (none in a new thread, or another library's: torch
    Inductor sets one that allocates on every launch, about 3 us of host time each). The allocator
    set before is set again afterwards, so other kernels keep theirs."""
    variable = _scratch_allocator_variable()
    if variable is None:
        return launch(*args, **kwargs)
    token = variable.set(_torch_scratch)
    try:
        return launch(*args, **kwargs)
    finally:
        variable.reset(token)


def launch_compiled(kernel, grid: tuple[int, int, int], args: Sequence) -> None:
    """Launch a compiled Triton kernel the way Triton's own launch path does, minus its binding."""
    enter, leave = _launch_hooks()
    stream = current_raw_stream()
    metadata = kernel.launch_metadata(grid, stream, *args) if enter is not None else None
    gx, gy, gz = grid
    kernel.run(gx, gy, gz, stream, kernel.function, kernel.packed_metadata, metadata, enter, leave, *args)


def _launch_hooks() -> tuple:
    """Triton's launch enter and exit hooks, None for a hook chain with nothing in it (Triton 3.6
    keeps empty chains: calling them and building the launch metadata they take costs about 3.5 us
    of host time per launch)."""
    global _runtime_knobs
    if _runtime_knobs is None:
        from triton import knobs

        _runtime_knobs = knobs.runtime
    enter, leave = _runtime_knobs.launch_enter_hook, _runtime_knobs.launch_exit_hook
    if enter is not None and not getattr(enter, "calls", True):
        enter = None
    if leave is not None and not getattr(leave, "calls", True):
        leave = None
    if enter is None and leave is not None:  # an exit hook alone still takes the launch metadata
        return _runtime_knobs.launch_enter_hook, leave
    return enter, leave


#: Triton's interpreter patches triton.language while it runs a kernel: one kernel at a time.
_INTERPRETER_LOCK = threading.Lock()
_NO_LOCK = contextlib.nullcontext()
#: Triton's settings that say where its files are, not what it compiles: a record names the
#: kernel in whichever cache is current, so an imported cache (fusionplan-cache import, which puts
#: Triton's cache inside the new directory) keeps its records.
_WHERE_VARIABLES = frozenset({"TRITON_CACHE_DIR", "TRITON_HOME"})
_RECORD_LOCKS: dict[Path, threading.Lock] = {}
_RECORD_LOCKS_LOCK = threading.Lock()


def _compiling(record: Path | None):
    """Held while one specialization (named by its record's path) compiles: plans compiled on
    several threads (fusionplan.compile_all) that need one kernel wait for its first compile and
    load its record, instead of compiling it again."""
    if record is None:
        return _NO_LOCK
    with _RECORD_LOCKS_LOCK:
        return _RECORD_LOCKS.setdefault(record, threading.Lock())


class Launcher:
    """Launches a generated kernel, calling the compiled kernel directly after the first launch.

    Triton's ``fn[grid](...)`` binds every argument, computes its specialization and looks up its
    cache on each call (tens of microseconds for our ~50 arguments). The first launch for a given
    ``key`` goes through it; the compiled kernel it returns is kept, and later launches with the
    same key call it directly. The key is the caller's (launch options) with the arguments'
    ``specialization``. ``direct=False`` (a handle's settings' ``direct_launch``, from
    ``FUSIONPLAN_DIRECT_LAUNCH=0``; None: the environment's) turns this off, and ``BoundLaunch``
    with it.

    ``grid_dependency``: compile the kernel for programmatic dependent launch (Triton's
    ``launch_pdl``), for kernels that wait for the kernel before them on the stream before they
    touch global memory (conv_kernel.GRID_DEPENDENCY): every launch then may begin while that
    kernel ends.

    ``fit_carveout``: each compiled kernel prefers the smallest shared-memory carve-out that holds
    the programs a multiprocessor holds anyway (fit_shared_carveout), leaving the rest of the
    multiprocessor's memory to L1.
    """

    def __init__(
        self, fn, grid_dependency: bool = False, fit_carveout: bool = False, direct: bool | None = None
    ) -> None:
        self.fn = fn  # Triton's JIT function, or a codegen.GeneratedKernel that imports it when compiled
        self.grid_dependency = grid_dependency
        self.fit_carveout = fit_carveout
        self.names = list(getattr(fn, "arg_names", []))
        self.constexprs = constexpr_positions(fn)
        self._compiled: dict[tuple, object] = {}
        self._too_large: dict[tuple, Exception] = {}  # specializations that do not fit the device
        if direct is None:
            direct = Settings.from_environment().direct_launch
        self.direct = not interpreter_active() and direct and bool(self.names)
        if self.direct:  # this process's kernels of one launcher source take one launcher module
            share_launcher_modules()

    def __call__(self, grid: tuple[int, int, int], key: tuple, args: list, num_warps: int, num_stages: int):
        """Launch; returns Triton's compiled kernel (None in the interpreter). A specialization that
        needs more of the device than it has (Triton's OutOfResources: shared memory, registers)
        raises that error, at once on later calls (no new compile)."""
        key = (key, specialization(args, self.constexprs), self.grid_dependency)
        if key in self._too_large:
            raise self._too_large[key]
        kernel = self._compiled.get(key) if self.direct else None
        if kernel is None:
            record = self._record_path(key, num_warps, num_stages) if self.direct else None
            with _compiling(record):
                kernel = self._load_recorded(key, record)
                if kernel is None:
                    return self._compile_and_launch(grid, key, args, num_warps, num_stages, record)
        if _needs_scratch(kernel):
            with_own_scratch(launch_compiled, kernel, grid, args)
        else:
            launch_compiled(kernel, grid, args)
        return kernel

    def _compile_and_launch(self, grid, key: tuple, args: list, num_warps: int, num_stages: int, record):
        if len(args) != len(self.names):
            raise AssertionError(f"kernel takes {len(self.names)} arguments, {len(args)} given")
        kwargs = self._jit_arguments(args, num_warps, num_stages)
        if self.direct:
            compile_in_worker(self.fn, {**kwargs, "grid": grid})
        launch = self.jit[grid]
        try:
            kernel = self._first_launch(launch, kwargs)
        except Exception as exc:
            if is_out_of_resources(exc):
                self._too_large[key] = exc
            raise
        if self.direct and kernel is not None and hasattr(kernel, "run"):
            self._keep(key, kernel, record)
        return kernel

    @staticmethod
    def _first_launch(launch, kwargs: dict):
        """Compile (or, in the interpreter, rewrite) and launch; once more where the compile failed
        on CPython 3.11's AST race with another thread (codegen.again_after_ast_race): it fails
        before the kernel runs, so nothing was written."""
        with _INTERPRETER_LOCK if interpreter_active() else _NO_LOCK:
            return again_after_ast_race(with_own_scratch, launch, **kwargs)

    def compile_ahead(self, grid: tuple[int, int, int], key: tuple, args: list, num_warps: int, num_stages: int):
        """Compile (or load) and initialize without launching, so that the first execute does not
        pay for it. ``args`` may hold stand-in tensors of the right dtypes and alignment."""
        key = (key, specialization(args, self.constexprs), self.grid_dependency)
        if not self.direct or key in self._compiled:
            return None
        record = self._record_path(key, num_warps, num_stages)
        with _compiling(record):
            kernel = self._load_recorded(key, record)
            if kernel is None:
                if not hasattr(self.jit, "warmup"):
                    return None
                kwargs = {**self._jit_arguments(args, num_warps, num_stages), "grid": grid}
                compile_in_worker(self.fn, kwargs)
                kernel = self.jit.warmup(**kwargs)
                if kernel is None or not hasattr(kernel, "run"):
                    return None
                kernel._init_handles()  # loads the binary onto the device now (a record's kernel is loaded)
                self._keep(key, kernel, record)
        return kernel

    @property
    def jit(self):
        """Triton's JIT function of the kernel, imported now where the launcher was given a
        GeneratedKernel."""
        return getattr(self.fn, "jit", self.fn)

    def _jit_arguments(self, args: list, num_warps: int, num_stages: int) -> dict:
        """A launch's arguments by name with its compile options, as Triton's JIT function takes them."""
        return {**dict(zip(self.names, args)), **self.compile_options(num_warps, num_stages)}

    def compile_options(self, num_warps: int, num_stages: int) -> dict:
        """Triton's compile options of a launch (sass.compile_for_hopper compiles with them too)."""
        options = {"num_warps": num_warps, "num_stages": num_stages}
        if self.grid_dependency:
            options["launch_pdl"] = True
        return options

    def _keep(self, key: tuple, kernel, record: Path | None) -> None:
        self._compiled[key] = kernel
        record_kernel(record, kernel)
        self._loaded(kernel)

    def _load_recorded(self, key: tuple, record: Path | None):
        kernel = load_recorded_kernel(record, self.fn) if record is not None else None
        if kernel is not None:
            self._compiled[key] = kernel
            self._loaded(kernel)
        return kernel

    def _loaded(self, kernel) -> None:
        """A kept kernel's attributes on the device, once its binary is loaded (by Triton's first
        launch, a record's load or compile_ahead, each before the kernel is kept)."""
        if self.fit_carveout and getattr(kernel, "function", None):
            fit_shared_carveout(kernel)

    def _record_path(self, key: tuple, num_warps: int, num_stages: int) -> Path | None:
        """The record's file: named by everything that selects the compiled kernel."""
        try:
            import triton

            module = module_of(self.fn)  # named by its source's hash
            env = sorted((k, v) for k, v in os.environ.items() if k.startswith("TRITON_") and k not in _WHERE_VARIABLES)
            device = torch.cuda.get_device_capability()
            ident = repr((module, key, num_warps, num_stages, device, triton.__version__, env))
        except Exception:  # no device, or an unusual key: no record
            return None
        return cache_dir() / "launch" / (hashlib.sha256(ident.encode()).hexdigest()[:32] + ".json")


def module_of(fn) -> str:
    """The name of the module that holds a kernel (a JIT function's, or a GeneratedKernel's)."""
    name = getattr(fn, "module_name", None)
    return name if name is not None else getattr(getattr(fn, "fn", fn), "__module__", "")


def is_out_of_resources(exc: BaseException) -> bool:
    """Whether ``exc`` is Triton's OutOfResources: a compiled kernel needs more shared memory or
    registers than the device has (raised when it is loaded, at its first launch)."""
    return type(exc).__name__ == "OutOfResources" and type(exc).__module__.startswith("triton")


def constexpr_positions(fn) -> frozenset[int]:
    """The positions of a Triton kernel's constexpr parameters (none for a non-Triton callable)."""
    return frozenset(i for i, p in enumerate(getattr(fn, "params", ())) if getattr(p, "is_constexpr", False))


def specialization(args: Sequence, constexprs: frozenset[int] = frozenset()) -> tuple:
    """Everything Triton's compiled kernel depends on in the arguments of a launch: element type and
    16-byte alignment of pointers, width of integers and whether they equal 1 or divide by 16, the
    value of every argument in a ``constexprs`` position (a kernel is compiled for each), a host
    tensor descriptor's element type, rank, block and layout. Equal specializations (and equal
    launch options) mean the same compiled kernel: launch records found on disk are reused by it,
    across plans whose kernels share a source."""
    spec = []
    for i, a in enumerate(args):
        if i in constexprs:
            spec.append(("constexpr", a))
        elif isinstance(a, Tensor):
            spec.append((a.dtype, a.data_ptr() % 16 == 0))
        elif isinstance(a, bool) or a is None or isinstance(a, str):
            spec.append(a)
        elif isinstance(a, int):
            spec.append((-(2**31) <= a < 2**31, a == 1, a % 16 == 0))
        elif is_host_descriptor(a):
            spec.append(descriptor_specialization(a))
        else:
            spec.append(type(a).__name__)
    return tuple(spec)


def descriptor_specialization(desc) -> tuple:
    """What a kernel compiled for a host tensor descriptor depends on: its element type, rank, block
    and shared-memory layout (the block is compiled into the kernel and its tensor-map metadata)."""
    return (
        type(desc).__name__,
        str(desc.base.dtype),
        len(desc.shape),
        tuple(desc.block_shape),
        repr(getattr(desc, "layout", None)),
        getattr(desc, "padding", None),
    )


def record_kernel(path: Path | None, kernel) -> None:
    """Note where Triton's cache holds ``kernel`` and what it was specialized for (best effort)."""
    if path is None:
        return
    try:
        src = kernel.src
        record = {
            "hash": kernel.hash,
            "metadata_file": next(name for name in kernel.metadata_group if name.endswith(".json")),
            "signature": list(src.signature.items()),
            "constants": [[list(k), v] for k, v in src.constants.items()],
            "attrs": [[list(k), v] for k, v in src.attrs.items()],
        }
        text = json.dumps(record)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except Exception as exc:  # a Triton without these attributes, constants JSON cannot hold, a full disk
        log.debug("no launch record for %s: %s", getattr(kernel, "name", "?"), exc)


def load_recorded_kernel(path: Path, fn):
    """The compiled kernel a record points to, loaded from Triton's cache; None when there is no
    usable record (the caller compiles through Triton)."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("launch record %s is unreadable (%s): ignored", path, exc)
        return None
    try:
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.cache import get_cache_manager

        src = source_class(fn)(
            fn,
            dict(record["signature"]),
            {tuple(k): v for k, v in record["constants"]},
            {tuple(k): v for k, v in record["attrs"]},
        )
        group = get_cache_manager(record["hash"]).get_group(record["metadata_file"])
        if not group:
            return None  # Triton's cache was cleared: compile again
        kernel = CompiledKernel(src, group, record["hash"])
        kernel._init_handles()
        return kernel
    except Exception as exc:
        log.warning("launch record %s could not be used (%s): compiling through Triton", path, exc)
        return None


def _needs_scratch(kernel) -> bool:
    """Whether a compiled kernel takes global scratch memory (builds tensor descriptors on the device)."""
    return getattr(getattr(kernel, "metadata", None), "global_scratch_size", 0) > 0


#: Triton versions whose compiled kernels' launcher is called directly by ``BoundLaunch`` (their C
#: launcher's argument order is known: grid, stream, function, cooperative, PDL, global scratch,
#: profile scratch, packed metadata, launch metadata, enter and exit hooks, kernel arguments).
RAW_LAUNCHER_VERSIONS = ("3.6.",)


def raw_launcher(kernel) -> tuple | None:
    """(C launch function, CUfunction, packed metadata, cooperative, PDL, global scratch bytes per
    program and alignment) of a compiled kernel whose launcher ``BoundLaunch`` may call directly,
    else None (another Triton, a profiling scratch, the interpreter)."""
    try:
        import triton

        if not triton.__version__.startswith(RAW_LAUNCHER_VERSIONS):
            return None
        runner = kernel.run
        if type(runner).__name__ != "CudaLauncher" or runner.profile_scratch_size:
            return None
        per_program = runner.global_scratch_size * runner.num_ctas
        return (
            runner.launch,
            kernel.function,
            kernel.packed_metadata,
            runner.launch_cooperative_grid,
            runner.launch_pdl,
            per_program,
            runner.global_scratch_align,
        )
    except Exception:  # an attribute this Triton does not have: its own launch path
        return None


class BoundLaunch:
    """A compiled kernel with one call's grid and arguments bound; ``launch`` repeats the call
    with other data pointers in ``pointer_slots`` (one per pointer: an argument index, or a tuple
    of the indices that take it). Pointers are passed as integers: Triton's launcher takes them as
    they are, where a tensor costs a ``data_ptr()`` call and a driver query. A slot may hold a host
    tensor descriptor of the tensor: each launch passes a copy of it over the new address.

    For the Triton versions in ``RAW_LAUNCHER_VERSIONS``, ``launch`` calls the kernel's C launcher
    itself, with fusionplan's scratch memory (as an address), unless a launch hook is set:
    Triton's Python wrapper around it allocates scratch through whatever allocator is set and costs
    about 2 us of host time per launch. Descriptors go to it encoded by a ``DescriptorEncoder``
    (once per address), where Triton's wrapper would encode each at every launch."""

    __slots__ = (
        "kernel", "grid", "args", "slots", "_keep", "needs_scratch", "raw", "scratch_bytes", "encoder", "_plain",
        "_descriptors",
    )  # fmt: skip

    def __init__(
        self, kernel, grid: tuple[int, int, int], args: Sequence, pointer_slots: Sequence[int | tuple[int, ...]]
    ) -> None:
        self.kernel = kernel
        self.needs_scratch = _needs_scratch(kernel)
        self.grid = grid
        self.args = [a.data_ptr() if isinstance(a, Tensor) else a for a in args]
        # per pointer, its (argument index, whether a descriptor sits there) pairs: decided once here,
        # not at every launch
        self.slots = tuple(
            tuple((i, is_host_descriptor(args[i])) for i in (slot if isinstance(slot, tuple) else (slot,)))
            for slot in pointer_slots
        )
        # the same, flat: (argument index, the pointer's position) of addresses and of descriptors
        self._plain = tuple((i, k) for k, slot in enumerate(self.slots) for i, d in slot if not d)
        self._descriptors = tuple((i, k) for k, slot in enumerate(self.slots) for i, d in slot if d)
        swapped = {i for slot in self.slots for i, _ in slot}
        for slot in self.slots:  # descriptors in the slots: over a bare address until the launch
            for i, descriptor in slot:
                if descriptor:
                    self.args[i] = rebased(args[i], args[i].base.data_ptr())
        # the addresses bound for good stay valid; those in the slots (the call's input, output and
        # prior) are replaced at every launch, so their tensors are not kept alive
        self._keep = [a for i, a in enumerate(args) if isinstance(a, Tensor) and i not in swapped]
        self.raw, self.encoder = self._direct_launch(kernel, args)
        self.scratch_bytes = 0 if self.raw is None else self.raw[5] * grid[0] * grid[1] * grid[2]

    def _direct_launch(self, kernel, args: Sequence) -> tuple[tuple | None, DescriptorEncoder | None]:
        """The C launcher's particulars (raw_launcher) and, for descriptor arguments, their encoder
        (the C launcher takes them encoded); (None, None) where Triton's own path must launch."""
        raw = raw_launcher(kernel)
        descriptors = [i for i, a in enumerate(args) if is_host_descriptor(a)]
        if raw is None or not descriptors:
            return raw, None
        encoder = DescriptorEncoder.of(kernel, descriptors)
        if encoder is None:
            return None, None
        encoder.bind(self.args, self.slots)
        return (encoder.c_launch, *raw[1:]), encoder

    def path(self) -> str:
        """Which launcher ``launch`` calls, in words (for host-time reports)."""
        if self.raw is None:
            return "Triton's launcher"
        return "the C launcher" + ("" if self.encoder is None else ", descriptors encoded once per address")

    def launch(self, pointers: Sequence[int]) -> None:
        if self.raw is not None and _launch_hooks() == (None, None):
            encoder = self.encoder
            self._launch_raw(self._swapped(pointers)[0] if encoder is None else encoder.flat_arguments(pointers))
            return
        args, addresses = self._swapped(pointers)
        for i, address in addresses.items():  # Triton's wrapper encodes descriptors: copies over the address
            args[i] = rebased(args[i], address)
        if self.needs_scratch:
            with_own_scratch(launch_compiled, self.kernel, self.grid, args)
        else:
            launch_compiled(self.kernel, self.grid, args)

    def _swapped(self, pointers: Sequence[int]) -> tuple[list, dict[int, int]]:
        """The bound arguments with this call's pointers in their slots, and the call's address of
        each descriptor in a slot (by argument index; the descriptor itself stays as bound)."""
        args = self.args.copy()
        for i, k in self._plain:
            args[i] = pointers[k]
        return args, {i: pointers[k] for i, k in self._descriptors}

    def _launch_raw(self, args: list) -> None:
        c_launch, function, packed, cooperative, pdl, _, alignment = self.raw
        stream = current_raw_stream()
        scratch = None
        if self.scratch_bytes:
            buffer = _torch_scratch(self.scratch_bytes, alignment, stream)  # alive until the launch is issued
            scratch = buffer.data_ptr()
        gx, gy, gz = self.grid
        c_launch(gx, gy, gz, stream, function, cooperative, pdl, scratch, None, packed, None, None, None, *args)


class BoundLaunches:
    """Launches bound once per caller's key (what the arguments other than the pointers depend on)
    and the pointers' 16-byte alignment: a repeated call swaps its tensors' pointers and one integer
    after them (a tag) instead of binding every argument. At most ``size`` are kept."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._bound: dict[tuple, BoundLaunch] = {}

    def launch(self, launcher: Launcher, grid, key: tuple, tensors: Sequence[Tensor], tag: int, make_args) -> None:
        """Launch with ``tensors`` in the first arguments and ``tag`` right after them."""
        pointers = [t.data_ptr() for t in tensors]
        key = (launcher, key, grid, tuple(ptr % 16 == 0 for ptr in pointers))
        bound = self._bound.get(key)
        if bound is not None:
            bound.launch([*pointers, tag])
            return
        args = make_args()
        kernel = launcher(grid, key[1:], args, num_warps=4, num_stages=1)
        if kernel is not None and hasattr(kernel, "run") and len(self._bound) < self.size:
            self._bound[key] = BoundLaunch(kernel, grid, args, range(len(tensors) + 1))


@dataclass(frozen=True)
class Repeat:
    """A bound launch and the conditions under which a call may reuse it: the same records object
    with unchanged tensors, and input/output/prior tensors (of the signature the caller guarantees)
    that are 16-byte aligned like the bound ones, with the output overlapping neither the input
    (unless ``in_place_ok`` and they are the same) nor a separate prior."""

    bound: BoundLaunch
    records: Sequence[OpArgs]
    versions: tuple
    x_bytes: int
    y_bytes: int
    prior_given: bool
    in_place_ok: bool = False
    prior_read: bool = False  # the prior slot holds the prior (else the output, as a placeholder)
    prior_bytes: int = 0
    stream: int | None = None  # set: the launch holds a workspace of this stream (split_workspace)

    def try_launch(self, x: Tensor, y: Tensor, records: Sequence[OpArgs], prior: Tensor | None) -> bool:
        """Launch on x -> y (reading the prior where one is given) if the conditions hold; False if not."""
        if records is not self.records or (prior is not None) != self.prior_given:
            return False
        pointers = self._aligned_pointers(x, y, prior)
        if pointers is None:
            return False
        xp, yp, pp = pointers
        if xp < yp + self.y_bytes and yp < xp + self.x_bytes and not (self.in_place_ok and xp == yp):
            return False
        if pp != yp and pp < yp + self.y_bytes and yp < pp + self.prior_bytes:
            return False  # a prior partly overlapping the output: elements read after being written
        if args_fingerprint(records) != self.versions:
            return False
        return self._launch_on_stream(xp, yp, pp)

    def launch_fresh(self, x: Tensor, y: Tensor, prior: Tensor | None) -> bool:
        """``try_launch`` for a caller that vouches for the rest: the records' tensors unchanged
        since this repeat was made, y allocated afresh (so overlapping nothing else), and the
        prior given exactly when one was. Checks alignment and the stream; False: nothing run."""
        pointers = self._aligned_pointers(x, y, prior)
        return pointers is not None and self._launch_on_stream(*pointers)

    def _aligned_pointers(self, x: Tensor, y: Tensor, prior: Tensor | None) -> tuple[int, int, int] | None:
        """The addresses for the x, y and prior slots (y's in the prior slot unless the bound call
        read a prior), or None when one is not 16-byte aligned like the bound ones."""
        xp, yp = x.data_ptr(), y.data_ptr()
        pp = prior.data_ptr() if self.prior_read and prior is not None else yp
        return None if (xp | yp | pp) & 15 else (xp, yp, pp)

    def _launch_on_stream(self, xp: int, yp: int, pp: int) -> bool:
        if self.stream is not None and (
            torch.cuda.is_current_stream_capturing() or current_raw_stream() != self.stream
        ):  # another stream, or a graph that may replay anywhere: a workspace of its own
            return False
        self.bound.launch((xp, yp, pp))
        return True


class RepeatCache:
    """Repeats of recent launches, one per records object: a kernel serves every plan of its
    signature (in a network, every layer of one shape), each with its own arguments."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._by_records: dict[int, Repeat] = {}

    def get(self, records: Sequence[OpArgs]) -> Repeat | None:
        return self._by_records.get(id(records))  # try_launch checks identity: ids may be reused

    def put(self, repeat: Repeat | None) -> None:
        if repeat is None:
            return
        if len(self._by_records) >= self.size:
            self._by_records.clear()
        self._by_records[id(repeat.records)] = repeat


class Repeating:
    """For kernels whose ``run`` stores ``Repeat``s in ``self._repeats``: ``rerun`` launches a
    matching one directly and falls back to ``run``."""

    _repeats: RepeatCache

    def rerun(self, x: Tensor, y: Tensor, records: Sequence[OpArgs], prior: Tensor | None) -> None:
        repeat = self._repeats.get(records)
        if repeat is None or not repeat.try_launch(x, y, records, prior):
            with torch.no_grad():
                self.run(x, y, records, prior)  # type: ignore[attr-defined]


def repeat_for(
    launcher: Launcher,
    kernel,
    grid: tuple[int, int, int],
    args: Sequence,
    pointer_slots: tuple[int | tuple[int, ...], ...],
    x: Tensor,
    y: Tensor,
    records: Sequence[OpArgs],
    prior: Tensor | None,
    in_place_ok: bool = False,
    prior_read: bool = False,
    stream_bound: bool = False,
) -> Repeat | None:
    """A ``Repeat`` of a launch that read x and wrote y, with the slots of x, y and the prior in
    ``args`` (the prior slot holding ``prior`` when ``prior_read``, else y); None when the launch
    cannot be repeated directly (interpreter, direct launch off, or a pointer not 16-byte aligned).
    ``stream_bound``: the arguments hold the current stream's workspace, so only launches on that
    stream, outside graph captures, repeat it."""
    if not launcher.direct or kernel is None or not hasattr(kernel, "run"):
        return None
    if any(a.data_ptr() % 16 for a in args if isinstance(a, Tensor)):
        return None  # repeats check for aligned pointers only
    if stream_bound and torch.cuda.is_current_stream_capturing():
        return None  # its workspace belongs to the graph, which may replay on any stream
    return Repeat(
        BoundLaunch(kernel, grid, args, pointer_slots),
        records,
        args_fingerprint(records),
        extent_bytes(x),
        extent_bytes(y),
        prior is not None,
        in_place_ok,
        prior_read,
        extent_bytes(prior) if prior is not None else 0,
        current_raw_stream() if stream_bound else None,
    )


def extent_bytes(t: Tensor) -> int:
    """Bytes from a tensor's first element to one past its last (strides are never negative)."""
    if t.numel() == 0:
        return 0
    return (sum((d - 1) * s for d, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def needs_int64(*tensors: Tensor) -> bool:
    """True when an element offset into one of the tensors may not fit in int32. Kernels index
    from each tensor's first element, so its extent bounds the offsets."""
    return any(offset_needs_int64(extent_bytes(t) // t.element_size() - 1) for t in tensors if t.numel())


def offset_needs_int64(max_offset: int) -> bool:
    """Whether element offsets up to ``max_offset`` (one past it, the end) may not fit in int32."""
    return max_offset >= 2**31 - 2
