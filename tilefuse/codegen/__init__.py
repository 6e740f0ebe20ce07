"""Code generation: kernel source text per scheduled group (Triton for the generated families)."""
