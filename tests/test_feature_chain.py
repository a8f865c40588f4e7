"""A feature draft's chain of candidates, teacher-forced (`acchead.feature_chain`): level k at pair j is the
state the drafter computes for the (k+1)-th candidate of a round started at pair j - k, padding included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from exact_models import _peaked_llama
from test_feature_draft import VOCAB, _feature_draft, _states

from acchead.data_gen.labeler import Labeler
from acchead.feature_chain import chain_hidden_states, chain_mask, gather_levels
from acchead.feature_draft import TargetFedDraft
from acchead.inference.feature_drafter import FeatureDrafter
from acchead.sampling import SamplingConfig

SEQ = [1, 4, 7, 2, 9, 5, 0, 3, 11, 6]


@pytest.fixture(scope="module")
def pair():
    target = _peaked_llama(VOCAB, seed=3)
    return target, _feature_draft(target)


@torch.inference_mode()
def test_each_level_is_what_the_drafter_computes_for_that_candidate(pair):
    target, draft = pair
    for start in (1, 3, 5):  # the round's first candidate is pair `start`: SEQ[: start + 2] committed
        drafter = FeatureDrafter(draft)
        ctx = torch.tensor(SEQ[: start + 2])
        drafter.begin(ctx, SamplingConfig(0.0), seed=0)
        drafter.observe(_states(target, SEQ[: start + 1]), 0)
        steps = []
        for k in range(4):  # candidate k + 1 reads candidate k's token and the draft's guess of its state
            steps.append(drafter.propose(ctx, k + 1, want_hidden=False, want_state=True))
            ctx = torch.cat([ctx, steps[-1].token.view(1)])
        seq = ctx.tolist()  # the committed tokens and the round's candidates, teacher-forced below
        ids, states = torch.tensor([seq[1:]]), _states(target, seq)[None, :-1]  # pair j: (seq[j + 1], f_j)
        levels = chain_hidden_states(draft, ids, states, torch.ones_like(ids), levels=4)
        assert len(levels) == 4
        for k, step in enumerate(steps):
            torch.testing.assert_close(levels[k][0, start + k], step.state, rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def test_left_padding_and_a_stop_change_nothing(pair):
    target, draft = pair
    f = _states(target, SEQ)
    ids, states = torch.tensor([SEQ[1:]]), f[None, :-1]
    alone = chain_hidden_states(draft, ids, states, torch.ones_like(ids), levels=3)
    pad = 3
    padded_ids = torch.cat([torch.zeros(1, pad, dtype=torch.long), ids], 1)
    padded_states = torch.cat([torch.randn(1, pad, f.shape[1]), states], 1)
    mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones_like(ids)], 1)
    both = chain_hidden_states(draft, torch.cat([padded_ids, padded_ids]), torch.cat([padded_states] * 2),
                               torch.cat([mask, mask]), levels=3)  # fmt: skip
    for k in range(3):
        # a level-k pair whose round starts before the row's first pair is inside the prompt: not compared
        torch.testing.assert_close(both[k][1, pad + k :], alone[k][0, k:], rtol=1e-4, atol=1e-5)
    stopped = chain_hidden_states(draft, ids, states, torch.ones_like(ids), 3, keep_going=lambda k, h: k < 1)
    assert len(stopped) == 2
    level_of = torch.tensor([[0, 1, 2, 0, 1, 2, 0, 1, 2]])
    mixed = gather_levels(alone, level_of)
    for j, k in enumerate(level_of[0].tolist()):
        torch.testing.assert_close(mixed[0, j], alone[k][0, j])


def test_the_mask_lets_a_candidate_see_its_rounds_context_and_itself():
    allowed = chain_mask(torch.ones(1, 5), level=2, dtype=torch.float32)[0, 0] == 0  # (5, 15)
    # query pair 4 at depth 2: its round started at pair 2 (level-0 keys 0..2), then level-1 pair 3, itself
    assert allowed[4].nonzero().flatten().tolist() == [0, 1, 2, 5 + 3, 10 + 4]
    assert allowed[0].nonzero().flatten().tolist() == [10]  # a round before the row's start: itself only


@torch.inference_mode()
def test_target_fed_levels_give_each_position_the_candidate_of_its_depth(pair):
    target, draft = pair
    seq = torch.tensor([SEQ])
    levels = chain_hidden_states(draft, seq[:, 1:], _states(target, SEQ)[None, :-1], torch.ones(1, 9), 3)
    h = TargetFedDraft(draft, target, levels=3)(seq, output_hidden_states=True).hidden_states[-1][0]  # (T, H)
    for p in range(1, len(SEQ)):  # position p holds pair p - 1, of depth (p - 1) mod 3
        torch.testing.assert_close(h[p], levels[(p - 1) % 3][0, p - 1])
    first = TargetFedDraft(draft, target)(seq, output_hidden_states=True).hidden_states[-1][0]
    torch.testing.assert_close(first[1:], levels[0][0])


@torch.inference_mode()
def test_gen_data_labels_a_chain_s_candidates_at_their_depths(pair):
    """With `feature_chain` = 3, response token i's label is the greedy acceptance (the target's argmax after
    the prefix) of the candidate of depth (pair index mod 3), its draft token that candidate's argmax;
    depth-0 positions keep the first-candidate labels."""
    target, draft = pair
    prompts, responses = [[1, 4, 7], [2, 9]], [[5, 0, 3, 11, 6, 1, 2, 4], [7, 7, 1, 3]]
    kw = dict(mix_ratio=1.0, seed=0, max_new_tokens=8, eos_ids=[10], pad_id=0, cache_features=True)
    first = Labeler(target, draft, SamplingConfig(0.0), **kw).label_responses([0, 1], prompts, responses)
    chain = Labeler(target, draft, SamplingConfig(0.0), feature_chain=3, **kw).label_responses(
        [0, 1], prompts, responses
    )
    depths = set()
    for p, r, row1, row3 in zip(prompts, responses, first, chain, strict=True):
        seq = p + r
        levels = chain_hidden_states(draft, torch.tensor([seq[1:]]), _states(target, seq)[None, :-1],
                                     torch.ones(1, len(seq) - 1), 3)  # fmt: skip
        greedy = target(torch.tensor([seq])).logits[0].argmax(-1)  # (T,) the target's token after each prefix
        for i in range(len(r)):
            j = len(p) + i - 2  # the pair whose output draws response token i
            k = j % 3
            depths.add(k)
            token = int(draft.lm_head(levels[k][0, j]).argmax())
            assert row3.draft_ids[i] == token
            assert row3.accept_prob[i] == float(token == int(greedy[len(p) + i - 1]))
            if k == 0:
                assert row1.draft_ids[i] == row3.draft_ids[i]
                np.testing.assert_allclose(row1.lookahead_features[i], row3.lookahead_features[i], atol=2e-3)
    assert depths == {0, 1, 2}
    assert any((a.draft_ids != b.draft_ids).any() for a, b in zip(first, chain, strict=True))


def test_training_reads_each_label_s_depth_as_gen_data_wrote_it():
    """`acchead.train.data.candidate_depth`: response token i of a row with a P-token prompt is drawn by
    pair P + i - 2, of depth (P + i - 2) mod N (the labeller's test above pins that pair)."""
    from acchead.train.data import candidate_depth

    prompt_len, position = np.array([3, 3, 3, 3, 2]), np.array([0, 1, 2, 3, 0])
    assert candidate_depth(prompt_len, position, 3).tolist() == [1, 2, 0, 1, 0]
    assert candidate_depth(prompt_len, position, 1).tolist() == [0] * 5


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bfloat16"])
def test_soft_label_loss_is_each_depths_cross_entropy_to_the_targets_distribution(pair, bf16, monkeypatch):
    """`feature_loss` with soft labels and a chain: every depth regresses the target's next state and
    learns the target's distribution on the draft's rows, softmax(f_{j+1} · rowsᵀ), at every real pair;
    its forwards under bfloat16 autocast where the hardware computes in it (either case forced here), in
    float32 elsewhere."""
    import acchead.distill.feature_training as feature_training
    from acchead.distill.feature_training import collate_features, feature_loss

    monkeypatch.setattr(feature_training, "native_bfloat16", lambda device: bf16)

    target, draft = pair
    rows = target.get_output_embeddings().weight.detach()[draft.lm_head.to_full]  # (V_d, H)
    states = _states(target, SEQ)  # (L, H)
    labels = draft.lm_head.to_draft[torch.tensor([*SEQ[2:], 0])]
    examples = [(torch.tensor(SEQ[1:]), labels, states), (torch.tensor(SEQ[1:6]), labels[:5], states[:6])]
    batch = collate_features(examples, pad_id=0)
    ids, mask, _, read, nxt = batch
    real = mask.bool()
    soft = (nxt[real] @ rows.T).softmax(-1)  # (N_real, V_d)
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        levels = chain_hidden_states(draft, ids, read, mask, 2)
    want = 0.0
    for hidden in levels:
        logits = draft.lm_head.draft_logits(hidden[real].float())
        ce = -(soft * logits.log_softmax(-1)).sum(-1).mean()
        want = want + torch.nn.functional.smooth_l1_loss(hidden[real].float(), nxt[real]) + 0.5 * ce
    got = feature_loss(draft, batch, cls_weight=0.5, noise=0.0, teacher_rows=rows, chain=2)[0]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("chain", [1, 2])
def test_collated_float16_states_give_the_float32_loss(pair, chain):
    """`collate_features` keeps the features' float16 (a GPU batch then copies half the bytes, and the host
    converts nothing); `feature_loss` converts them, so the loss equals that of the same batch converted to
    float32 first, noise draws included."""
    from acchead.distill.feature_training import collate_features, feature_loss

    target, draft = pair
    states = _states(target, SEQ).detach().half()  # (L, H), as the features stage stores them
    labels = draft.lm_head.to_draft[torch.tensor([*SEQ[2:], 0])]
    examples = [(torch.tensor(SEQ[1:]), labels, states), (torch.tensor(SEQ[1:6]), labels[:5], states[:6])]
    batch = collate_features(examples, pad_id=0)
    assert batch[3].dtype == batch[4].dtype == torch.float16
    as32 = (*batch[:3], batch[3].float(), batch[4].float())
    losses = []
    for b in (batch, as32):
        torch.manual_seed(0)
        losses.append(feature_loss(draft, b, noise=0.1, chain=chain)[0])
    assert torch.equal(*losses)
