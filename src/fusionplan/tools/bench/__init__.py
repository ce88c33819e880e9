"""The benchmark suite behind ``fusionplan-bench``: cases, timing, reports."""
