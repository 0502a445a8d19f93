"""The sidecar: a small LoRA-adapted LM that predicts a request's call slot by slot, off the decode path.

`slots` is its row format (a call -> function-index / argument-or-null / direct-call rows);
`predictor.SlotPredictor` answers a request's rows in one batched generation and `join.join_rows`
turns the answers into the compact semantic call; `metrics` scores waves against reference calls;
`latency` times the wave
against the target; `base_model` loads the profile's sidecar base. `protocol` is all the asynchronous
`service` knows of a predictor; `specs` writes the recipes of the trained sidecar, the oracle and
the fault injectors (`oracle`). Training the adapter is `ooospec.training.sidecar`.
"""
