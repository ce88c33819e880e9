"""Triton batch-norm training solver: [BatchNormForward (+ ActivationForward)] and its backward
[BatchNormBackward (+ ActivationBackward)], each with the least memory traffic, in three launches
or (small tensors with many features, tuning.batchnorm_one_launch) one.

Both plans are a reduction over the rows of a [rows, features] view of the tensor (features: the
channels in spatial mode, with rows the N*H*W pixels; the C*H*W elements of an image in
per-activation mode, with rows the N images), then one elementwise pass:

- partial: the rows are split into chunks and the features into blocks, so that every
  multiprocessor has programs for every shape; each program writes its chunk's statistics of its
  features to a workspace (forward: mean and sum of squared deviations, Welford's per element
  slot of the tile, the slots merged by Chan's formula at the end; backward: sum(dy') and
  sum(dy' * xhat), dy' the gradient behind the activation, its input recomputed from x and the
  saved statistics);
- finalize: per feature block, the chunks' partials merged in chunk order (the same bits run
  after run: no atomics), the side outputs written (saved mean and inverse deviation, running
  statistics; the parameter gradients), and per feature the coefficients of the elementwise pass;
- apply: y = act((x - mean) * scale' + shift') (forward), dx = A * dy' + B * xhat + C (backward), with the
  operators' alpha and beta, each tensor read and written in its own strides.

The one-launch engine runs the three passes in turn in a program per feature block, over every
row (the *_whole kernels, made of the same functions). The forward reads x twice and writes y;
the backward reads dy and x twice and writes dx.

A call whose geometry (the tensors' layouts, the records' scalars) was seen before runs that
geometry's launch template: the C launches with this call's addresses in their slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from fusionplan.core.enums import BatchNormMode, DataType
from fusionplan.core.ops import (
    ActivationArgs,
    ActivationBackwardArgs,
    BatchNormBackwardArgs,
    BatchNormBackwardOp,
    BatchNormForwardArgs,
    BatchNormForwardOp,
    OpArgs,
    Phase,
)
from fusionplan.runtime import tuning
from fusionplan.runtime.codegen import generated_kernel, interpreter_active, write_source
from fusionplan.runtime.launch import (
    BoundLaunch,
    Launcher,
    _needs_scratch,
    current_raw_stream,
    extent_bytes,
    launch_compiled,
    needs_int64,
)
from fusionplan.solvers.base import Kernel, PlanSpec, Solver
from fusionplan.solvers.conv_toolkit import (
    TRITON_DTYPES,
    device_why_not,
    persistent_programs,
    shares_memory,
    triton_cdiv,
)
from fusionplan.solvers.templates.triton_batchnorm import render_source

Tensor = torch.Tensor


# ---- the [rows, features] view and its tiles ------------------------------------------------------
@dataclass(frozen=True)
class TileConfig:
    """Tiles of the [rows, features] passes (looped over a chunk of rows by the partials, one per
    program in the elementwise pass), and the finalize's tile of chunks; ``one_launch``: one program
    per feature block takes every row (the partial, finalize and elementwise passes in turn)."""

    block_r: int
    block_f: int
    num_warps: int
    finalize_k: int
    finalize_f: int
    one_launch: bool = False


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


#: Elements of one tile: 16 per thread of 8 warps on a GPU (registers, not spilling, for the
#: backward's three tensors), small in the interpreter so that tests cross tiles, chunks and blocks.
GPU_TILE = 4096
INTERPRETER_TILE = 32


def tile_config(features_contiguous: bool, features: int, rows: int) -> TileConfig:
    """Tiles long along the tensor's contiguous axis: the features (NHWC spatial, per-activation
    over NCHW) or the rows (NCHW spatial)."""
    tile = INTERPRETER_TILE if interpreter_active() else GPU_TILE
    warps = 1 if interpreter_active() else 8
    if features_contiguous:
        block_f = min(_pow2(features), max(8, tile // 64) if interpreter_active() else 64)
    else:
        block_f = min(_pow2(features), 2 if interpreter_active() else 4)
    block_r = max(1, min(_pow2(rows), tile // block_f))
    block_f = min(_pow2(features), tile // block_r)
    # the finalize reads [chunks, features]: long along the chunks, so that a few features with many
    # chunks (64 channels of 112x112) are a few loads of each program, not a long serial loop
    fin_k = 4 if interpreter_active() else 256
    fin_f = 8 if interpreter_active() else 16
    return TileConfig(block_r, block_f, warps, fin_k, fin_f)


def whole_config(features_contiguous: bool, features: int, rows: int) -> TileConfig:
    """The one-launch engine's tile: few features per program (so that every feature block is a
    program of its own), as many rows as make the tile."""
    if interpreter_active():
        return replace(tile_config(features_contiguous, features, rows), one_launch=True)
    block_f = min(_pow2(features), tuning.BATCHNORM_WHOLE_BLOCK_F if features_contiguous else 4)
    block_r = max(1, min(_pow2(rows), GPU_TILE // block_f))
    return TileConfig(block_r, block_f, 8, 1, 1, one_launch=True)


def choose_config(
    features_contiguous: bool, features: int, rows: int, moved_bytes: int, multiprocessors: int
) -> TileConfig:
    """The engine and its tile: tuning.BATCHNORM_ONE_LAUNCH where set, else the FAST choice (the
    cost model of tuning.batchnorm_one_launch)."""
    whole = whole_config(features_contiguous, features, rows)
    choice = tuning.BATCHNORM_ONE_LAUNCH
    if choice < 0:
        choice = tuning.batchnorm_one_launch(moved_bytes, triton_cdiv(features, whole.block_f), multiprocessors)
    return whole if choice else tile_config(features_contiguous, features, rows)


@dataclass(frozen=True)
class View:
    """A 4-d tensor as the kernels' [rows, features]: its strides normalized so that the flags the
    kernels specialize on hold (a unit axis takes the stride the composite axis needs)."""

    strides: tuple[int, int, int, int]
    flat: bool  # pixel p of a plane is at p * sw
    linear: bool  # the composite axis (spatial: the rows (n, pixel); per-activation: the features) is one stride


def tensor_view(t: Tensor, per_activation: bool) -> View:
    n, c, h, w = t.shape
    sn, sc, sh, sw = t.stride()
    if w == 1:
        sw = sh
    if h == 1:
        sh = w * sw
    if h * w == 1:  # no plane: the composite axis is N (spatial) or C (per-activation) alone
        sw = sc if per_activation else sn
        sh = sw
    flat = sh == w * sw
    if per_activation:
        linear = flat and (c == 1 or sc == h * w * sw)
    else:
        linear = flat and (n == 1 or sn == h * w * sw)
    return View((sn, sc, sh, sw), flat, linear)


def joint_flags(views: Sequence[View]) -> tuple[bool, bool]:
    """(LINEAR, FLAT) for kernels that address all of ``views`` with one index computation."""
    flat = all(v.flat for v in views)
    return flat and all(v.linear for v in views), flat


@dataclass(frozen=True)
class Geometry:
    rows: int
    features: int
    per_activation: bool
    hw: int
    w: int


def geometry(spec: PlanSpec) -> Geometry:
    n, c, h, w = spec.input_desc.dims
    per_activation = spec.ops[0].mode == BatchNormMode.PER_ACTIVATION
    if per_activation:
        return Geometry(n, c * h * w, True, h * w, w)
    return Geometry(n * h * w, c, False, h * w, w)


class _SideOutput:
    """A per-feature tensor the kernel writes: itself when its features are one contiguous run,
    else a contiguous stand-in copied back after the launch."""

    def __init__(self, t: Tensor | None, fallback: Tensor, read: bool = False) -> None:
        self.target = t
        if t is None:
            self.buffer = fallback
        elif t.is_contiguous():
            self.buffer = t.view(-1)
        else:
            self.buffer = t.reshape(-1).clone() if read else torch.empty(t.numel(), dtype=t.dtype, device=t.device)

    @property
    def direct(self) -> bool:
        """Whether the kernel writes the target itself (no copy after the launch)."""
        return self.target is None or self.target.is_contiguous()

    def finish(self) -> None:
        if self.target is not None and not self.target.is_contiguous():
            self.target.copy_(self.buffer.view(self.target.shape))


def _launch_key(fn_name: str, args: Sequence) -> tuple | None:
    """What selects a launch's compiled kernel, found faster than Triton's specialization: every
    argument but the tensors verbatim (so ints specialize as they would), the tensors' dtypes; None
    unless every tensor is 16-byte aligned (the specialization assumed here)."""
    parts = []
    for a in args:
        if isinstance(a, Tensor):
            if a.data_ptr() % 16:
                return None
            parts.append(a.dtype)
        else:
            parts.append(a)
    return (fn_name, *parts)


def _layout(t: Tensor) -> tuple:
    return t.shape, t.stride(), t.dtype


def _geometry_key(x: Tensor, y: Tensor, p: Tensor, records: Sequence[OpArgs]) -> tuple:
    """What a call's launches depend on: the tensors' layouts, the records' other fields."""
    return (_layout(x), _layout(y), None if p is y else _layout(p), *(r.layout_key() for r in records))


def _slot_tensors(x: Tensor, y: Tensor, p: Tensor, records: Sequence[OpArgs]) -> list[Tensor]:
    """Every tensor of a call, in the order of a template's slots: the output, the input, the prior
    where it is not the output, then each record's tensors."""
    tensors = [y, x] if p is y else [y, x, p]
    for rec in records:
        tensors.extend(rec.tensors())
    return tensors


@dataclass
class _Template:
    """The three launches of one call geometry (see _TrainingKernel._bind), every tensor of the call
    in a slot, and when they may run for another call of that geometry: its tensors 16-byte
    aligned, the output overlapping none of them but in place (an input of its shape and strides at
    its address), on the stream whose workspace the launches hold, outside graph captures."""

    launches: list[BoundLaunch]
    extents: list[int]  # bytes each slot's tensor spans
    in_place_ok: list[bool]  # the slot's tensor has the output's shape and strides
    stream: int

    def try_launch(self, tensors: Sequence[Tensor]) -> bool:
        pointers = [t.data_ptr() for t in tensors]
        yp = pointers[0]
        y_end = yp + self.extents[0]
        aligned = 0
        for i in range(1, len(pointers)):
            a = pointers[i]
            aligned |= a
            if a < y_end and yp < a + self.extents[i] and not (a == yp and self.in_place_ok[i]):
                return False
        if (aligned | yp) & 15:
            return False
        if torch.cuda.is_current_stream_capturing() or current_raw_stream() != self.stream:
            return False
        for launch in self.launches:
            launch.launch(pointers)
        return True


def _template_slots(issued: list[tuple], tensors: Sequence[Tensor], workspace: Tensor) -> list[list[tuple]] | None:
    """Per launch of ``issued``, per slot tensor, the argument indices that take its address; None
    where the launches cannot be bound: an argument not launched by a compiled kernel, a tensor
    unaligned, two slots at one address, a tensor argument neither a slot's nor the workspace."""
    addresses = [t.data_ptr() for t in tensors]
    if len(set(addresses)) != len(addresses) or any(a % 16 for a in addresses):
        return None
    slot_of = {a: i for i, a in enumerate(addresses)}
    ws_start, ws_end = workspace.data_ptr(), workspace.data_ptr() + extent_bytes(workspace)
    slots = []
    for launcher, kernel, _, args in issued:
        if kernel is None or not launcher.direct:
            return None
        per_slot: list[list[int]] = [[] for _ in tensors]
        for i, a in enumerate(args):
            if not isinstance(a, Tensor):
                continue
            slot = slot_of.get(a.data_ptr())
            if slot is not None:
                per_slot[slot].append(i)
            elif not ws_start <= a.data_ptr() < ws_end:
                return None
        slots.append([tuple(s) for s in per_slot])
    return slots


def _flat(t: Tensor) -> Tensor:
    """A per-feature tensor as the kernels read it: one contiguous run (a copy where it is strided)."""
    return t.reshape(-1).contiguous()


def _aliased_output(y: Tensor, *inputs: Tensor) -> bool:
    """Whether writing y could change an input before it is read: y shares memory with it, other
    than as the same elements in the same strides (each element read then written by one program)."""
    return any(shares_memory(y, t) and (y.data_ptr() != t.data_ptr() or y.stride() != t.stride()) for t in inputs)


class _TrainingKernel(Kernel):
    solver_name = "triton-batchnorm"

    def __init__(self, spec: PlanSpec, handle) -> None:
        self.spec = spec
        self._source = render_source(spec)
        self.path = write_source(self._source, "batchnorm")
        self.direct = handle.settings.direct_launch
        self.geo = geometry(spec)
        self.has_act = len(spec.ops) > 1
        sms = persistent_programs(handle)
        self.programs = 4 * sms
        n, c, h, w = spec.input_desc.dims
        moved = (5 if spec.phase == Phase.BACKWARD else 3) * n * c * h * w * spec.dtype.torch_dtype.itemsize
        contiguous = features_contiguous(spec, self.geo)
        self.config = choose_config(contiguous, self.geo.features, self.geo.rows, moved, sms)
        self._launchers: dict[str, Launcher] = {}
        self._issued: list[tuple] = []
        self._templates: dict[tuple, _Template] = {}
        self._workspace_tensor: Tensor | None = None
        self._kernels: dict[tuple, object] = {}  # compiled kernels by _launch_key
        self._wide: dict[tuple, bool] = {}
        cfg = self.config
        self.feature_blocks = triton_cdiv(self.geo.features, cfg.block_f)
        # chunks of rows: enough programs to fill the GPU, never a chunk smaller than a tile
        tiles = triton_cdiv(self.geo.rows, cfg.block_r)
        chunks = max(1, min(tiles, triton_cdiv(self.programs, self.feature_blocks)))
        self.rows_per_chunk = triton_cdiv(tiles, chunks) * cfg.block_r
        self.chunks = triton_cdiv(self.geo.rows, self.rows_per_chunk)

    def source(self) -> str:
        return self._source

    def _consts(self, views: Sequence[View], *tensors: Tensor) -> list:
        g, cfg = self.geo, self.config
        linear, flat = joint_flags(views)
        return [g.features, g.hw, g.w, g.per_activation, linear, flat, cfg.block_r, cfg.block_f, self._int64(tensors)]

    def _int64(self, tensors: Sequence[Tensor]) -> bool:
        """needs_int64, remembered per geometry (a framework calls a plan with tensors of one layout)."""
        key = tuple(map(_layout, tensors))
        wide = self._wide.get(key)
        if wide is None:
            wide = self._wide[key] = needs_int64(*tensors)
        return wide

    def _workspace(self, device: torch.device, partials: int, coefs: int) -> tuple[list[Tensor], Tensor]:
        f = self.geo.features
        ws = self._workspace_tensor = torch.empty(
            partials * self.chunks * f + coefs * f, dtype=torch.float32, device=device
        )
        parts = [ws[i * self.chunks * f : (i + 1) * self.chunks * f] for i in range(partials)]
        return parts, ws[partials * self.chunks * f :]

    def _launch(self, fn_name: str, grid: tuple[int, int, int], args: list) -> None:
        launcher = self._launchers.get(fn_name)
        if launcher is None:
            launcher = self._launchers[fn_name] = Launcher(
                generated_kernel(self._source, "batchnorm", fn_name), direct=self.direct
            )
        key = _launch_key(fn_name, args) if launcher.direct else None
        kernel = self._kernels.get(key) if key is not None else None
        if kernel is not None:  # Launcher's specialization of every argument, skipped (tens of us a launch)
            launch_compiled(kernel, grid, args)
        else:
            kernel = launcher(grid, (fn_name, self.config), args, self.config.num_warps, 1)
            if key is not None and kernel is not None and not _needs_scratch(kernel):
                self._kernels[key] = kernel
        self._issued.append((launcher, kernel, grid, args))

    def run(self, x: Tensor, y: Tensor, records: Sequence[OpArgs], prior: Tensor | None) -> None:
        p = y if prior is None else prior  # the plan gives a prior only where an operator's beta reads it
        key = _geometry_key(x, y, p, records)
        tensors = _slot_tensors(x, y, p, records)
        template = self._templates.get(key)
        if template is not None and template.try_launch(tensors):
            return
        self._issued = []
        with torch.no_grad():
            bindable = self._launch_all(x, y, p, records)
        issued, self._issued = self._issued, []
        if bindable:
            self._bind(key, issued, tensors)

    rerun = run

    def repeat_with_tensors(self, x: Tensor, y: Tensor, records: Sequence[OpArgs]):
        """The launch template of the call's geometry (its slots are the tensors in the order
        Kernel.repeat_with_tensors gives them); None until a call of it has been bound."""
        template = self._templates.get(_geometry_key(x, y, y, records))
        return None if template is None else template.try_launch

    def _launch_all(self, x: Tensor, y: Tensor, p: Tensor, records: Sequence[OpArgs]) -> bool:
        """Launch the three kernels on a call's tensors (the prior slot ``p``: the prior, else y);
        whether they can be bound: each tensor read and written in place (no stand-in)."""
        raise NotImplementedError

    def _bind(self, key: tuple, issued: list[tuple], tensors: Sequence[Tensor]) -> None:
        """Keep a call's launches, every tensor of the call in a slot, for the later calls of its
        geometry (a framework's new tensors and records each step): three C launches, no argument
        processing, the workspace kept."""
        if interpreter_active() or torch.cuda.is_current_stream_capturing():  # a capture's memory is the graph's
            return
        assert self._workspace_tensor is not None
        slots = _template_slots(issued, tensors, self._workspace_tensor)
        if slots is None:
            return
        launches = [BoundLaunch(kernel, grid, args, s) for (_, kernel, grid, args), s in zip(issued, slots)]
        y = tensors[0]
        in_place_ok = [t.shape == y.shape and t.stride() == y.stride() for t in tensors]
        if len(self._templates) >= 64:
            self._templates.clear()
        self._templates[key] = _Template(
            launches, [extent_bytes(t) for t in tensors], in_place_ok, current_raw_stream()
        )

    @staticmethod
    def _finish(y: Tensor, out: Tensor, side_outputs: Sequence[_SideOutput]) -> bool:
        """After the launches: the side outputs written and y copied from their stand-ins; whether
        the call can be bound (no stand-in: every tensor read and written in place)."""
        for s in side_outputs:
            s.finish()
        if out is not y:
            y.copy_(out)
        return out is y and all(s.direct for s in side_outputs)

    def _grids(self) -> tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int, int]]:
        cfg = self.config
        partial = (self.chunks, self.feature_blocks, 1)
        finalize = (triton_cdiv(self.geo.features, cfg.finalize_f), 1, 1)
        apply = (triton_cdiv(self.geo.rows, cfg.block_r), self.feature_blocks, 1)
        return partial, finalize, apply


def features_contiguous(spec: PlanSpec, geo: Geometry) -> bool:
    """Whether the plan's input is contiguous along the features (else along the rows, or neither):
    the axis the tiles are long along."""
    _, c, h, w = spec.input_desc.dims
    _, sc, _, sw = spec.input_desc.strides
    if geo.per_activation:
        return (sw if h * w > 1 else sc) == 1
    return c > 1 and sc == 1


def _activation_scalars(rec: OpArgs | None) -> tuple[list[float], bool, bool]:
    """(activAlpha, activBeta, activGamma, alpha, beta), whether beta blends the prior, and whether
    alpha is 1 (a multiply per element less)."""
    if rec is None:
        return [1.0, 0.0, 1.0, 1.0, 0.0], False, True
    assert isinstance(rec, (ActivationArgs, ActivationBackwardArgs))
    values = [float(v) for v in (rec.activ_alpha, rec.activ_beta, rec.activ_gamma, rec.alpha, rec.beta)]
    return values, values[4] != 0.0, values[3] == 1.0


class TritonBatchNormForwardKernel(_TrainingKernel):
    def _launch_all(self, x: Tensor, y: Tensor, p: Tensor, records: Sequence[OpArgs]) -> bool:
        bn = records[0]
        assert isinstance(bn, BatchNormForwardArgs)
        act_values, act_prior, unit_alpha = _activation_scalars(records[1] if self.has_act else None)
        bn_prior = float(bn.beta) != 0.0
        out = torch.empty_like(y) if _aliased_output(y, x, p) else y
        g, cfg = self.geo, self.config
        workspace, coef = self._workspace(x.device, 0 if cfg.one_launch else 2, 3)
        per_act = self.geo.per_activation
        vx, vy, vp = (tensor_view(t, per_act) for t in (x, out, p))
        side = [_SideOutput(bn.saved_mean, coef), _SideOutput(bn.saved_inv_variance, coef)]
        running = [_SideOutput(bn.running_mean, coef, read=True), _SideOutput(bn.running_variance, coef, read=True)]
        has_running = bn.running_mean is not None and bn.running_variance is not None
        scale, bias = _flat(bn.scale), _flat(bn.bias)
        flags = [bn.saved_mean is not None, bn.saved_inv_variance is not None, has_running]
        if cfg.one_launch:
            self._launch(
                "forward_whole",
                (1, self.feature_blocks, 1),
                [
                    x, out, p, scale, bias, *(s.buffer for s in side), *(s.buffer for s in running),
                    float(bn.epsilon), float(bn.exp_avg_factor), float(bn.alpha), float(bn.beta), *act_values,
                    g.rows, *vx.strides, *vy.strides, *vp.strides, *self._consts([vx, vy, vp], x, out, p), *flags,
                    self.has_act, bn_prior, act_prior, unit_alpha,
                ],
            )  # fmt: skip
            return self._finish(y, out, side + (running if has_running else []))
        mean_ws, m2_ws = workspace
        partial, finalize, apply = self._grids()
        self._launch(
            "forward_partial",
            partial,
            [x, mean_ws, m2_ws, g.rows, self.rows_per_chunk, *vx.strides, *self._consts([vx], x)],
        )
        self._launch(
            "forward_finalize",
            finalize,
            [
                mean_ws, m2_ws, coef, scale, bias, *(s.buffer for s in side), *(s.buffer for s in running),
                self.chunks, g.rows, self.rows_per_chunk, float(bn.epsilon), float(bn.exp_avg_factor),
                float(bn.alpha), g.features, cfg.finalize_k, cfg.finalize_f, *flags,
            ],
        )  # fmt: skip
        self._launch(
            "forward_apply",
            apply,
            [
                x, out, p, coef, float(bn.beta), *act_values, g.rows, *vx.strides, *vy.strides, *vp.strides,
                *self._consts([vx, vy, vp], x, out, p), self.has_act, bn_prior, act_prior, unit_alpha,
            ],
        )  # fmt: skip
        return self._finish(y, out, side + (running if has_running else []))


class TritonBatchNormBackwardKernel(_TrainingKernel):
    def _launch_all(self, x: Tensor, y: Tensor, p: Tensor, records: Sequence[OpArgs]) -> bool:
        # x is dy (the plan's input), y is dx; the forward input is the batch-norm record's x
        bn = records[0]
        assert isinstance(bn, BatchNormBackwardArgs)
        act_values, act_prior, unit_alpha = _activation_scalars(records[1] if self.has_act else None)
        bn_prior = float(bn.beta) != 0.0
        dy, fx = x, bn.x
        out = torch.empty_like(y) if _aliased_output(y, dy, fx, p) else y
        g, cfg = self.geo, self.config
        workspace, coef = self._workspace(dy.device, 0 if cfg.one_launch else 2, 3)
        per_act = self.geo.per_activation
        vd, vx, vp, vo = (tensor_view(t, per_act) for t in (dy, fx, p, out))
        params = [_flat(t) for t in (bn.saved_mean, bn.saved_inv_variance, bn.scale, bn.bias)]
        grads = [_SideOutput(bn.result_scale_diff, coef), _SideOutput(bn.result_bias_diff, coef)]
        if cfg.one_launch:
            self._launch(
                "backward_whole",
                (1, self.feature_blocks, 1),
                [
                    dy, fx, p, out, *params, grads[0].buffer, grads[1].buffer, float(bn.alpha), float(bn.beta),
                    *act_values, g.rows, *vd.strides, *vx.strides, *vp.strides, *vo.strides,
                    *self._consts([vd, vx, vp, vo], dy, fx, p, out), self.has_act, bn_prior, act_prior, unit_alpha,
                ],
            )  # fmt: skip
            return self._finish(y, out, grads)
        sum_ws, dot_ws = workspace
        partial, finalize, apply = self._grids()
        self._launch(
            "backward_partial",
            partial,
            [
                dy, fx, p, *params, sum_ws, dot_ws, *act_values, g.rows, self.rows_per_chunk,
                *vd.strides, *vx.strides, *vp.strides, *self._consts([vd, vx, vp], dy, fx, p),
                self.has_act, act_prior, unit_alpha,
            ],
        )  # fmt: skip
        self._launch(
            "backward_finalize",
            finalize,
            [
                sum_ws, dot_ws, coef, params[2], params[1], grads[0].buffer, grads[1].buffer, self.chunks, g.rows,
                float(bn.alpha), g.features, cfg.finalize_k, cfg.finalize_f,
            ],
        )  # fmt: skip
        self._launch(
            "backward_apply",
            apply,
            [
                dy, fx, p, out, *params, coef, float(bn.beta), *act_values, g.rows,
                *vd.strides, *vx.strides, *vp.strides, *vo.strides,
                *self._consts([vd, vx, vp, vo], dy, fx, p, out), self.has_act, bn_prior, act_prior, unit_alpha,
            ],
        )  # fmt: skip
        return self._finish(y, out, grads)


#: data types the training kernels run (no dot products: bf16 is exact in the interpreter too)
TRAINING_DTYPES = TRITON_DTYPES


class TritonBatchNormSolver(Solver):
    name = "triton-batchnorm"
    family = "triton"

    def why_not(self, spec: PlanSpec, handle) -> str | None:
        if spec.phase == Phase.INFERENCE:
            return "inference plans are the other Triton solvers' (this one runs the training plans)"
        first = spec.ops[0]
        if not isinstance(first, (BatchNormForwardOp, BatchNormBackwardOp)):
            return f"the plan starts with {first.title}; the training kernels start with batch-norm"
        if spec.input_desc.ndim != 4:
            return f"{spec.input_desc.ndim}-d tensors; the training kernels take 4-d (NCHW) tensors"
        if spec.dtype not in TRAINING_DTYPES:
            return f"{spec.dtype.name} data is not supported by the Triton kernels (fp32, fp16, bf16 are)"
        return device_why_not(handle, DataType.FLOAT)

    def build(self, spec: PlanSpec, handle) -> Kernel:
        if spec.phase == Phase.BACKWARD:
            return TritonBatchNormBackwardKernel(spec, handle)
        return TritonBatchNormForwardKernel(spec, handle)
