"""Stage 1 (DESIGN §2): exact acceptance labels for target samples, BERT-style mixing, cached draft features.

`acchead-gen-data` (acchead.data_gen.cli) writes the on-disk format that `train/` reads (README, "The
gen-data format"); the math of one batch is in acchead.data_gen.labeler, prompt sources in
acchead.data_gen.prompts, resumable output in acchead.data_gen.shards.
"""
