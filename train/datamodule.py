"""Batches for head training: flat position batches from the feature cache, or sequence batches for the
on-the-fly mode, with the train/validation split by prompt.

Batch semantics:
- cached features: a batch is `batch_size` Y-positions drawn uniformly without replacement from all training
  prompts (the features are i.i.d.-like once computed, and fixed-size batches give a steady optimiser);
- on the fly: a batch is `batch_sequences` rows (the paper's "32 sequences"); the draft runs over them in the
  training step and the loss averages over their Y-positions.

Each loader yields whole batches from a sampler of index arrays (`batch_size=None` in the DataLoader), so a
cached batch is one fancy-indexing read of the memory map. The samplers shard across DDP ranks themselves
(`use_distributed_sampler=False` in the Trainer) and reshuffle per epoch from (seed, epoch), which makes a
resumed run draw the same batches as an uninterrupted one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from acchead.lookahead import assemble_inputs, candidate_stats, feature_logprobs, needs_stats
from acchead.sampling import SamplingConfig
from acchead.train.data import GenData, split_by_prompt


class IndexBatches(Sampler[np.ndarray]):
    """Yields index arrays (batches) over `items`, this rank's share of each epoch.

    Training (`shuffle=True`): a (seed, epoch) permutation, padded by wrap-around to a multiple of
    `world_size` like DistributedSampler so every rank runs the same number of steps (DDP would hang
    otherwise). Evaluation (`shuffle=False`): a strided, unpadded shard, so each item is scored exactly once.
    """

    def __init__(
        self,
        items: np.ndarray,
        batch_size: int,
        shuffle: bool,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.items = items
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.served = 0  # batches of the current epoch handed out so far
        self._resume: tuple[int, int] | None = None  # (epoch, batches already trained) from a checkpoint

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning at the start of every epoch."""
        self.epoch = epoch

    def _shard(self) -> np.ndarray:
        items = self.items
        if self.shuffle:
            rng = np.random.default_rng([self.seed, self.epoch])
            items = items[rng.permutation(len(items))]
            pad = -len(items) % self.world_size
            items = np.concatenate([items, items[:pad]])
        return items[self.rank :: self.world_size]

    def state_dict(self) -> dict[str, int]:
        """Where this epoch stands; saved in checkpoints through `ResumableLoader`."""
        return {"epoch": self.epoch, "served": self.served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume: the next iteration of epoch `state["epoch"]` skips the batches already served."""
        self._resume = (int(state["epoch"]), int(state["served"]))

    def __iter__(self) -> Iterator[np.ndarray]:
        shard = self._shard()
        skip = self._resume[1] if self._resume is not None and self._resume[0] == self.epoch else 0
        self._resume, self.served = None, skip
        for start in range(skip * self.batch_size, len(shard), self.batch_size):
            self.served += 1
            yield shard[start : start + self.batch_size]

    def __len__(self) -> int:
        n = len(self.items)
        per_rank = (
            math.ceil(n / self.world_size) if self.shuffle else len(range(self.rank, n, self.world_size))
        )
        return math.ceil(per_rank / self.batch_size)


class ResumableLoader(DataLoader):
    """The training DataLoader, checkpointed with its position in the epoch (Lightning's `_Stateful`).

    Lightning saves `state_dict()` in every checkpoint and hands it back on resume, so a run resumed from a
    mid-epoch checkpoint continues with the first batch it had not trained on, exactly as an uninterrupted
    run would. Batches are served without prefetching (the loader is sized), so the count is exact.
    """

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()  # type: ignore[union-attr]

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.load_state_dict(state)  # type: ignore[union-attr]


class CachedPositions(Dataset):
    """Item = a batch of positions (index array) -> `{"features": (N, D), "labels", "hard": (N,)}`.

    D = H for a state-only head (the cached float16 states as they are); a lookahead head with more inputs
    gets them assembled here (`acchead.lookahead.assemble_inputs`, float32). Log q and the entropy need the
    (N, V) logits of every state; they are computed once here, not in every batch of every epoch.
    """

    def __init__(self, data: GenData, inputs: tuple[str, ...] = ("state",)) -> None:
        assert data.features is not None and data.feature_index is not None
        self.data = data
        self.inputs = tuple(inputs)
        if self.inputs != ("state",):
            assert data.token_embeddings is not None and data.candidate is not None
            self.out_emb = torch.from_numpy(data.token_embeddings)
            # A reduced-vocabulary draft's logits are -inf outside its head rows, where the token table
            # (acchead.models.output_embedding_table) holds zeros: `state @ out_emb.T` would give 0 there,
            # so those columns are set to -inf, as the draft's own forward makes them.
            reduced = needs_stats(inputs) and data.config.get("draft", {}).get("head_rows")
            self.outside = (self.out_emb == 0).all(dim=1) if reduced else None
            self.stats = self._stats(SamplingConfig.from_dict(data.sampling)) if needs_stats(inputs) else None

    def _stats(self, sampling: SamplingConfig, chunk: int = 2048) -> torch.Tensor:
        """(N, W) `candidate_stats` of every position, in position order, from its cached state.

        A chunk holds (chunk, V) float32 logits and their log-softmax: 2048 rows of the real pair's 49,152
        columns are ~0.8 GB at the peak (16,384 rows took ~6 GB of RSS, enough to push a draft's training
        run beside it out of a 23 GB box)."""
        d, out = self.data, []
        for s in range(0, len(d.labels), chunk):
            rows = d.feature_index[s : s + chunk]
            state = torch.from_numpy(np.ascontiguousarray(d.features[rows])).float()
            logits = state @ self.out_emb.T  # (n, V)
            if self.outside is not None:
                logits[:, self.outside] = float("-inf")
            token = torch.from_numpy(d.candidate[s : s + chunk])
            out.append(candidate_stats(feature_logprobs(logits, sampling), token, self.inputs))
        return torch.cat(out)

    def __len__(self) -> int:
        return len(self.data.labels)

    def __getitem__(self, idx: np.ndarray) -> dict[str, torch.Tensor]:
        idx = np.sort(idx)  # ascending cache rows: the memory map is read front to back
        if "state" in self.inputs:
            rows = self.data.feature_index[idx]
            feats = torch.from_numpy(np.ascontiguousarray(self.data.features[rows]))  # (N, H) float16
        else:  # the head reads only what `_stats` computed once: no state is read from the memory map
            feats = torch.empty(len(idx), 0)
        if self.inputs != ("state",):
            token = torch.from_numpy(self.data.candidate[idx])
            stats = None if self.stats is None else self.stats[torch.from_numpy(idx)]
            depth = torch.from_numpy(self.data.depth[idx]) if "depth" in self.inputs else None
            feats = assemble_inputs(self.inputs, feats, token, self.out_emb, stats, depth)
        return {
            "features": feats,
            "labels": torch.from_numpy(self.data.labels[idx]),
            "hard": torch.from_numpy(self.data.hard[idx]),
        }


class SequenceRows(Dataset):
    """Item = a batch of rows (an index array), right-padded for the draft's forward.

    Returns `{"input_ids", "attention_mask": (B, T) long, "target_mask": (B, T) bool (True at the input
    index whose state the head reads: Z_i's, prompt_len + i, for a candidate head; the one before it for
    a lookahead head), "labels": (B, T) float32, "hard": (B, T) bool, "candidates": (B, T) long (Y_i at
    those indices; lookahead only)}`.
    """

    def __init__(self, data: GenData, pad_id: int = 0) -> None:
        self.data = data
        self.pad_id = pad_id
        # Y-positions grouped by row: positions of row r are slice(bounds[r], bounds[r + 1]).
        self.bounds = np.searchsorted(data.row, np.arange(data.num_rows + 1))

    def __len__(self) -> int:
        return self.data.num_rows

    def __getitem__(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        d = self.data
        width = max(len(d.tokens[r]) for r in rows)
        out = {
            "input_ids": torch.full((len(rows), width), self.pad_id, dtype=torch.long),
            "attention_mask": torch.zeros(len(rows), width, dtype=torch.long),
            "target_mask": torch.zeros(len(rows), width, dtype=torch.bool),
            "labels": torch.zeros(len(rows), width, dtype=torch.float32),
            "hard": torch.zeros(len(rows), width, dtype=torch.bool),
        }
        if d.candidate is not None:
            out["candidates"] = torch.zeros(len(rows), width, dtype=torch.long)
        for b, r in enumerate(rows):
            tokens = d.tokens[r]
            out["input_ids"][b, : len(tokens)] = torch.from_numpy(tokens)
            out["attention_mask"][b, : len(tokens)] = 1
            sl = slice(self.bounds[r], self.bounds[r + 1])
            cols = torch.from_numpy(d.prompt_len[r] + d.position[sl] + d.state_shift)
            out["target_mask"][b, cols] = True
            if d.candidate is not None:
                out["candidates"][b, cols] = torch.from_numpy(d.candidate[sl])
            out["labels"][b, cols] = torch.from_numpy(d.labels[sl])
            out["hard"][b, cols] = torch.from_numpy(d.hard[sl])
        return out


class GenDataModule(L.LightningDataModule):
    """Train/validation loaders over a loaded gen-data directory.

    Args:
        data: the loaded directory (`acchead.train.data.load_gen_data`).
        val_fraction: share of prompts held out for validation.
        seed: seed of the split and of the per-epoch shuffles.
        batch_size: Y-positions per batch (cached mode).
        batch_sequences: rows per batch (on-the-fly mode).
        eval_batch_size: positions per evaluation batch (cached mode; evaluation has no gradient).
        inputs: the head's inputs (`acchead.lookahead`); more than ("state",) only for lookahead heads.
    """

    def __init__(
        self,
        data: GenData,
        val_fraction: float = 0.1,
        seed: int = 0,
        batch_size: int = 1024,
        batch_sequences: int = 32,
        eval_batch_size: int = 16384,
        inputs: tuple[str, ...] = ("state",),
    ) -> None:
        super().__init__()
        self.data = data
        self.batch_size = batch_size
        self.batch_sequences = batch_sequences
        self.eval_batch_size = eval_batch_size
        self.seed = seed
        self.val_rows = split_by_prompt(data.prompt_index, val_fraction, seed)
        self.val_fraction = val_fraction
        cached = data.mode == "cached"
        self.dataset: Dataset = CachedPositions(data, inputs) if cached else SequenceRows(data)
        # Items are positions (cached) or rows (on the fly); each split is a sorted array of item ids.
        item_is_val = self.val_rows[data.row] if cached else self.val_rows
        self.items = {"train": np.flatnonzero(~item_is_val), "val": np.flatnonzero(item_is_val)}
        pos_is_val = self.val_rows[data.row]
        self.split_labels = {"train": data.labels[~pos_is_val], "val": data.labels[pos_is_val]}

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _loader(self, split: str, train: bool) -> DataLoader:
        rank, world = self._rank()
        if self.data.mode == "cached":
            size = self.batch_size if train else self.eval_batch_size
        else:
            size = self.batch_sequences
        sampler = IndexBatches(
            self.items[split], size, shuffle=train, seed=self.seed, rank=rank, world_size=world
        )
        loader = ResumableLoader if train else DataLoader
        return loader(self.dataset, sampler=sampler, batch_size=None, num_workers=0)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", train=False)

    def eval_dataloaders(self) -> list[DataLoader]:
        """Unshuffled loaders of [val, train] for the final evaluation of both splits."""
        return [self._loader("val", train=False), self._loader("train", train=False)]

    def summary(self) -> dict[str, int | float]:
        """Sizes of the split, for metrics.json and the head's metadata."""
        return {
            "val_fraction": self.val_fraction,
            "split_seed": self.seed,
            "train_prompts": len(np.unique(self.data.prompt_index[~self.val_rows])),
            "val_prompts": len(np.unique(self.data.prompt_index[self.val_rows])),
            "train_positions": len(self.split_labels["train"]),
            "val_positions": len(self.split_labels["val"]),
        }
