"""Stage 1 (DESIGN §2): exact acceptance labels for target samples, BERT-style mixing, cached draft features.

`acchead-gen-data` (data_gen.cli) writes the on-disk format that `train/` reads (README, "The gen-data
format"); the math of one batch is in data_gen.labeler, prompt sources in data_gen.prompts, resumable
output in data_gen.shards.
"""
