"""acchead.distill: train a draft for a target by distillation on the target's own responses.

Stage four beside data_gen, train and inference: it imports the `acchead` core and none of the other
stages. `acchead-distill responses` generates the training text (`responses`); the draft model and its
training live beside it; `average` averages drafts' weights (a model soup).
"""
