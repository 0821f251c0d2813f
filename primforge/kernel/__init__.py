"""XLACustomKernel: one named primitive, kernels registered per backend and platform."""
