"""Without a GPU, Triton kernels run through Triton's interpreter. Triton reads the flag when it
is first imported (its own library functions are decorated then), so it is set here, before any
test module imports it. The CPU solver still comes first on CPU handles; tests that want the
Triton kernels ask for them with FUSIONPLAN_BACKEND=triton."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
