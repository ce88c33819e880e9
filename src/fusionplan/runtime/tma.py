"""Host tensor descriptors (TMA): making them for a launch, and encoding them into the launch's
argument block, rebased onto each call's tensors, for the direct launches of launch.BoundLaunch."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence

import torch

Tensor = torch.Tensor


class _Address:
    """A device address where Triton's host tensor descriptor expects its tensor (it reads the
    address and the element type only), so that a bound descriptor keeps no tensor alive."""

    __slots__ = ("address", "dtype")

    def __init__(self, address: int, dtype: torch.dtype) -> None:
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


def host_descriptor(tensor: Tensor, shape: list[int], strides: list[int], block: list[int]):
    """Triton's host tensor descriptor of ``tensor`` seen as ``shape`` with ``strides`` (elements),
    loaded and stored in ``block`` boxes, out-of-bounds elements read as zeros."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(tensor, shape, strides, block)


def is_host_descriptor(arg) -> bool:
    """Whether a kernel argument is a tensor descriptor built on the host (Triton's or Gluon's)."""
    return hasattr(arg, "block_shape") and hasattr(arg, "base") and hasattr(arg, "strides")


def rebased(desc, address: int):
    """A copy of the host tensor descriptor ``desc`` over another address (same shape, strides,
    block and layout); Triton encodes it at the launch."""
    moved = copy.copy(desc)
    moved.base = _Address(address, desc.base.dtype)
    return moved


class DescriptorEncoder:
    """The encoding of a bound launch's host tensor descriptors for Triton 3.6's C launcher, kept
    per address. Triton 3.6 wraps the C launcher of a kernel with descriptor arguments in a Python
    function that, at every launch, encodes each descriptor (``make_tensordesc_arg``: a driver call
    filling a 128-byte tensor map, then its shape and strides) and flattens the arguments around
    it: about 7 us of host time per execute for a kernel with four descriptors. Here each
    descriptor is encoded once per address it is launched over, with Triton's own function (the
    one its wrapper calls, with the metadata its wrapper holds), and the flat arguments go to the C
    launcher directly. A descriptor's shape, strides, block and layout are fixed for a bound
    launch, so the address is the whole key. The flat list is laid out once (``bind``); a launch
    copies it and overwrites the pointer slots' entries (on the 2-core development CPU 1.5 -> 0.7 us
    per launch against rebuilding it from the bound arguments)."""

    __slots__ = ("c_launch", "positions", "metadata", "encode", "cache", "template", "places", "bound")

    #: Encodings kept per bound launch (addresses recur through the caching allocator).
    MAX_ENCODINGS = 64

    def __init__(self, c_launch, positions: tuple[int, ...], metadata: tuple, encode) -> None:
        self.c_launch, self.positions, self.metadata, self.encode = c_launch, positions, metadata, encode
        self.cache: dict[tuple[int, int], list] = {}
        self.template: list = []  # the flat arguments as bound, each descriptor encoded at its bound address
        self.places: tuple = ()  # per pointer slot: (start, stop, descriptor number or -1) per argument it fills
        self.bound: list = []  # the descriptors as bound, by number

    @classmethod
    def of(cls, kernel, descriptor_positions: Sequence[int]) -> DescriptorEncoder | None:
        """The encoder for a compiled kernel whose launcher is Triton 3.6's wrapper around the C
        launcher, with metadata for exactly these descriptor positions; else None (Triton's own
        path)."""
        found = cls._resolve(kernel, descriptor_positions)
        return found if isinstance(found, cls) else None

    @classmethod
    def refusal(cls, kernel, descriptor_positions: Sequence[int]) -> str | None:
        """Why ``of`` gives no encoder for this kernel (None: it gives one)."""
        found = cls._resolve(kernel, descriptor_positions)
        return None if isinstance(found, cls) else found

    @classmethod
    def _resolve(cls, kernel, descriptor_positions: Sequence[int]) -> DescriptorEncoder | str:
        try:
            closure = inspect.getclosurevars(kernel.run.launch)
            c_launch = closure.nonlocals["launcher"]
            indices = closure.nonlocals["tensordesc_indices"]
            metadata = tuple(closure.nonlocals["tensordesc_meta"])
            encode = closure.globals["make_tensordesc_arg"]
        except Exception as e:  # another wrapper (or none): Triton's own launch path
            return f"not Triton 3.6's descriptor wrapper ({type(e).__name__}: {e})"
        positions = tuple(sorted(indices))
        if positions != tuple(descriptor_positions):
            return f"descriptor positions {positions} in the wrapper, {tuple(descriptor_positions)} bound"
        if any(m is None for m in metadata):
            return "no descriptor metadata (the wrapper passes descriptors decomposed)"
        return cls(c_launch, positions, metadata, encode)

    def bind(self, args: Sequence, slots: Sequence[Sequence[tuple[int, bool]]]) -> None:
        """Lay the flat arguments out once: the bound arguments in place and each descriptor
        encoded at its bound address; and where each pointer slot's arguments (BoundLaunch.slots)
        fall in them, so that a launch copies the layout and overwrites only those."""
        number = {i: k for k, i in enumerate(self.positions)}
        self.bound = [args[i] for i in self.positions]
        spans = {}
        for i, arg in enumerate(args):
            start = len(self.template)
            if i in number:
                self.template.extend(self._encoded(number[i], arg, arg.base.data_ptr()))
            else:
                self.template.append(arg)
            spans[i] = (start, len(self.template), number.get(i, -1))
        self.places = tuple(tuple(spans[i] for i, _ in slot) for slot in slots)

    def flat_arguments(self, pointers: Sequence[int]) -> list:
        """The C launcher's arguments for a launch over ``pointers`` (one per pointer slot): each
        descriptor in a slot encoded at its pointer, each plain pointer in place."""
        flat = self.template.copy()
        for places, ptr in zip(self.places, pointers):
            for start, stop, k in places:
                if k < 0:
                    flat[start] = ptr
                else:
                    flat[start:stop] = self._encoded(k, self.bound[k], ptr)
        return flat

    def _encoded(self, k: int, descriptor, address: int) -> list:
        key = (k, address)
        found = self.cache.get(key)
        if found is None:
            if len(self.cache) >= self.MAX_ENCODINGS:
                self.cache.clear()
            found = self.cache[key] = self.encode(rebased(descriptor, address), self.metadata[k])
        return found
