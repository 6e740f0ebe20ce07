"""Vendor library calls: a contraction prim run through torch (cuBLAS/cuDNN on a GPU, BLAS on a
CPU), as the ``library`` family builds it (``torch_call.library_kernel``)."""
