"""Shared test set-up: one torch thread (the CI box has 2 cores) and tiny random models built locally."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
