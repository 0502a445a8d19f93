"""OoO-Spec reference artifact.

Every notebook is a thin caller of this package. Layers, each importing only those below it:
`ooospec.bench` (method variants, runner, summaries, figures) -> `ooospec.decoding` (the engine:
tree, verifier, loop, draft sources) and `ooospec.training` (teacher traces, LoRA training) ->
`ooospec.sidecar` (slot rows, predictor protocol, predictor, service) -> `ooospec.models`
(profiles, loading, targets, surface formats, frozen adapters) -> `ooospec.data` (Request
records). `paths` and `stage` are shared by all of them.
"""

__version__ = "0.1.0"

import warnings

# Notebooks run under papermill without ipywidgets: tqdm falls back to text bars, which is what we
# want in the book; its warning about the missing widget library would only clutter every chapter.
warnings.filterwarnings("ignore", message="IProgress not found")
