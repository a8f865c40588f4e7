"""Stage 2: train acceptance heads on acchead-gen-data output (`acchead-train`, `acchead-sweep`), and
replay stop rules on its labels (`acchead-headroom`).

Modules: `data` (read and validate a gen-data directory), `datamodule` (batches and the by-prompt split),
`draft` (the frozen draft for on-the-fly features), `metrics` (torchmetrics and the best constant),
`module` (the LightningModule), `settings` / `fit` (one run), `cli`, `sweep`, `headroom`, `bench_features`.
Imports `acchead` only, never `data_gen` or `inference`.
"""
