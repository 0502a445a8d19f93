"""The sidecar, model side: slot-wave prediction with a LoRA-adapted small LM.

`predictor.SlotPredictor` answers a request's slot rows in one batched generation and
`join.join_rows` turns the answers into the compact semantic call; `training` builds, trains and
freezes the adapter (a keyed stage, or the committed adapter of the same config); `metrics` scores
waves against reference calls; `latency` times the wave against the target; `sweep` measures how
many decoder layers the base needs; `base` loads the profile's sidecar base; `tiny` builds a
random model for tests and smoke runs. The asynchronous service around the predictor is
`service` (the OoO-Spec runtime's).
"""
