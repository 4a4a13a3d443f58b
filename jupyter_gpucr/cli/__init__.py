"""The gpucr command line: processes, kernels of a running server, and the doctor."""
