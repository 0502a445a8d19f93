"""Everything that trains or traces, run once per profile and frozen for the benchmark.

`teacher` greedily traces calls with the teacher model; `lora` is LoRA supervised fine-tuning
(completion-only loss, shared-prefix branches, checkpoints, loss curves); `sidecar` is the sidecar
stage (kept calls -> slot rows -> LoRA -> dev check -> frozen adapter); `tool_lora` trains the
SmolLM2 target's tool-calling adapter. The frozen adapters' file format is
`ooospec.models.adapters`, which inference reads without importing this package.
"""
