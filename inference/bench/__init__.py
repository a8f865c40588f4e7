"""`acchead-bench`: the measurement of the decoders, kept apart from them.

`run` (the runner and `main`), `config` (flags, YAML and the settings grid), `prompts`, `report`
(results.json, pareto.png, report.md), `costmodel` (the t_draft/t_target fit, eq. 2.3), `hf_assisted`
(transformers' assisted generation, counted) and `head_timing`. These modules import the decoders; the
decoders (`acchead.inference.*` outside this package) never import them.
"""
