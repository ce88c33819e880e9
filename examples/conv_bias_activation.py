"""The seeds' fusion example (MIOpenExamples/fusion): convolution + bias + ReLU, ported line for line.

Run: python examples/conv_bias_activation.py   (GPU if there is one, else the CPU)
"""

import sys

import torch

from fusionplan.miopen import *  # noqa: F403 -- the MIOpen names, as C code has them

# Geometry of the example: a batch of 1, 3 -> 4 channels, 3x3 filter, 32x32 image, pad 1.
n, c, h, w = 1, 3, 32, 32
k, fy, fx = 4, 3, 3


def main() -> int:
    status, handle = miopenCreate()
    _, stream = miopenGetStream(handle)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    # Tensor descriptors and device buffers (the example leaves them unpopulated; we fill them).
    _, input_desc = miopenCreateTensorDescriptor()
    miopenSet4dTensorDescriptor(input_desc, miopenFloat, n, c, h, w)
    _, weights_desc = miopenCreateTensorDescriptor()
    miopenSet4dTensorDescriptor(weights_desc, miopenFloat, k, c, fy, fx)
    _, bias_desc = miopenCreateTensorDescriptor()
    miopenSet4dTensorDescriptor(bias_desc, miopenFloat, 1, k, 1, 1)

    _, conv_desc = miopenCreateConvolutionDescriptor()
    miopenInitConvolutionDescriptor(conv_desc, miopenConvolution, 1, 1, 1, 1, 1, 1)
    _, on, oc, oh, ow = miopenGetConvolutionForwardOutputDim(conv_desc, input_desc, weights_desc)
    _, output_desc = miopenCreateTensorDescriptor()
    miopenSet4dTensorDescriptor(output_desc, miopenFloat, on, oc, oh, ow)

    x = torch.randn(n, c, h, w, device=device)
    weights = torch.randn(k, c, fy, fx, device=device)
    bias = torch.randn(1, k, 1, 1, device=device)
    output = torch.full((on, oc, oh, ow), float("nan"), device=device)

    # Create the fusion plan, then add the convolution, bias and activation operators.
    _, fuse_plan_desc = miopenCreateFusionPlan(miopenVerticalFusion, input_desc)
    _, fusion_args = miopenCreateOperatorArgs()
    _, conv_op = miopenCreateOpConvForward(fuse_plan_desc, conv_desc, weights_desc)
    _, bias_op = miopenCreateOpBiasForward(fuse_plan_desc, bias_desc)
    _, activ_op = miopenCreateOpActivationForward(fuse_plan_desc, miopenActivationRELU)

    status = miopenCompileFusionPlan(handle, fuse_plan_desc)
    if status != miopenStatusSuccess:
        print("Fusion plan not supported:", miopenGetLastErrorString())
        return 1

    alpha, beta = 1.0, 0.0
    activ_alpha, activ_beta, activ_gamma = 0.0, 0.0, 0.0
    miopenSetOpArgsConvForward(fusion_args, conv_op, alpha, beta, weights)
    miopenSetOpArgsActivForward(fusion_args, activ_op, alpha, beta, activ_alpha, activ_beta, activ_gamma)
    miopenSetOpArgsBiasForward(fusion_args, bias_op, alpha, beta, bias)

    # Execute several times with new inputs (and once with new weights): no recompile needed.
    worst = 0.0
    for it in range(3):
        x.copy_(torch.randn_like(x))
        if it == 2:
            weights = torch.randn_like(weights)
            miopenSetOpArgsConvForward(fusion_args, conv_op, alpha, beta, weights)
        status = miopenExecuteFusionPlan(handle, fuse_plan_desc, input_desc, x, output_desc, output, fusion_args)
        if status != miopenStatusSuccess:
            print("Execution failed:", miopenGetLastErrorString())
            return 1
        ref = torch.relu(torch.nn.functional.conv2d(x.double(), weights.double(), bias.flatten().double(), padding=1))
        worst = max(worst, ((output.double() - ref).norm() / ref.norm()).item())

    miopenDestroyFusionPlan(fuse_plan_desc)
    miopenDestroyOperatorArgs(fusion_args)
    for desc in (input_desc, weights_desc, bias_desc, output_desc):
        miopenDestroyTensorDescriptor(desc)
    miopenDestroyConvolutionDescriptor(conv_desc)
    miopenDestroy(handle)
    ok = worst < 1e-5
    print(f"conv+bias+ReLU on {device}: relative error {worst:.2e} ({'PASSED' if ok else 'FAILED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
