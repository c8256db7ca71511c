"""Image transforms: crop/flip parameter sampling, CPU tensor ops, presets, batched GPU kernels."""
