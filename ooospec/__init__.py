"""OoO-Spec reference artifact.

Every notebook is a thin caller of this package: data loaders (`ooospec.data`), model profiles
and surface formats (`ooospec.models`), teacher traces, slot rows and sidecar training
(`ooospec.teacher`, `ooospec.slots`, `ooospec.train`), the decoding engine
(`ooospec.decoding`), the benchmark (`ooospec.bench`) and figures (`ooospec.plots`).
"""

__version__ = "0.1.0"

import warnings

# Notebooks run under papermill without ipywidgets: tqdm falls back to text bars, which is what we
# want in the book; its warning about the missing widget library would only clutter every chapter.
warnings.filterwarnings("ignore", message="IProgress not found")
