"""Stage 1 (DESIGN §2): exact acceptance labels for target samples, BERT-style mixing, cached draft features.

`acchead-gen-data` (acchead.data_gen.cli) writes the on-disk format that `train/` reads (README, "The
gen-data format"); the math of one batch is in acchead.data_gen.labeler, prompt sources in
acchead.data_gen.prompts, responses sampled elsewhere (`--responses`) in acchead.data_gen.responses, each
process's GPUs for a sharded target in acchead.data_gen.placement, resumable output in
acchead.data_gen.shards.
"""
