"""OoO-Spec reference artifact.

Every notebook is a thin caller of this package. Layers, each importing only those below it:
`ooospec.reproduce` (the time plan, the Ray sweep) -> `ooospec.studies` (measurements around a
run) -> `ooospec.report` (tables, intervals, figures) -> `ooospec.bench` (the harness: methods by
name, plan, runner, records) -> `ooospec.training` (teacher traces, LoRA training) ->
`ooospec.decoding` (the engine: tree, verifier, loop, draft sources) -> `ooospec.sidecar` (slot
rows, predictor protocol, predictor, service) -> `ooospec.models` (profiles, loading, targets,
surface formats, frozen adapters) -> `ooospec.data` (Request records). `paths`, `stage`,
`progress` and `provenance` are shared by all of them.
"""

__version__ = "0.1.0"

import warnings

from ooospec.progress import quiet_library_bars

# Progress bars are off in notebooks (`ooospec.progress`), the Hugging Face libraries' included; a
# library's tqdm.auto bar would still warn about the missing widget library in every chapter.
quiet_library_bars()
warnings.filterwarnings("ignore", message="IProgress not found")
