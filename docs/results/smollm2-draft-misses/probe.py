"""Where the real pair's feature draft misses (twenty-seventh session). From the repo root, the assets
installed and the eval sets' fused states computed (`acchead-distill features --fused-layers 2,15,27`):

    python docs/results/smollm2-draft-misses/probe.py DRAFT FEATURES [RESPONSES]

prints the draft's first-candidate agreement on MT-bench by question category; on both eval sets by the
target's own top-1 probability at the position, with the share of tokens outside the draft's head; the
eval sets' coverage by the head plus the most frequent response tokens it lacks; and, given RESPONSES (the
shards whose tokens rank the new rows), the agreement of the draft grown by 4,032 rows before training.
"""

from __future__ import annotations

import collections
import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from acchead.assets import TARGET_DIR_NAME, asset_path
from acchead.distill.draft import IGNORE, OUTSIDE, build_vocabulary, grow_vocabulary
from acchead.distill.feature_training import agreement_by_depth, collate_features, pack_feature_examples
from acchead.distill.features import load_features
from acchead.distill.responses import SHARD_GLOB, load_responses
from acchead.feature_chain import chain_hidden_states
from acchead.models import load_causal_lm

SETS = Path("data/smollm2")
EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 1.01)
PAD = 2  # the tokenizer's pad id


def shard_states(draft, features: Path, name: str) -> list:
    """(shard, its responses' states) of an eval set."""
    paths = sorted((SETS / name).glob(SHARD_GLOB))
    layers = tuple(draft.config.fused_layers)
    shards = load_responses(SETS / name)
    return [(s, load_features(features / name, p, layers)) for s, p in zip(shards, paths, strict=True)]


def pack(pairs: list, draft) -> list:
    """The eval set's examples as training packs them, labels in `draft`'s head rows."""
    shards, states = [s for s, _ in pairs], [f for _, f in pairs]
    return pack_feature_examples(shards, states, draft.lm_head.to_draft.cpu(), 512)


def by_category(draft, features: Path) -> None:
    with (Path.home() / ".cache/acchead/assets/mtbench/question.jsonl").open() as f:
        category = [json.loads(line)["category"] for line in f]
    hits, total = collections.Counter(), collections.Counter()
    for shard, states in shard_states(draft, features, "eval-mtbench"):
        for i, index in enumerate(shard.plan_index):
            one = replace(shard, prompts=[shard.prompts[i]], responses=[shard.responses[i]])
            ex = pack_feature_examples([one], [[states[i]]], draft.lm_head.to_draft.cpu(), 512)
            if ex:
                n = int((ex[0][1] != IGNORE).sum())
                hits[category[index]] += agreement_by_depth(draft, ex, PAD, 1)[0] * n
                total[category[index]] += n
    for c in sorted(total):
        print(f"{c:12s} tokens {total[c]:5d}  agreement {hits[c] / total[c]:.3f}")
    share = sum(hits.values()) / sum(total.values())
    print(f"{'all':12s} tokens {sum(total.values()):5d}  agreement {share:.3f}")


@torch.inference_mode()
def by_confidence(draft, features: Path, name: str, head: torch.Tensor) -> None:
    """`head`: (V, H) the target's LM head; its softmax over a state gives the target's top-1 probability."""
    pairs = shard_states(draft, features, name)
    ex = pack(pairs, draft)
    conf, hit, outside = [], [], []
    for e in ex:
        ids, mask, labels, read, _ = collate_features([e], PAD)
        hidden = chain_hidden_states(draft, ids, read.float(), mask, 1)[0][0]  # (L, H)
        scored = labels[0] != IGNORE
        hit.append(draft.lm_head.draft_logits(hidden[scored]).argmax(-1) == labels[0][scored])
        outside.append(labels[0][scored] == OUTSIDE)
        final = e[2][1:, : head.shape[1]].float()  # (L-1, H) the state that chose each labelled token
        conf.append(torch.softmax(final @ head.T, -1).amax(-1)[: len(scored)][scored])
    conf, hit, outside = torch.cat(conf), torch.cat(hit).float(), torch.cat(outside)
    print(f"{name}: {len(hit)} tokens, agreement {hit.mean():.3f}, target top-1 prob mean {conf.mean():.3f}")
    for lo, hi in itertools.pairwise(EDGES):
        m = (conf >= lo) & (conf < hi)
        inside = hit[m & ~outside].mean()
        print(f"  p1 in [{lo:.1f}, {min(hi, 1):.1f}): share {m.float().mean():.3f}"
              f"  agreement {hit[m].mean():.3f}"
              f"  outside the head {outside[m].float().mean():.3f}  agreement inside {inside:.3f}")


def coverage(draft, responses: Path) -> None:
    counts = collections.Counter(t for s in load_responses(responses) for r in s.responses for t in r)
    have = set(draft.lm_head.to_full.tolist())
    missing = [t for t, _ in counts.most_common() if t not in have]
    for name in ("eval-mtbench", "eval-humaneval"):
        tokens = [t for s in load_responses(SETS / name) for r in s.responses for t in r]
        cells = []
        for n in (0, 2048, 4096, 8192):
            kept = have | set(missing[:n])
            cells.append(f"+{n}:{sum(t in kept for t in tokens) / len(tokens):.3f}")
        print(name, " ".join(cells))


def grown(draft, features: Path, responses: Path, rows: int = 4032) -> None:
    have = draft.lm_head.to_full.cpu()
    shards = load_responses(responses)[:-2]  # the run's held-out two excluded, as `train` ranks them
    ranked = build_vocabulary(shards, len(have) + rows, tuple(have.tolist()))
    wide = grow_vocabulary(draft, ranked[len(have) :])
    for name in ("eval-mtbench", "eval-humaneval"):
        pairs = shard_states(draft, features, name)
        for label, m in (("shipped", draft), (f"+{rows} rows", wide.eval())):
            print(name, label, round(agreement_by_depth(m, pack(pairs, m), PAD, 1)[0], 4))


if __name__ == "__main__":
    torch.set_num_threads(1)
    draft = load_causal_lm(Path(sys.argv[1])).float().eval()
    features = Path(sys.argv[2])
    by_category(draft, features)
    head = load_causal_lm(asset_path(TARGET_DIR_NAME)).get_output_embeddings().weight.detach().float()
    for name in ("eval-mtbench", "eval-humaneval"):
        by_confidence(draft, features, name, head)
    coverage(draft, SETS / "responses")
    if len(sys.argv) > 3:
        grown(draft, features, Path(sys.argv[3]))
