"""A speculative decoder whose rounds a bandit assigns to (drafter, stop policy) arms (BanditSpec).

`bandit_decoder` builds the arms' drafters (the draft model, Max-Gram, cascades), a `SwitchDrafter` that
hands each round to the current arm's drafter (`acchead.inference.bandit_policy`), and the
`SpeculativeDecoder` that drives them: the decoder itself knows nothing of bandits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from transformers import PreTrainedModel

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference.bandit_spec import BanditSpec
from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.device_path import DevicePath
from acchead.inference.drafters import Drafter, ModelDrafter


def bandit_decoder(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    spec: str | BanditSpec,
    *,
    bigram: np.ndarray | None = None,
    head: AcceptanceHead | str | Path | None = None,
    verifier: str = "token",
    fast: bool | None = None,
    device_path: bool | DevicePath | None = None,
) -> SpeculativeDecoder:
    """A `SpeculativeDecoder` whose rounds a bandit assigns to (drafter, stop policy) arms.

    Args:
        target, draft: the models; `draft` serves arms without a drafter and reviews in cascades.
        spec: e.g. "ucb:arms=specdec:k=3|mag@specdec:k=8|cascade:k=4.2/10@specdec:k=6".
        bigram: MaG's bigram table, needed by `mag`/`cascade` arms
            (`acchead.inference.mag.corpus_bigram_table`).
        head: for specdecpp arms (which must use the draft model: MaG and cascades have no hidden states).
        fast, device_path: as for `SpeculativeDecoder` (the draft model's arms and the target; MaG and
            cascades are eager).
    """
    from acchead.inference.bandit_policy import SwitchDrafter
    from acchead.inference.cascade import make_drafter
    from acchead.inference.policy_build import build_bandit
    from acchead.inference.spec import as_policy_spec

    bandit = as_policy_spec(spec)
    if not isinstance(bandit, BanditSpec):
        raise AccheadError(f"bandit_decoder needs a ucb: or exp3: spec, got {spec!r}")
    if head is not None and not isinstance(head, AcceptanceHead):
        from acchead.head_io import load_head

        head, _ = load_head(head, draft=draft)
    arm_drafters = [a.drafter for a in bandit.arms]
    names = list(dict.fromkeys(arm_drafters))  # distinct drafter specs, first-seen order
    vocab = target.config.vocab_size
    drafters: list[Drafter] = []
    for name in names:
        if name is None:
            if draft is None:
                raise AccheadError(f"bandit {spec!r} has arms that need a draft model")
            # As `SpeculativeDecoder` resolves `fast` for the target: by default, on the device path.
            fast_draft = DevicePath.resolve(target.device, device_path).fast_default if fast is None else fast
            drafters.append(ModelDrafter(draft, fast=fast_draft, device_path=device_path))
        else:
            if bigram is None:
                raise AccheadError(f"drafter {name!r} needs MaG's bigram table")
            drafters.append(make_drafter(name, draft=draft, bigram=bigram, vocab_size=vocab))
    # The switch follows the bandit's arm of each round (`on_select`): the policy itself keeps no state.
    switch = SwitchDrafter(drafters, [names.index(n) for n in arm_drafters])
    policy = build_bandit(bandit, head, on_select=switch.select)
    for arm, name in zip(policy.arms, policy.drafters, strict=True):
        if (arm.needs_hidden or arm.needs_state) and name is not None:
            raise AccheadError(f"arm {name}@{arm.spec} needs hidden states; only the draft model gives them")
    if draft is not None:
        policy.to(draft.device)
        policy.attach_draft(draft)
    return SpeculativeDecoder(
        target, switch, policy=policy, verifier=verifier, fast=fast, device_path=device_path
    )
