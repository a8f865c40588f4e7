"""Max-Gram (MaG): the statistical drafter at the bottom of a cascade (DESIGN §6, CS Drafting §3).

To propose n tokens after the current sequence s = prompt ++ generated:
1. find the longest suffix of s that occurs earlier, in s[:-1] = prompt ++ generated[:-1], take its leftmost
   occurrence and propose the tokens that followed it (they may run into the suffix itself: periodic text);
2. if that gave fewer than n tokens, append them and search once more, within the generated text only;
3. fill the rest from a bigram table (token → its most frequent successor in a corpus), chaining.
The proposal is deterministic, so its draft distribution q is one-hot; its cost is a few numpy passes.

The bigram table is estimated from token ids: `build_bigram_table` takes any iterable of id sequences;
`corpus_bigram_table` tokenizes the files of a corpus and caches the table to a file; which corpus is the
caller's (the bench: the demo pair's stdlib LM-train split, `acchead.demo_pair.split_files`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from acchead.errors import AccheadError
from acchead.inference.drafters import RoundBufferDrafter
from acchead.inference.host_reads import read
from acchead.sampling import SamplingConfig

# Polynomial hashing mod the prime 2^31 − 1: residues multiply without overflowing int64.
_MOD = 2_147_483_647
_BASE = 1_000_003
_POW = np.ones(1, dtype=np.int64)  # _BASE^j mod _MOD, grown on demand
_INV = np.ones(1, dtype=np.int64)  # _BASE^−j mod _MOD


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(B^j, B^−j) mod _MOD for j < n, cached across calls."""
    global _POW, _INV
    if _POW.size < n:
        size = max(n, 2 * _POW.size)
        inv_base = pow(_BASE, _MOD - 2, _MOD)
        pw, iv = [int(_POW[-1])], [int(_INV[-1])]
        for _ in range(size - _POW.size):
            pw.append(pw[-1] * _BASE % _MOD)
            iv.append(iv[-1] * inv_base % _MOD)
        _POW = np.concatenate([_POW, np.array(pw[1:], dtype=np.int64)])
        _INV = np.concatenate([_INV, np.array(iv[1:], dtype=np.int64)])
    return _POW[:n], _INV[:n]


def _scan_suffix_match(seq: np.ndarray, start: int, max_steps: int | None = None) -> tuple[int, int] | None:
    """Grow the match one token at a time (one numpy pass per matched token), keeping the ends that still
    agree; the survivors of the last successful step are the occurrences of the longest match.

    Returns (length, leftmost end), None if there is no match, or (-length, end) if it stopped after
    `max_steps` steps with the match still growing.
    """
    hay = seq[:-1]
    ends = np.flatnonzero(hay[start:] == seq[-1]) + start  # ascending: leftmost first
    if ends.size == 0:
        return None
    length = 1
    while length < seq.size:
        if max_steps is not None and length >= max_steps:
            return -length, int(ends[0])
        prev = ends - length
        ok = prev >= start
        ok[ok] = hay[prev[ok]] == seq[-1 - length]
        if not ok.any():
            break
        ends = ends[ok]
        length += 1
    return length, int(ends[0])


def longest_suffix_match(seq: np.ndarray, start: int = 0) -> tuple[int, int] | None:
    """Longest suffix of `seq` that also occurs in seq[start:-1]; its leftmost occurrence.

    Short matches (ordinary text) are grown token by token; a match still growing after 16 tokens
    (the periodic text small models love to generate, where matches run to thousands of tokens) switches
    to a binary search on the length with rolling hashes: O(T log T) in a dozen numpy passes. Hash hits
    are confirmed by direct comparison; a collision falls back to the token-by-token scan.

    Args:
        seq: (T,) int64 token ids (non-negative).
        start: the occurrence must lie wholly at or after this index.

    Returns:
        (length, end) with seq[end-length+1 : end+1] == seq[T-length:], end ≤ T-2 the leftmost such end
        among the longest matches; None when the last token occurs nowhere in seq[start:-1].
    """
    size = seq.size
    if size < 2:
        return None
    quick = _scan_suffix_match(seq, start, max_steps=16)
    if quick is None or quick[0] > 0:
        return quick
    pw, iv = _powers(size)
    # prefix[i] = Σ_{j<i} s_j·B^−j, so window (a..b) hashes to B^b·(prefix[b+1] − prefix[a]).
    prefix = np.concatenate([[0], np.cumsum(seq.astype(np.int64) % _MOD * iv % _MOD) % _MOD])

    def hits(length: int) -> np.ndarray:
        ends = np.arange(start + length - 1, size - 1)
        h = pw[ends] * ((prefix[ends + 1] - prefix[ends + 1 - length]) % _MOD) % _MOD
        want = pw[size - 1] * ((prefix[size] - prefix[size - length]) % _MOD) % _MOD
        return ends[h == want]

    lo, hi = -quick[0], size - 1 - start  # a match of length lo exists; none can be longer than hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hits(mid).size:
            lo = mid
        else:
            hi = mid - 1
    for end in hits(lo):
        if np.array_equal(seq[end - lo + 1 : end + 1], seq[size - lo :]):
            return lo, int(end)
    return _scan_suffix_match(seq, start)  # hash collision misled the search (probability ~T/2^31)


def _continuation(seq: np.ndarray, n: int, start: int) -> np.ndarray:
    """Up to n tokens that followed the leftmost longest-suffix match in seq[start:-1]; (≤ n,) int64."""
    match = longest_suffix_match(seq, start)
    if match is None:
        return seq[:0]
    _, end = match
    return seq[end + 1 : end + 1 + n]


def build_bigram_table(sequences: Iterable[Sequence[int] | np.ndarray], vocab_size: int) -> np.ndarray:
    """Most frequent successor of each token, (V,) int64; ties go to the smaller id.

    A token never seen with a successor maps to the corpus' most frequent successor overall, so the table
    is total. Counts are kept sparse (unique pairs), never as a V×V matrix.
    """
    pair_keys = []
    for ids in sequences:
        a = np.asarray(ids, dtype=np.int64)
        if a.size >= 2:
            if a.min() < 0 or a.max() >= vocab_size:
                raise AccheadError(f"token id outside [0, {vocab_size}) in the bigram corpus")
            pair_keys.append(a[:-1] * vocab_size + a[1:])
    if not pair_keys:
        raise AccheadError("the bigram corpus has no sequence of two or more tokens")
    keys, counts = np.unique(np.concatenate(pair_keys), return_counts=True)
    prev, nxt = keys // vocab_size, keys % vocab_size
    # Sort by (prev asc, count desc, next asc); the first row of each prev block is its argmax.
    order = np.lexsort((nxt, -counts, prev))
    prev, nxt, counts = prev[order], nxt[order], counts[order]
    first = np.ones(prev.size, dtype=bool)
    first[1:] = prev[1:] != prev[:-1]
    successor_counts = np.bincount(nxt, weights=counts, minlength=vocab_size)
    table = np.full(vocab_size, int(np.argmax(successor_counts)), dtype=np.int64)
    table[prev[first]] = nxt[first]
    return table


def corpus_bigram_table(tokenizer, files: Sequence[Path], cache_dir: str | Path | None = None) -> np.ndarray:
    """Bigram table of the corpus `files` under `tokenizer`, cached as .npy in `cache_dir` (default: the
    user cache, `acchead.cache.cache_dir()`: $ACCHEAD_CACHE_DIR, else $ACCHEAD_CACHE, else ~/.cache/acchead).

    The corpus is an argument, resolved by the command (the decoders know no corpus). Files that are not
    UTF-8 are skipped. The cache key hashes the tokenizer's vocabulary and the file paths, so another
    tokenizer or corpus builds its own table.
    """
    from acchead.cache import cache_dir as user_cache_dir

    files = list(files)
    vocab = tokenizer.get_vocab()
    key = hashlib.sha1(json.dumps([sorted(vocab.items()), [str(f) for f in files]]).encode()).hexdigest()[:16]
    path = Path(cache_dir or user_cache_dir()) / f"mag-bigram-{key}.npy"
    if path.exists():
        return np.load(path)
    texts = [t for t in (_read_utf8(f) for f in files) if t]
    ids = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    table = build_bigram_table(ids, len(vocab))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
    np.save(tmp, table)
    os.replace(tmp, path)
    return table


def _read_utf8(path: Path) -> str | None:
    """File text, or None if it is not UTF-8 (a few stdlib files carry other encodings)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


class MaxGram:
    """The MaG proposer: deterministic n-token continuations of a sequence.

    Args:
        bigram: (V,) int64 table of most likely successors (`build_bigram_table`).
    """

    def __init__(self, bigram: np.ndarray | Sequence[int]) -> None:
        self.bigram = np.asarray(bigram, dtype=np.int64)
        if self.bigram.ndim != 1 or self.bigram.size == 0:
            raise AccheadError("the MaG bigram table must be a non-empty 1-D array of token ids")
        self.vocab_size = self.bigram.size

    def propose(self, seq: Sequence[int] | np.ndarray, prompt_len: int, n: int) -> list[int]:
        """n proposed tokens following `seq` (= prompt ++ generated, prompt the first prompt_len ids)."""
        s = np.asarray(seq, dtype=np.int64)
        if s.size == 0:
            raise AccheadError("MaG needs a non-empty context")
        out = _continuation(s, n, 0)
        if out.size < n:  # the match ran into the end of the text: search the generated text again
            s2 = np.concatenate([s, out])
            more = _continuation(s2, n - out.size, min(prompt_len, s.size - 1))
            out = np.concatenate([out, more])
        tokens = out.tolist()
        last = int(tokens[-1]) if tokens else int(s[-1])
        while len(tokens) < n:
            last = int(self.bigram[last]) if last < self.vocab_size else int(self.bigram[0])
            tokens.append(last)
        return tokens


class MaGDrafter(RoundBufferDrafter):
    """MaG as a `Drafter` (acchead.inference.drafters): one-hot q, no hidden state, no model forwards.

    Each proposal block is computed once from the context at the start of a round (or when the policy
    drafts past it) and handed out token by token; the block is a deterministic function of the context,
    so the one-hot q is the true draft distribution.

    Args:
        mag: the proposer.
        vocab_size: width of q (the target's vocabulary; ≥ the bigram table's).
        block: tokens proposed per MaG call (10 in the CS Drafting paper).
    """

    def __init__(self, mag: MaxGram, vocab_size: int, block: int = 10) -> None:
        if block < 1:
            raise AccheadError(f"MaG block must be >= 1, got {block}")
        if vocab_size < mag.vocab_size:
            raise AccheadError(f"q width {vocab_size} is narrower than MaG's vocabulary ({mag.vocab_size})")
        self.mag = mag
        self.vocab_size = vocab_size
        self.block = block
        self.draft_calls = 0  # MaG runs no model; its cost is negligible (DESIGN §6)
        self.prompt_len = 0
        self._clear_block()

    def begin(self, input_ids: torch.Tensor, sampling: SamplingConfig, seed: int) -> None:
        self.prompt_len = int(input_ids.numel())
        self._clear_block()
        self.draft_calls = 0

    def _propose_block(self, context: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        # Host-driven: Max-Gram searches the host's copy of the context.
        tokens = self.mag.propose(np.asarray(read(context), dtype=np.int64), self.prompt_len, self.block)
        return [(t, torch.nn.functional.one_hot(torch.tensor(t), self.vocab_size).float()) for t in tokens]
