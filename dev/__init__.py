"""Maintainers' instruments, not part of the product (not in the wheel): the GPU-session driver, the static
CUDA instruction counter and the AVX2 instruction-count driver. Run from a checkout; the tests import
`dev.cuda_sass_count` as an ordinary module (the repository root is on sys.path, tests/conftest.py)."""
