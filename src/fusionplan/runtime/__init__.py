"""What the solvers share to render, compile, tune and launch kernels."""
