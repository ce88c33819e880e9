"""gluon-rows on the GPU: channels-last rows and channel planes.

python -m pytest -m gpu tests/gpu -n 12
"""

from __future__ import annotations

import pytest
import torch

import fusionplan as fp

from .common import check_forced_solver

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


#: (n, c, h, w, k, r, s, pads, dilation) for gluon-rows: ResNet-50's 64-channel 3x3 layer on few
#: images; K not a multiple of 8 nor of the 64-channel block (17, 136: three blocks), C below the
#: box's power of two (48, 8), a 5x5 filter of 16 channels, dilation 2, no padding, uneven padding,
#: a 1x3 filter, rows narrower than 32 pixels (13: 16-pixel products), fewer rows than programs
#: (one image of 5 rows), runs that cross images (more rows than programs) and runs of about ten
#: output rows and more that wrap around the ring and cross images (long-runs: 150 images of 9 rows).
GLUON_ROWS_CASES = {
    "r50_02-like": (3, 64, 56, 56, 64, 3, 3, (1, 1), 1),
    "C16-K17": (5, 16, 13, 40, 17, 3, 3, (1, 1), 1),
    "C48-K96": (2, 48, 21, 37, 96, 3, 3, (1, 1), 1),
    "C8-K32": (2, 8, 12, 40, 32, 3, 3, (1, 1), 1),
    "5x5-C16": (2, 16, 20, 45, 24, 5, 5, (2, 2), 1),
    "dilated": (3, 32, 30, 33, 40, 3, 3, (2, 2), 2),
    "valid": (4, 64, 18, 34, 64, 3, 3, (0, 0), 1),
    "pads-2-0": (3, 64, 11, 40, 64, 3, 3, (2, 0), 1),
    "K136": (2, 64, 24, 64, 136, 3, 3, (1, 1), 1),
    "1x3": (3, 64, 10, 50, 64, 1, 3, (0, 1), 1),
    "narrow": (6, 64, 9, 13, 64, 3, 3, (1, 1), 1),
    "one-image": (1, 64, 5, 40, 64, 3, 3, (1, 1), 1),
    "long-runs": (150, 64, 9, 40, 64, 3, 3, (1, 1), 1),
    "long-runs-5x5": (60, 16, 30, 50, 32, 5, 5, (2, 2), 1),
    # two channel halves (C > 64), one per computing warpgroup: ResNet's r50_10, C = 72 and 96
    # (the second half's box partly past C), K = 17 and 136, dilation 2 (16-pixel rows), 1x3 (64-pixel rows: R = 1
    # needs 2 slots), rows of 13 and 32 pixels, long runs around the ring and across images
    "halves-r50_10-like": (3, 128, 28, 28, 128, 3, 3, (1, 1), 1),
    "halves-C72-K17": (3, 72, 14, 30, 17, 3, 3, (1, 1), 1),
    "halves-C96-K136": (2, 96, 20, 30, 136, 3, 3, (1, 1), 1),
    "halves-dilated": (2, 128, 24, 14, 64, 3, 3, (2, 2), 2),
    "halves-1x3": (3, 128, 10, 50, 64, 1, 3, (0, 1), 1),
    "halves-narrow": (6, 128, 9, 13, 64, 3, 3, (1, 1), 1),
    "halves-32": (2, 128, 12, 32, 64, 3, 3, (1, 1), 1),
    "halves-long-runs": (150, 128, 9, 28, 64, 3, 3, (1, 1), 1),
}


@pytest.mark.parametrize("out_layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("precision, chain", [("fp16", "CBNA"), ("bf16", "CNAAB"), ("fp16", "CA")])
@pytest.mark.parametrize("case", list(GLUON_ROWS_CASES))
def test_gluon_rows_cases(case, precision, chain, out_layout):
    """gluon-rows forced on each case against the float64 reference, the output NaN-filled in
    either layout; then with random alpha and beta over a prior output."""
    n, c, h, w, k, r, s, pads, dil = GLUON_ROWS_CASES[case]
    conv = fp.ConvolutionDescriptor(pads, (1, 1), (dil, dil))
    check_forced_solver("gluon-rows", case, (n, c, h, w), conv, k, r, s, precision, chain, out_layout)


#: GLUON_ROWS_CASES that gluon-rows takes on channel planes (NCHW input: rows of whole 16-byte
#: units that an output row's box holds, at most 64 channels), a dilated one of 40 columns, rows
#: of 24 pixels (32 in the product) and of 96 (128: past what a shifter's thread holds, shifted
#: products).
GLUON_ROWS_PLANE_CASES = {
    **{name: case for name, case in GLUON_ROWS_CASES.items() if case[3] % 8 == 0 and case[1] <= 64},
    "dilated-40": (3, 32, 30, 40, 40, 3, 3, (2, 2), 2),
    "rows-24": (3, 32, 11, 24, 40, 3, 3, (1, 1), 1),
    "rows-96": (2, 32, 9, 96, 40, 3, 3, (1, 1), 1),
}


@pytest.mark.parametrize("shifts", [True, False], ids=["shifted-rows", "shifted-products"])
@pytest.mark.parametrize("out_layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("precision, chain", [("fp16", "CBNA"), ("bf16", "CNAAB")])
@pytest.mark.parametrize("case", list(GLUON_ROWS_PLANE_CASES))
def test_gluon_rows_plane_cases(case, precision, chain, out_layout, shifts, monkeypatch):
    """gluon-rows on channel-plane input (each input row's box from column 0; the filter's columns
    as the shifter's moved copies of the box, or, the shifter refused, as shifts of the products)
    against the float64 reference."""
    from fusionplan.solvers import gluon_rows

    if not shifts:
        monkeypatch.setattr(gluon_rows, "shifted_planes_why_not", lambda spec: "refused")
    n, c, h, w, k, r, s, pads, dil = GLUON_ROWS_PLANE_CASES[case]
    conv = fp.ConvolutionDescriptor(pads, (1, 1), (dil, dil))
    check_forced_solver("gluon-rows", case, (n, c, h, w), conv, k, r, s, precision, chain, out_layout, "NCHW")
