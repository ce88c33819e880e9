"""The fuzzer: random plans through every API and solver, checked against a float64 numpy oracle."""
