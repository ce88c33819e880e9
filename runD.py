import sys, torch, fusionplan as fp
from fusionplan import tuning
from fusionplan.testing import add_chain, random_args, reference_output
cases = [((7, 7), (16, 4)), ((7, 7), (8, 8)), ((14, 14), (16, 8)), ((13, 11), (4, 16)), ((28, 28), (32, 4))]
for hw, tile in cases:
    for stages in (1, 2, 3, 4):
        for bn in (64, 128):
            tuning.window_shape = lambda oh, ow, pixels, tile=tile: tile
            torch.manual_seed(0)
            x = torch.randn(3, 128, *hw, device="cuda").half().to(memory_format=torch.channels_last)
            plan = add_chain(fp.FusionPlan(fp.TensorDescriptor.from_tensor(x)), "CA", conv=fp.ConvolutionDescriptor((1, 1)), k=128, r=3, s=3, param_dtype="half")
            # identity activation would be nicer; CA with relu default
            h = fp.Handle("cuda")
            plan.compile(h, solver="triton-window")
            plan._entry(h).kernel.config = tuning.ConvConfig(tile[0] * tile[1], bn, 64, 8, 4, stages)
            args = random_args(plan, "cuda", param_dtype=torch.float32)
            y = torch.full(plan.output_desc.dims, float("nan"), dtype=torch.float16, device="cuda").to(memory_format=torch.channels_last)
            plan.execute(h, x, y, args)
            ref = reference_output(plan, x, args).to("cuda")
            err = (y.double() - ref).abs()
            bad = err > 0.05 * ref.abs().clamp(min=0.5)
            nan = torch.isnan(y)
            where = bad.nonzero()
            desc = ""
            if where.numel():
                desc = f"n {sorted(set(where[:,0].tolist()))} k {sorted(set(where[:,1].tolist()))[:6]}.. oh {sorted(set(where[:,2].tolist()))} ow {sorted(set(where[:,3].tolist()))}"
            print(f"hw {hw} tile {tile} stages {stages} bn {bn}: bad {int(bad.sum())}/{bad.numel()} nan {int(nan.sum())} {desc}", flush=True)
