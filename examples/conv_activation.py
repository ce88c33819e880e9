"""The seeds' second example (the CBAInfer driver's): convolution + ReLU, ported line for line,
including the loop that executes the compiled plan again and again.

Run: python examples/conv_activation.py   (GPU if there is one, else the CPU)
"""

import sys
import time

import torch

from fusionplan.miopen import *  # noqa: F403 -- the MIOpen names, as C code has them

iters = 10


def GetHandle():
    return handle


def main() -> int:
    global handle
    _, handle = miopenCreate()
    device = "cuda" if torch.cuda.is_available() else "cpu"

    _, inputTensor = miopenCreateTensorDescriptor()
    miopenSet4dTensorDescriptor(inputTensor, miopenFloat, 4, 16, 28, 28)
    _, weightTensor = miopenCreateTensorDescriptor()
    miopenSet4dTensorDescriptor(weightTensor, miopenFloat, 32, 16, 3, 3)
    _, convDesc = miopenCreateConvolutionDescriptor()
    miopenInitConvolutionDescriptor(convDesc, miopenConvolution, 1, 1, 1, 1, 1, 1)
    _, n, c, h, w = miopenGetConvolutionForwardOutputDim(convDesc, inputTensor, weightTensor)
    _, outputTensor = miopenCreateTensorDescriptor()
    miopenSet4dTensorDescriptor(outputTensor, miopenFloat, n, c, h, w)
    activ_alpha, activ_beta, activ_gamma = 0.0, 0.0, 0.0

    in_dev = torch.randn(4, 16, 28, 28, device=device)
    wei_dev = torch.randn(32, 16, 3, 3, device=device)
    out_dev = torch.full((n, c, h, w), float("nan"), device=device)

    _, fusePlanDesc = miopenCreateFusionPlan(miopenVerticalFusion, inputTensor)
    _, fusionArgs = miopenCreateOperatorArgs()

    alpha, beta = 1.0, 0.0
    _, convoOp = miopenCreateOpConvForward(fusePlanDesc, convDesc, weightTensor)
    _, activOp = miopenCreateOpActivationForward(fusePlanDesc, miopenActivationRELU)
    miopenError = miopenCompileFusionPlan(GetHandle(), fusePlanDesc)
    if miopenError != miopenStatusSuccess:
        print("ConvBiasActivInference plan not supported.", miopenGetLastErrorString(), file=sys.stderr)
        return 1

    miopenSetOpArgsConvForward(fusionArgs, convoOp, alpha, beta, wei_dev)
    miopenSetOpArgsActivForward(fusionArgs, activOp, alpha, beta, activ_alpha, activ_beta, activ_gamma)

    times = []
    for _ in range(iters):
        start = time.perf_counter()
        status = miopenExecuteFusionPlan(
            GetHandle(), fusePlanDesc, inputTensor, in_dev, outputTensor, out_dev, fusionArgs
        )
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if status != miopenStatusSuccess:
            print("Execution failed:", miopenGetLastErrorString(), file=sys.stderr)
            return 1

    ref = torch.relu(torch.nn.functional.conv2d(in_dev.double(), wei_dev.double(), padding=1))
    err = ((out_dev.double() - ref).norm() / ref.norm()).item()
    ok = err < 1e-5
    print(
        f"conv+ReLU on {device}: {iters} executions, median {sorted(times)[iters // 2] * 1e3:.3f} ms, "
        f"relative error {err:.2e} ({'PASSED' if ok else 'FAILED'})"
    )
    miopenDestroyFusionPlan(fusePlanDesc)
    miopenDestroyOperatorArgs(fusionArgs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
