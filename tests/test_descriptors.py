"""Descriptors are validated when made and say which field is wrong."""

import pytest
import torch

import fusionplan as fp
from fusionplan.core.descriptors import batchnorm_param_dims, layout_strides


def test_packed_layouts():
    nchw = fp.TensorDescriptor.packed("float", (2, 3, 5, 7))
    nhwc = fp.TensorDescriptor.packed(fp.DataType.HALF, (2, 3, 5, 7), fp.Layout.NHWC)
    assert nchw.strides == (105, 35, 7, 1) and nchw.layout == fp.Layout.NCHW
    assert nhwc.strides == (105, 1, 21, 3) and nhwc.layout == fp.Layout.NHWC
    assert nhwc.strides == torch.empty(2, 3, 5, 7).to(memory_format=torch.channels_last).stride()


def test_from_tensor_roundtrip_and_mismatch():
    t = torch.empty(2, 4, 3, 3, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    d = fp.TensorDescriptor.from_tensor(t)
    assert d.dtype == fp.DataType.BFLOAT16 and d.layout == fp.Layout.NHWC and d.mismatch(t, "t") is None
    assert "shape" in d.mismatch(torch.empty(2, 4, 3, 4, dtype=torch.bfloat16), "t")
    assert "dtype" in d.mismatch(torch.empty(2, 4, 3, 3).to(memory_format=torch.channels_last), "t")
    assert "strides" in d.mismatch(torch.empty(2, 4, 3, 3, dtype=torch.bfloat16), "t")


def test_size_one_dims_ignore_strides():
    # C == 1: NCHW and NHWC strides differ only on the unit dim, so both descriptors match.
    d = fp.TensorDescriptor.packed("float", (2, 1, 4, 4))
    assert d.mismatch(torch.empty(2, 1, 4, 4).to(memory_format=torch.channels_last), "t") is None


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(dtype="float", dims=(2, 0, 3, 3), strides=(9, 9, 3, 1)), "dims"),
        (dict(dtype="float", dims=(2, 3, 3, 3), strides=(27, 9, 3)), "strides"),
        (dict(dtype="float", dims=(2, 3, 3, 3), strides=(27, 9, 3, 0)), "strides"),
        (dict(dtype="float", dims=(2, 3, 3, 3), strides=(1, 1, 1, 1)), "overlap"),
        (dict(dtype="quad", dims=(2, 3, 3, 3), strides=(27, 9, 3, 1)), "dtype"),
        (dict(dtype=42, dims=(2, 3, 3, 3), strides=(27, 9, 3, 1)), "dtype"),
        (dict(dtype="float", dims=(1,) * 6, strides=(1,) * 6), "dims"),
        (dict(dtype="float", dims=(2, 3.5, 3, 3), strides=(27, 9, 3, 1)), "dims"),
    ],
)
def test_tensor_descriptor_rejects(kwargs, field):
    with pytest.raises(fp.BadParmError, match=field):
        fp.TensorDescriptor(**kwargs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(pads=(-1, 0)), "pads"),
        (dict(strides=(0, 1)), "strides"),
        (dict(dilations=(1, 0)), "dilations"),
        (dict(groups=0), "group"),
        (dict(pads=(0, 0, 0)), "spatial"),
        (dict(mode=9), "mode"),
    ],
)
def test_convolution_descriptor_rejects(kwargs, field):
    with pytest.raises(fp.BadParmError, match=field):
        fp.ConvolutionDescriptor(**kwargs)


@pytest.mark.parametrize(
    "shape, w, conv",
    [
        ((2, 3, 13, 11), (17, 3, 3, 3), fp.ConvolutionDescriptor((1, 1), (2, 2), (1, 1))),
        ((1, 8, 9, 9), (8, 1, 3, 3), fp.ConvolutionDescriptor((2, 2), (1, 1), (2, 2), groups=8)),
        ((1, 6, 7, 5), (9, 2, 1, 3), fp.ConvolutionDescriptor((0, 1), (1, 2), (1, 1), groups=3)),
    ],
)
def test_output_dims_match_torch(shape, w, conv):
    x_desc = fp.TensorDescriptor.packed("float", shape)
    w_desc = fp.TensorDescriptor.packed("float", w)
    out = torch.nn.functional.conv2d(
        torch.empty(shape), torch.empty(w), None, conv.strides, conv.pads, conv.dilations, conv.groups
    )
    assert conv.output_dims(x_desc, w_desc) == tuple(out.shape)


def test_output_dims_errors():
    x = fp.TensorDescriptor.packed("float", (1, 6, 4, 4))
    with pytest.raises(fp.BadParmError, match="filter channels 4 != C/groups"):
        fp.ConvolutionDescriptor(groups=2).output_dims(x, fp.TensorDescriptor.packed("float", (8, 4, 3, 3)))
    with pytest.raises(fp.BadParmError, match="not divisible by groups"):
        fp.ConvolutionDescriptor(groups=4).output_dims(x, fp.TensorDescriptor.packed("float", (8, 1, 3, 3)))
    with pytest.raises(fp.BadParmError, match="empty"):
        fp.ConvolutionDescriptor().output_dims(x, fp.TensorDescriptor.packed("float", (8, 6, 5, 5)))


def test_activation_descriptor_validates():
    d = fp.ActivationDescriptor("leakyrelu", 0.1)
    assert d.mode == fp.ActivationMode.LEAKYRELU and d.alpha == 0.1
    with pytest.raises(fp.BadParmError, match="alpha"):
        fp.ActivationDescriptor(fp.ActivationMode.ELU, float("nan"))
    with pytest.raises(fp.BadParmError, match="activation mode"):
        fp.ActivationDescriptor(10)


def test_batchnorm_param_dims():
    assert batchnorm_param_dims(fp.BatchNormMode.SPATIAL, (2, 5, 3, 4)) == (1, 5, 1, 1)
    assert batchnorm_param_dims(fp.BatchNormMode.PER_ACTIVATION, (2, 5, 3, 4)) == (1, 5, 3, 4)


def test_layout_strides_nd():
    assert layout_strides((2, 3, 4), fp.Layout.NHWC) == (12, 1, 3)


def test_element_extent_spans_first_to_one_past_last():
    from fusionplan.core.descriptors import element_extent

    t = torch.empty(2, 3, 5, 4).to(memory_format=torch.channels_last)
    assert element_extent(tuple(t.shape), t.stride()) == t.numel()
    view = torch.empty(4, 6, 8, 8)[:, ::2, 1:7, ::3]
    expected = view.storage_offset() + 1 + sum((d - 1) * s for d, s in zip(view.shape, view.stride()))
    assert element_extent(tuple(view.shape), view.stride()) + view.storage_offset() == expected
    assert element_extent((2, 0, 3, 3), (0, 9, 3, 1)) == 0
