"""The stem kernels (triton-stem, gluon-stem) on the GPU.

python -m pytest -m gpu tests/gpu -n 12
"""

from __future__ import annotations

import pytest
import torch

import fusionplan as fp

from .common import check_forced_solver

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


#: (n, c, h, w, k, r, s, pads, strides, dilation) for gluon-stem: ResNet-50's stem on few images;
#: K not a multiple of 8 nor of the 64-channel block (17, 136: three blocks), C = 4 and 8, a 3x3
#: stride-1 filter (on channel planes: runs of two pixels, 4-byte copies), dilation 2 (on channel
#: planes: 8 planes side by side in a 64-element row), uneven padding, a 1x7 filter, stride 3, rows
#: of a single run, fewer output rows than programs (one image of 5 rows) and runs of output rows
#: that cross images and wrap around the ring (long-runs: 90 images of 4 rows; 12 images of 56),
#: runs of one pixel (C = 2) and of four (rows of 199 and 160 pixels: C = 1, 16-byte copies; C = 2
#: with TMA stores of the channels-last output, like every case whose rows are whole runs of
#: 16-byte aligned pixels).
GLUON_STEM_CASES = {
    "r50_00-like": (3, 3, 224, 224, 64, 7, 7, (3, 3), (2, 2), 1),
    "C3-K17": (2, 3, 40, 52, 17, 7, 7, (3, 3), (2, 2), 1),
    "C4-K136": (2, 4, 21, 36, 136, 3, 3, (1, 1), (1, 1), 1),
    "C8-dilated": (3, 8, 30, 40, 32, 3, 3, (2, 2), (1, 1), 2),
    "pads-3-1": (2, 3, 25, 64, 64, 7, 7, (3, 1), (2, 2), 1),
    "1x7": (2, 3, 12, 64, 40, 1, 7, (0, 3), (1, 2), 1),
    "stride-3": (2, 4, 30, 48, 64, 5, 5, (2, 2), (3, 3), 1),
    "one-run": (4, 3, 16, 4, 64, 3, 3, (1, 1), (2, 2), 1),
    "one-image": (1, 3, 9, 64, 64, 7, 7, (3, 3), (2, 2), 1),
    "long-runs": (90, 3, 8, 64, 64, 7, 7, (3, 3), (2, 2), 1),
    "long-runs-112": (12, 3, 112, 112, 64, 7, 7, (3, 3), (2, 2), 1),
    "C2-one-pixel-runs": (2, 2, 20, 40, 24, 7, 7, (0, 0), (2, 2), 1),
    "C1-four-pixel-runs": (2, 1, 20, 400, 32, 3, 3, (0, 0), (2, 2), 1),
    "C2-four-pixel-runs": (2, 2, 20, 160, 64, 3, 3, (1, 1), (1, 1), 1),
}


@pytest.mark.parametrize(
    "in_layout, out_layout", [("NHWC", "NHWC"), ("NHWC", "NCHW"), ("NCHW", "NCHW"), ("NCHW", "NHWC")]
)
@pytest.mark.parametrize("precision, chain", [("fp16", "CBNA"), ("bf16", "CNAAB"), ("fp16", "CA")])
@pytest.mark.parametrize("case", list(GLUON_STEM_CASES))
def test_gluon_stem_cases(case, precision, chain, in_layout, out_layout):
    """gluon-stem forced on each case, channels-last or channel-plane input (a stretch per channel
    plane), against the float64 reference, the output NaN-filled in either layout; then with random
    alpha and beta over a prior output."""
    n, c, h, w, k, r, s, pads, strides, dil = GLUON_STEM_CASES[case]
    conv = fp.ConvolutionDescriptor(pads, strides, (dil, dil))
    check_forced_solver("gluon-stem", case, (n, c, h, w), conv, k, r, s, precision, chain, out_layout, in_layout)
