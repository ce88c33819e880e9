"""Compile a built kernel for sm_90 WITHOUT a GPU and summarize its SASS.

Triton ships ptxas and nvdisasm, so the kernel the H100 would run can be built and read on any
machine (scripts/inspect_sass.py; the CPU tests of Gluon kernels, which have no interpreter).
The summary answers the questions that decide a Hopper kernel's speed before timing it: are the
products tensor-core wgmma (HGMMA), do they overlap (a wait for zero outstanding wgmma groups
after each one means they run one at a time), is an operand staged through registers (LDSM
before HGMMA), is the kernel warp-specialized (SETMAXREG), and the registers, spills and shared
memory per program.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile

import torch

from fusionplan.runtime.launch import source_class
from fusionplan.runtime.tma import is_host_descriptor

TRITON_TYPES = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32"}


def captured_launch(kernel, with_prior: bool = False) -> tuple:
    """The (grid, key, args, num_warps, num_stages) that compiling ahead would hand the launcher
    (``with_prior``: for calls that read a prior output)."""
    seen: list[tuple] = []
    kernel.launcher.compile_ahead = lambda *a: seen.append(a)
    kernel.compile_ahead(torch.device("cpu"), with_prior)
    return seen[0]


def ast_source(fn, args: list):
    """Triton's ASTSource (GluonASTSource for a Gluon kernel) for ``fn`` specialized as a launch
    with ``args`` would be."""
    signature, constexprs, attrs = {}, {}, {}
    for i, (param, a) in enumerate(zip(fn.params, args)):
        name = param.name
        if param.is_constexpr or isinstance(a, (bool, str)) or a is None or (isinstance(a, int) and a == 1):
            signature[name] = "constexpr"
            constexprs[(i,)] = a
        elif is_host_descriptor(a):
            block = ",".join(str(b) for b in a.block_shape)
            layout = f",{a.layout!r}" if hasattr(a, "layout") else ""
            signature[name] = f"tensordesc<{TRITON_TYPES[a.base.dtype][1:]}[{block}]{layout}>"
        elif isinstance(a, torch.Tensor):
            signature[name] = TRITON_TYPES[a.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, int):
            signature[name] = "i32" if -(2**31) <= a < 2**31 else "i64"
            if a % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    return source_class(fn)(fn, signature, constexprs, attrs)


#: Bytes per thread of a memory instruction, by its width suffix (none: 4 bytes).
_WIDTH_SUFFIXES = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}


def access_bytes(suffixes: str) -> int:
    """Bytes a thread moves with an access whose opcode carries ``suffixes`` (".E.128": 16; no width
    suffix: 4)."""
    return next((_WIDTH_SUFFIXES[x] for x in suffixes.split(".") if x in _WIDTH_SUFFIXES), 4)


def access_widths(sass: str, opcode: str) -> dict[int, int]:
    """How many ``opcode`` instructions (LDGSTS, STG, ...) move 16, 8, 4, 2 or 1 bytes per thread
    (the opcode whole: LDGSTSBAR, the copies' barrier arrival, is not an LDGSTS)."""
    widths: dict[int, int] = {}
    for suffixes in re.findall(rf"\b{opcode}((?:\.[A-Z0-9]+)*)(?![A-Z0-9])", sass):
        size = access_bytes(suffixes)
        widths[size] = widths.get(size, 0) + 1
    return widths


def longest_loop(sass: str) -> int:
    """Instructions between a label and the furthest branch back to it, 0 without a loop: in a
    kernel whose only loop is its reduction (triton-conv), what each step issues; in persistent
    kernels, the loop over tiles with everything nested in it."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*(\.L_x_\d+):", line))}
    longest = 0
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)] : i + 1]
            longest = max(longest, sum(1 for x in body if re.search(r"/\*[0-9a-f]{4,}\*/\s+\S", x)))
    return longest


def loads_and_fences(sass: str) -> str:
    """The kernel's tensor loads (T: UTMALDG) and unpredicated CTA memory barriers (F: MEMBAR.ALL.CTA,
    the first half of a proxy fence) in the order of the code: whether a load is issued before or
    after a fence. The fence that follows the barriers' initialization (SYNCS.EXCH) is left out:
    Triton versions place the default partition's code before or after the workers'."""
    found = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(@\S+\s+)?(UTMALDG|MEMBAR\.ALL\.CTA|SYNCS\.EXCH)", sass, re.MULTILINE)
    letters, after_init = [], False
    for pred, op in found:
        if op.startswith("SYNCS"):
            after_init = True
        elif op == "UTMALDG":
            letters.append("T")
        elif not pred:
            letters.append("" if after_init else "F")
            after_init = False
    return "".join(letters)


def invalidations_and_stores(ptx: str) -> str:
    """The kernel's barrier invalidations (I: mbarrier.inval) and global stores (S: st.global and
    tensor stores) in the PTX's order (the program's, before ptxas schedules them), runs of one
    kind as one letter: whether the barriers are invalidated before the epilogue's stores or after."""
    found = re.findall(r"\b(mbarrier\.inval|st\.global|cp\.async\.bulk\.tensor\.\w+\.global\.shared)", ptx)
    letters = ["I" if op.startswith("mbarrier") else "S" for op in found]
    return "".join(x for i, x in enumerate(letters) if i == 0 or x != letters[i - 1])


def grid_dependency_order(sass: str) -> str:
    """The order in the SASS text of the first griddepcontrol wait (W, ACQBULK), trigger (P, PREEXIT)
    and global memory access (G: loads, stores, asynchronous and tensor copies, atomics). In a
    kernel without warp specialization the text's order is the order they run in."""
    firsts = {}
    for line in sass.splitlines():
        found = re.search(r"\b(ACQBULK|PREEXIT|LDGSTS|LDG|STG|UTMALDG|UTMASTG|UBLKCP|RED|ATOMG)\b", line)
        if found:
            letter = {"ACQBULK": "W", "PREEXIT": "P"}.get(found.group(1), "G")
            firsts.setdefault(letter, len(firsts))
    return "".join(sorted(firsts, key=firsts.get))


#: Bytes of an element of a TTGIR tensor type, by its name.
_TTGIR_ELEMENT_BYTES = {
    "f64": 8,
    "f32": 4,
    "i32": 4,
    "f16": 2,
    "bf16": 2,
    "i16": 2,
    "i8": 1,
    "f8E4M3FN": 1,
    "f8E5M2": 1,
}


def expected_bytes(ttgir: str) -> list[int]:
    """The transaction bytes of each barrier expect in the TTGIR text, in the order of the code."""
    return [int(b) for b in re.findall(r"ttng\.barrier_expect %\S+, (\d+)", ttgir)]


def tensor_load_boxes(ttgir: str) -> list[int]:
    """The bytes of each tensor load's box (async_tma_copy_global_to_local) in the TTGIR text, in
    the order of the code: what each adds to its barrier's transactions (the descriptor's type
    written ``tensordesc<64x128xf16, ...>`` by the newest Triton, ``tensordesc<tensor<...>>`` by 3.6)."""
    boxes = []
    copies = r"async_tma_copy_global_to_local[^\n]*?: !tt\.tensordesc<(?:tensor<)?([0-9x]+)x(\w+)[,>]"
    for dims, element in re.findall(copies, ttgir):
        boxes.append(math.prod(int(d) for d in dims.split("x")) * _TTGIR_ELEMENT_BYTES[element])
    return boxes


#: An instruction line of ``nvdisasm -hex``: its address, text and first 64-bit word; the next line
#: holds the second word, whose bits 41 and up are the scheduling controls.
_HEX_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);\s*/\* 0x[0-9a-f]{16} \*/\s*\n\s*/\* (0x[0-9a-f]{16}) \*/")


def without_encodings(hex_sass: str) -> str:
    """``nvdisasm -hex`` output as plain ``nvdisasm`` prints it: each instruction's two encoding
    words (a comment after it and a line of its own) dropped."""
    hex_sass = re.sub(r"\n[ \t]*/\* 0x[0-9a-f]{16} \*/[ \t]*(?=\n)", "", hex_sass)
    return re.sub(r"[ \t]*/\* 0x[0-9a-f]{16} \*/", "", hex_sass)


def with_control_bits(hex_sass: str) -> list[tuple[str, int | None, int | None, tuple[int, ...], str]]:
    """Each instruction of ``nvdisasm -hex`` output with its scheduling controls (Volta and later):
    (address, the scoreboard its result sets or None, the one its operands' reads release or None,
    the scoreboards it waits for, text). A variable-latency instruction (a global load) sets a
    scoreboard; an instruction that reads its result waits for that scoreboard, which counts every
    instruction that set it: loads that share one are waited for together."""
    found = []
    for address, text, word in _HEX_LINE.findall(hex_sass):
        controls = int(word, 16) >> 41
        write, read, wait = (controls >> 5) & 7, (controls >> 8) & 7, (controls >> 11) & 0x3F
        waits = tuple(b for b in range(6) if wait >> b & 1)
        found.append((address, None if write == 7 else write, None if read == 7 else read, waits, text.strip()))
    return found


def load_scoreboards(hex_sass: str) -> dict[int, list[int]]:
    """The scoreboards global loads (LDG) set, by the bytes a load moves per thread: each board once."""
    boards: dict[int, set[int]] = {}
    for _, write, _, _, text in with_control_bits(hex_sass):
        m = re.match(r"(?:@!?U?P\w+\s+)?LDG((?:\.[A-Z0-9]+)*)\s", text)
        if m and write is not None:
            boards.setdefault(access_bytes(m.group(1)), set()).add(write)
    return {size: sorted(b) for size, b in sorted(boards.items())}


def summarize(compiled) -> dict:
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        # one disassembly with the encodings (their scheduling controls), the plain text derived
        hex_sass = subprocess.run([f"{tools}/nvdisasm", "-c", "-hex", f.name], capture_output=True, text=True).stdout
        usage = subprocess.run([f"{tools}/cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    sass = without_encodings(hex_sass)
    waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", sass)
    copies = access_widths(sass, "LDGSTS")
    ttgir = compiled.asm["ttgir"]
    return {
        "HGMMA": sass.count("HGMMA"),
        "HGMMA shapes": sorted(set(re.findall(r"HGMMA\.(\d+x\d+x\d+)", sass))),
        "wgmma waits (outstanding groups allowed)": waits,
        "LDSM (operand through registers)": sass.count("LDSM"),
        "tensor loads (UTMALDG)": sass.count("UTMALDG"),
        "tensor stores (UTMASTG)": sass.count("UTMASTG"),
        "async copies (LDGSTS)": sum(copies.values()),
        "async copies by bytes": copies,
        "global loads by bytes": access_widths(sass, "LDG"),
        "scoreboards of global loads by bytes": load_scoreboards(hex_sass),
        "global stores by bytes": access_widths(sass, "STG"),
        "shared loads by bytes (LDS, not matrix loads)": access_widths(sass, "LDS"),
        "register reallocations (SETMAXREG, warp specialization)": sass.count("SETMAXREG"),
        "instructions of the longest loop": longest_loop(sass),
        "tensor loads (T) and fences (F) in order": loads_and_fences(sass),
        "resources": " ".join(re.findall(r"(REG:\d+|STACK:\d+|SHARED:\d+|LOCAL:\d+)", usage)),
        "shared bytes (dynamic)": compiled.metadata.shared,
        "bytes barriers expect (TTGIR)": expected_bytes(ttgir),
        "tensor loads' box bytes (TTGIR)": tensor_load_boxes(ttgir),
        "programmatic dependent launch": bool(getattr(compiled.metadata, "launch_pdl", False)),
        "barriers initialized (PTX mbarrier.init)": len(re.findall(r"\bmbarrier\.init\.", compiled.asm["ptx"])),
        "barriers invalidated (PTX mbarrier.inval)": len(re.findall(r"\bmbarrier\.inval\.", compiled.asm["ptx"])),
        "grid dependency (W wait, P trigger, G global access) in order": grid_dependency_order(sass),
        "barrier invalidations (I) and global stores (S) in order (PTX)": invalidations_and_stores(compiled.asm["ptx"]),
        "sass": sass,
        "hex_sass": hex_sass,
    }


def compile_for_hopper(kernel, with_prior: bool = False) -> tuple[tuple[int, int, int], object]:
    """The grid and Triton's compiled sm_90 kernel of a built Triton or Gluon kernel (its launch
    as compiling ahead would make it, on stand-in tensors; ``with_prior``: reading a prior output)."""
    import triton
    from triton.backends.compiler import GPUTarget

    grid, _, args, num_warps, num_stages = captured_launch(kernel, with_prior)
    compiled = triton.compile(
        ast_source(kernel.launcher.jit, args),
        target=GPUTarget("cuda", 90, 32),
        options=kernel.launcher.compile_options(num_warps, num_stages),
    )
    return grid, compiled
