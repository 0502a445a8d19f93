"""The lean decoder's C++ kernels (``lean_kernels.cpp`` beside this file), built for this CPU's own instructions.

Why a build of our own: the products a decode step needs (one to a few dozen rows over every weight)
run fastest as one stream over the weight, which neither torch's plain ``linear`` nor oneDNN's packed
product does at one row; and the small per-row operations cost more in dispatch than in arithmetic.
`make setup` builds the extension once (``python -m ooospec.models.lean_kernels``, about a minute), into the
virtual environment, keyed by the source's hash; a later import loads it. The compiler flags make
the build this machine's: ``-march=native`` picks avx512_bf16 products where the CPU has them, AVX2
fp32 products otherwise (`products` says which run), ``-ffp-contract=off`` keeps every sum as written.
"""

from __future__ import annotations

import hashlib
import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("lean_kernels.cpp")
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]


def build_directory() -> Path:
    """Where the build lives: inside the running environment, one folder per source and flags."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:12]
    return Path(sys.prefix) / "ooospec-kernels" / key


@lru_cache(maxsize=1)
def lean_kernels() -> ModuleType:
    """The built extension (built here first if this environment has none for this source)."""
    from torch.utils.cpp_extension import load

    folder = build_directory()
    folder.mkdir(parents=True, exist_ok=True)
    return load(name=f"ooospec_lean_{folder.name}", sources=[str(SOURCE)], extra_cflags=FLAGS,
                extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False)


if __name__ == "__main__":
    module = lean_kernels()
    print(f"lean kernels: {build_directory()} (products: bf16 {module.products('bfloat16')}, "
          f"fp32 {module.products('float32')})")
