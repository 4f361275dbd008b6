"""Performance tooling: step benchmarks (bench/), ahead-of-time TPU pricing (aot.py,
kernel_cost.py, op_costs.py), synthetic batches and run metadata."""
