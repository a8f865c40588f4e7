"""Tiny random Llamas with peaked, context-dependent next-token distributions, and the target's exact
distribution over short continuations with a chi-square test against it: what the exactness tests of every
decoder (single-prompt, batched, fast path, feature and reduced-vocabulary drafts) sample against."""

from __future__ import annotations

from collections import Counter

import torch

from acchead.sampling import SamplingConfig, probs_from_logits


def _peaked_llama(vocab: int, seed: int, init: float = 0.3, hidden: int = 32):
    """A random 2-layer Llama whose next-token distributions are peaked and context-dependent."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      initializer_range=init, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg).eval()


def _perturbed(model, scale: float, seed: int):
    """A copy of `model` with Gaussian noise on every weight: a draft that often agrees with it."""
    import copy

    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for prm in out.parameters():
            prm.add_(scale * prm.std() * torch.randn(prm.shape, generator=g))
    return out


@torch.inference_mode()
def _exact_sequences(target, prompt: list[int], length: int, cfg: SamplingConfig) -> dict[tuple, float]:
    """The target's exact distribution over `length`-token continuations (all prefixes, batched)."""
    vocab = target.config.vocab_size
    dist = {(): 1.0}
    for _ in range(length):
        prefixes = list(dist)
        ids = torch.tensor([prompt + list(g) for g in prefixes])
        probs = probs_from_logits(target(input_ids=ids).logits[:, -1].double(), cfg).tolist()
        dist = {(*g, x): dist[g] * pr[x] for g, pr in zip(prefixes, probs, strict=True) for x in range(vocab)
                if pr[x] > 0}
    return dist


def _draws(law: dict[tuple, float], n: int, seed: int = 0) -> Counter:
    """`n` sequences drawn from `law` (sequence -> probability, as `_exact_sequences` returns), counted."""
    keys = list(law)
    g = torch.Generator().manual_seed(seed)
    idx = torch.multinomial(torch.tensor([law[k] for k in keys]), n, replacement=True, generator=g)
    return Counter(keys[i] for i in idx.tolist())


def _cells_p_value(counts: Counter, expected: dict, n: int) -> float:
    """Pearson chi-square of `counts` against `expected` probabilities; cells with n·p < 5 pooled."""
    big = {k for k, pr in expected.items() if n * pr >= 5}
    stat, cells = 0.0, 0
    for k in big:
        stat += (counts.get(k, 0) - n * expected[k]) ** 2 / (n * expected[k])
        cells += 1
    rest_e = n * (1 - sum(expected[k] for k in big))
    rest_o = n - sum(counts.get(k, 0) for k in big)
    if rest_e > 0:
        stat += (rest_o - rest_e) ** 2 / rest_e
        cells += 1
    # Chi-square survival function with k dof = regularised upper incomplete gamma Q(k/2, x/2).
    return float(torch.special.gammaincc(torch.tensor((cells - 1) / 2), torch.tensor(stat / 2)))


def _chi_square_p_value(counts: Counter, expected: dict, n: int) -> float:
    """The smallest chi-square p-value (`_cells_p_value`) over the laws of every prefix length of the
    sequences (first token, first two, ..., whole), so the test has the power of each.

    The whole sequences' test alone pools the many rare cells of a long continuation into one, where an
    excess of some is hidden by a deficit of others: a copy round's candidate accepted ten times too often
    passed it (p = 0.39 at n = 250) and fails the first token's test (p < 1e-12)."""
    length = max(len(k) for k in expected)
    worst = 1.0
    for j in range(1, length + 1):
        seen, law = Counter(), Counter()
        for k, c in counts.items():
            seen[k[:j]] += c
        for k, pr in expected.items():
            law[k[:j]] += pr
        worst = min(worst, _cells_p_value(seen, dict(law), n))
    return worst
