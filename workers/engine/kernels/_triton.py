"""Triton import guard: kernels are defined at import when triton is available.

Set `TRITON_INTERPRET=1` before importing the kernels to run them on CPU (tests do).
"""

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - triton ships with the pinned torch on Linux
    triton = None
    HAS_TRITON = False

    class tl:  # noqa: N801 - stands in for triton.language so kernel annotations still parse
        constexpr = None


def next_pow2(n: int) -> int:
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def jit(fn):
    """`triton.jit` when triton is importable, otherwise leave the function undefined-to-launch."""
    return triton.jit(fn) if HAS_TRITON else fn
