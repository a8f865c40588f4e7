"""Reading and validating an `acchead-gen-data` directory (the format: README, "The gen-data format").

Everything the trainer needs is flattened here into per-Y-position arrays (label, feature row, row id,
position) plus per-row token lists for the on-the-fly mode, so the datasets in `acchead.train.datamodule` are
thin views. Every way the directory can be wrong is one `AccheadError` line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from acchead.errors import AccheadError

FORMAT = "acchead-gen-data"
VERSION = 1
COLUMNS = ("prompt_index", "prompt_ids", "mixed_ids", "from_draft", "accept_prob", "feature_offset")
# Hard labels (the realised accept/reject events for AUROC and calibration) come from this fixed seed, not
# the training seed, so runs with different seeds are scored against the same events.
HARD_LABEL_SEED = 20240601

FeatureMode = Literal["cached", "on-the-fly", "auto"]
HeadKind = Literal["candidate", "lookahead"]


@dataclass
class GenData:
    """A loaded gen-data directory, flattened to its Y-positions (the positions the loss counts).

    Attributes (R rows, N Y-positions, H draft hidden size):
        path: the directory.
        config: gen_config.json.
        mode: "cached" or "on-the-fly" (resolved from the requested mode).
        hidden_size: H, the head's input width.
        prompt_index: (R,) int64, the prompt each row answers (the unit of the train/val split).
        row: (N,) int64, the row of each Y-position.
        position: (N,) int64, index i of Z_i in the response.
        labels: (N,) float32, P_i = min(1, p_i(Y_i)/q_i(Y_i)).
        hard: (N,) bool, a Bernoulli(P_i) draw with HARD_LABEL_SEED: the realised accept event.
        feature_index: (N,) int64 row of features.npy, or None in on-the-fly mode.
        features: (P, H) float16 memory map of features.npy, or None in on-the-fly mode.
        tokens: per row, prompt_ids + mixed_ids (int64 arrays), filled in on-the-fly mode only.
        prompt_len: (R,) int64, len(prompt_ids) per row; Z_i sits at input index prompt_len + i.
        kind: the head kind the positions are for. "candidate": the Y-positions (Z_i = Y_i), read at Z_i;
            "lookahead": every response position, read one input index earlier (the state producing q_i).
        candidate: (N,) int64 Y_i of each position (the token a lookahead head judges).
        depth: (N,) int64 the depth in its round of the candidate each label is for (`candidate_depth`).
        token_embeddings: (V, H) float32 draft output embedding (lookahead, cached mode), else None.
    """

    path: Path
    config: dict[str, Any]
    mode: str
    hidden_size: int
    prompt_index: np.ndarray
    row: np.ndarray
    position: np.ndarray
    labels: np.ndarray
    hard: np.ndarray
    prompt_len: np.ndarray
    feature_index: np.ndarray | None = None
    features: np.ndarray | None = None
    tokens: list[np.ndarray] = field(default_factory=list)
    kind: str = "candidate"
    candidate: np.ndarray | None = None
    token_embeddings: np.ndarray | None = None
    depth: np.ndarray | None = None

    @property
    def state_shift(self) -> int:
        """Input index of a position's state relative to Z_i's: 0 (candidate) or -1 (lookahead)."""
        return -1 if self.kind == "lookahead" else 0

    @property
    def sampling(self) -> dict[str, Any]:
        return self.config["sampling"]

    @property
    def draft(self) -> dict[str, Any]:
        """Identity of the draft the data was generated with (name, hidden_size, vocab_size, fingerprint)."""
        return self.config["draft"]

    @property
    def num_rows(self) -> int:
        return len(self.prompt_index)


def read_gen_config(path: str | Path) -> dict[str, Any]:
    """gen_config.json of a gen-data directory, checked for format and version."""
    path = Path(path)
    if not path.exists():
        raise AccheadError(f"data directory does not exist: {path}")
    if not path.is_dir():
        raise AccheadError(f"data path is not a directory: {path}")
    cfg_file = path / "gen_config.json"
    if not cfg_file.is_file() and (path / "gen_run.json").is_file():  # its manifest first, the config last
        raise AccheadError(f"{path} is an unfinished acchead-gen-data run: rerun its command to finish it")
    if not cfg_file.is_file():
        raise AccheadError(
            f"{path} is not an acchead-gen-data output (no gen_config.json); run acchead-gen-data"
        )
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise AccheadError(f"{cfg_file} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
        raise AccheadError(
            f"{path} is not an acchead-gen-data output (gen_config.json format is not {FORMAT!r})"
        )
    if cfg.get("version") != VERSION:
        raise AccheadError(f"{path}: gen-data version {cfg.get('version')} is not supported (need {VERSION})")
    for key in ("draft", "sampling"):
        if not isinstance(cfg.get(key), dict):
            raise AccheadError(f"{cfg_file} has no {key!r} section")
    return cfg


def same_draft(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two identity dicts name the same draft: equal fingerprint and hidden size (names are informational)."""
    return a.get("fingerprint") == b.get("fingerprint") and a.get("hidden_size") == b.get("hidden_size")


def check_draft(want: dict[str, Any], draft: dict[str, Any], what: str) -> None:
    """AccheadError unless `draft` (identity of `what`) is `want`, the draft the data was generated with."""
    if draft.get("hidden_size") != want.get("hidden_size"):
        raise AccheadError(
            f"head/draft hidden-size mismatch: {what} has hidden size {draft.get('hidden_size')}, "
            f"the data's draft {want.get('name')!r} has {want.get('hidden_size')}"
        )
    if not same_draft(draft, want):
        raise AccheadError(
            f"{what} {draft.get('name')!r} (fingerprint {draft.get('fingerprint')}) is not the draft "
            f"the data was generated with: {want.get('name')!r} (fingerprint {want.get('fingerprint')})"
        )


def _open_features(path: Path, cfg: dict[str, Any], n_positions: int, key: str = "features") -> np.ndarray:
    """Memory-map a feature cache (`key`: "features" or "lookahead_features") and check it against
    gen_config (draft, shape, dtype)."""
    feat = cfg[key]
    file = path / feat.get("file", "features.npy")
    if not file.is_file():
        raise AccheadError(f"{path}: gen_config.json lists a feature cache but {file.name} is missing")
    if isinstance(feat.get("draft"), dict) and not same_draft(feat["draft"], cfg["draft"]):
        raise AccheadError(
            f"{file} is a feature cache of another draft: {feat['draft'].get('name')!r} "
            f"(fingerprint {feat['draft'].get('fingerprint')}), but the data was generated with "
            f"{cfg['draft'].get('name')!r} (fingerprint {cfg['draft'].get('fingerprint')})"
        )
    try:
        arr = np.load(file, mmap_mode="r")
    except (ValueError, OSError) as e:
        raise AccheadError(f"cannot read feature cache {file}: {e}") from None
    if arr.ndim != 2 or arr.shape[0] != n_positions:
        raise AccheadError(
            f"{file} has shape {tuple(arr.shape)} but the data has {n_positions} draft positions; the cache "
            "belongs to another gen-data run"
        )
    if arr.shape[1] != cfg["draft"].get("hidden_size"):
        raise AccheadError(
            f"head/draft hidden-size mismatch: feature cache width {arr.shape[1]} != the draft's hidden size "
            f"{cfg['draft'].get('hidden_size')}"
        )
    return arr


def candidate_depth(prompt_len: np.ndarray, position: np.ndarray, chain: int) -> np.ndarray:
    """(N,) the depth in its round of the candidate each label is for. gen-data `--feature-chain N` labels
    response token i of a feature draft as the candidate of depth (pair index mod N), the pair that draws
    it being prompt_len + i - 2 (`acchead.feature_draft.TargetFedDraft`); without it every label is a
    first candidate's (depth 0). prompt_len, position: (N,) of each label's row and its index i."""
    if chain <= 1:
        return np.zeros(len(position), dtype=np.int64)
    return ((prompt_len + position - 2) % chain).astype(np.int64)


def load_gen_data(path: str | Path, mode: FeatureMode = "auto", kind: HeadKind = "candidate") -> GenData:
    """Load and validate a gen-data directory; flatten the positions a head of `kind` trains on.

    Args:
        path: the directory written by acchead-gen-data.
        mode: "cached" needs the kind's feature cache; "on-the-fly" keeps token ids for running the draft;
            "auto" picks cached when the directory has that cache.
        kind: "candidate" trains on the Y-positions (features.npy); "lookahead" on every response position
            (lookahead_features.npy, written by gen-data since head kinds exist).
    """
    import datasets  # deferred: importing datasets costs a second on every `--help`

    if kind not in ("candidate", "lookahead"):
        raise AccheadError(f"unknown head kind {kind!r}; choose candidate or lookahead")
    path = Path(path)
    cfg = read_gen_config(path)
    cache_key = "lookahead_features" if kind == "lookahead" else "features"
    has_cache = isinstance(cfg.get(cache_key), dict)
    if mode == "cached" and kind == "lookahead" and not has_cache and isinstance(cfg.get("features"), dict):
        raise AccheadError(
            f"{path} was written before lookahead heads existed (no lookahead_features.npy); rerun "
            "acchead-gen-data, or use --features on-the-fly"
        )
    if mode == "auto":
        mode = "cached" if has_cache else "on-the-fly"
    if mode == "cached" and not has_cache:
        raise AccheadError(f"{path} has no feature cache; use --features on-the-fly (runs the draft)")
    if mode not in ("cached", "on-the-fly"):
        raise AccheadError(f"unknown feature mode {mode!r}")
    try:
        ds = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError; a cut file an OSError
        raise AccheadError(
            f"{path} is not an acchead-gen-data output (cannot load the dataset: {str(e).splitlines()[0]})"
        ) from None
    if not isinstance(ds, datasets.Dataset):
        raise AccheadError(f"{path} holds a DatasetDict, not a gen-data Dataset")
    missing = [c for c in COLUMNS if c not in ds.column_names]
    if missing:
        raise AccheadError(
            f"{path} is not an acchead-gen-data output (missing columns: {', '.join(missing)})"
        )

    table = ds.with_format("arrow")[:]  # a pyarrow Table; list columns flatten without Python loops
    from_draft_col = table.column("from_draft").combine_chunks()
    lengths = from_draft_col.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64)
    from_draft = from_draft_col.flatten().to_numpy(zero_copy_only=False).astype(bool)
    probs = table.column("accept_prob").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    if len(probs) != len(from_draft):
        raise AccheadError(f"{path}: accept_prob and from_draft have different lengths in some row")
    num_rows = len(lengths)
    row_all = np.repeat(np.arange(num_rows, dtype=np.int64), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    pos_all = np.arange(len(from_draft), dtype=np.int64) - starts[row_all]

    # A lookahead head judges Y_i at every position (its state never saw Z_i); a candidate head only
    # where Z_i = Y_i was fed.
    keep = np.ones_like(from_draft) if kind == "lookahead" else from_draft
    row, position = row_all[keep], pos_all[keep]
    labels = np.asarray(probs, dtype=np.float32)[keep]
    if len(labels) == 0:
        if kind == "candidate":  # a lookahead head trains on every position, so this is the usual cause
            raise AccheadError(
                f"{path} has no draft positions for a candidate head (gen-data ran with --mix-ratio 1): "
                "train --kind lookahead (the default), or regenerate with --mix-ratio 0.15"
            )
        raise AccheadError(f"{path} has no positions to train on")
    candidate = None
    if kind == "lookahead":
        if "draft_ids" not in ds.column_names:
            raise AccheadError(f"{path} has no draft_ids column; a lookahead head needs each Y_i")
        candidate = table.column("draft_ids").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        candidate = candidate.astype(np.int64)
    if not np.all(np.isfinite(labels)) or labels.min() < 0 or labels.max() > 1:
        raise AccheadError(f"{path}: accept_prob values outside [0, 1]")
    hard = np.random.default_rng(HARD_LABEL_SEED).random(len(labels)) < labels
    prompt_len = table.column("prompt_ids").combine_chunks().value_lengths().to_numpy(zero_copy_only=False)

    data = GenData(
        path=path,
        config=cfg,
        mode=mode,
        hidden_size=int(cfg["draft"]["hidden_size"]),
        prompt_index=table.column("prompt_index").to_numpy().astype(np.int64),
        row=row,
        position=position,
        labels=labels,
        hard=hard,
        prompt_len=prompt_len.astype(np.int64),
        kind=kind,
        candidate=candidate,
    )
    data.depth = candidate_depth(prompt_len.astype(np.int64)[row], position, int(cfg.get("feature_chain", 1)))
    if mode == "cached" and kind == "lookahead":
        data.features = _open_features(path, cfg, len(labels), cache_key)
        data.feature_index = np.arange(len(labels), dtype=np.int64)  # one state per position, in order
        emb_file = path / cfg[cache_key].get("token_embeddings", "token_embeddings.npy")
        try:
            data.token_embeddings = np.load(emb_file).astype(np.float32)
        except (ValueError, OSError) as e:
            raise AccheadError(f"cannot read {emb_file}: {e}") from None
        if data.token_embeddings.ndim != 2 or data.token_embeddings.shape[1] != data.hidden_size:
            raise AccheadError(f"{emb_file} has shape {data.token_embeddings.shape}, expected (V, H)")
    elif mode == "cached":
        data.features = _open_features(path, cfg, len(labels))
        offsets = table.column("feature_offset").to_numpy().astype(np.int64)
        # k-th Y-position of a row reads cache row feature_offset + k.
        first = np.concatenate([[0], np.flatnonzero(np.diff(row)) + 1])
        rank = np.arange(len(row)) - np.repeat(first, np.diff(np.append(first, len(row))))
        data.feature_index = offsets[row] + rank
        if offsets[row].min() < 0 or data.feature_index.max() >= len(labels):
            raise AccheadError(f"{path}: feature_offset does not index features.npy (stale or foreign cache)")
    else:
        prompts = table.column("prompt_ids").to_pylist()
        mixed = table.column("mixed_ids").to_pylist()
        if any(len(m) != n for m, n in zip(mixed, lengths, strict=True)):
            raise AccheadError(f"{path}: mixed_ids and from_draft have different lengths in some row")
        data.tokens = [np.asarray(p + m, dtype=np.int64) for p, m in zip(prompts, mixed, strict=True)]
    return data


def split_by_prompt(prompt_index: np.ndarray, val_fraction: float, seed: int) -> np.ndarray:
    """(R,) bool, True for rows in the validation split: a seeded random `val_fraction` of the prompts.

    Splitting by prompt, not by position or row, keeps every position of a prompt on one side, so the
    validation numbers are about prompts the head never saw (positions of one response are highly
    correlated, and several rows may answer the same prompt).
    """
    if not 0.0 < val_fraction < 1.0:
        raise AccheadError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    prompts = np.unique(prompt_index)
    if len(prompts) < 2:
        raise AccheadError("need at least 2 distinct prompts to split into train and validation")
    n_val = min(max(1, round(val_fraction * len(prompts))), len(prompts) - 1)
    val_prompts = np.random.default_rng(seed).permutation(prompts)[:n_val]
    return np.isin(prompt_index, val_prompts)
