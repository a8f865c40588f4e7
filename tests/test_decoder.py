"""The decoder's contract: spec parsing and its one-line errors, round accounting, caches, CLI."""

from __future__ import annotations

import json

import pytest
import torch

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.head_io import HeadMetadata, save_head
from acchead.inference import SpeculativeDecoder, parse_policy
from acchead.inference.cli_decode import main as decode_main
from acchead.inference.drafters import ModelDrafter
from acchead.inference.policies import Confidence, FixedK, Oracle
from acchead.inference.specdecpp_policy import SpecDecPP
from acchead.models import model_identity
from acchead.sampling import SamplingConfig

# ------------------------------------------------------------------------------------------- policies


@pytest.mark.parametrize(
    ("spec", "cls", "canonical"),
    [
        ("autoregressive", None, "autoregressive"),
        ("specdec:k=4", FixedK, "specdec:k=4"),
        (" SpecDec : k = 2 ", FixedK, "specdec:k=2"),
        ("specdecpp:h=0.7,max=20", SpecDecPP, "specdecpp:h=0.7,max=20,free=1"),
        ("specdecpp:h=0.3,free=0", SpecDecPP, "specdecpp:h=0.3,max=20,free=0"),
        ("confidence:tau=0.4", Confidence, "confidence:tau=0.4,max=20"),
        ("oracle", Oracle, "oracle"),
        ("oracle:max=8", Oracle, "oracle:max=8"),
    ],
)
def test_parse_policy_roundtrip(spec, cls, canonical):
    head = AcceptanceHead(8, 1)
    policy = parse_policy(spec, head=head)
    assert cls is None or isinstance(policy, cls)
    assert policy.spec == canonical
    assert parse_policy(policy.spec, head=head).spec == canonical


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("beam:k=3", "unknown name"),
        ("specdec", "needs k"),
        ("specdec:k", "expected key=value"),
        ("specdec:k=two", "is not int"),
        ("specdec:k=0", "1 <= k <= 1024"),
        ("specdec:k=4,h=0.5", "takes k"),
        ("specdec:k=4,k=5", "given twice"),
        ("specdecpp:h=0.7", "needs an acceptance head"),
        ("specdecpp:h=0", "0 < h < 1"),
        ("specdecpp:h=1.0", "0 < h < 1"),
        ("specdecpp:h=-0.2", "0 < h < 1"),
        ("specdecpp:h=0.5,free=maybe", "not 0/1"),
        ("confidence:tau=1.5", "0 <= tau <= 1"),
        ("oracle:max=0", "1 <= max <= 1024"),
    ],
)
def test_parse_policy_errors_are_one_line(spec, message):
    with pytest.raises(AccheadError, match=message) as e:
        parse_policy(spec)
    assert "\n" not in str(e.value)


# -------------------------------------------------------------------------------------------- decoder


def _gen(dec, n=16, **kw):
    return dec.generate(torch.tensor([3, 7, 11, 5]), max_new_tokens=n, **kw)


def test_oracle_refuses_sampling(tiny_llama_pair):
    target, draft = tiny_llama_pair
    dec = SpeculativeDecoder(target, draft, policy="oracle")
    with pytest.raises(AccheadError, match="greedy-only"):
        _gen(dec, temperature=0.7)


def test_head_for_another_draft_is_refused(tiny_llama_pair, tmp_path):
    target, draft = tiny_llama_pair
    with pytest.raises(AccheadError, match="hidden states of size 16"):
        SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5", head=AcceptanceHead(16, 1))
    # Same hidden size, other weights: only the fingerprint in the file's metadata can tell.
    other = model_identity(target)
    other.update(hidden_size=draft.config.hidden_size, fingerprint="0" * 16)
    head = AcceptanceHead(draft.config.hidden_size, 1)
    meta = HeadMetadata(depth=1, hidden_size=head.hidden_size, w_acc=1.0, w_rej=6.0, draft=other,
                        sampling=SamplingConfig(0.0).to_dict())
    path = save_head(head, tmp_path / "head.safetensors", meta=meta)
    with pytest.raises(AccheadError):
        SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5", head=path)


def test_batch_of_two_is_refused(tiny_llama_pair):
    target, draft = tiny_llama_pair
    dec = SpeculativeDecoder(target, draft, policy="specdec:k=2")
    with pytest.raises(AccheadError, match="one sequence"):
        dec.generate(torch.ones(2, 3, dtype=torch.long))


def test_round_accounting(tiny_llama_pair):
    target, draft = tiny_llama_pair
    ar = _gen(SpeculativeDecoder(target, None, policy="autoregressive"), temperature=1.0)
    assert ar.target_calls == ar.tokens == 16 and ar.draft_calls == 0 and ar.drafted == 0

    k3 = _gen(SpeculativeDecoder(target, draft, policy="specdec:k=3"), temperature=1.0)
    # Every round drafts min(K, tokens left − 1): the last token of the budget is the target's.
    assert all(d == 3 for d in k3.drafted_per_round[:-1])
    assert k3.draft_calls == k3.drafted  # one draft forward per candidate
    assert k3.tokens == 16 == k3.rounds + sum(k3.accepted_per_round)
    assert k3.discarded == k3.drafted - sum(k3.accepted_per_round)


@pytest.mark.parametrize("fast", [False, True])
def test_fixed_k_round_unit_draws_what_k_single_steps_draw(tiny_llama_pair, fast):
    """Fixed K drafts a round in one unit (`ModelDrafter.propose_block`); a rule that never stops early,
    confidence with tau = 0, drafts the same K candidates one step at a time. Their draws are keyed by
    (seed, round start, slot), so both decode the same tokens in the same rounds at T = 1, with one draft
    forward per candidate (eager, and on the static cache uncompiled)."""
    target, draft = tiny_llama_pair
    prompt = torch.tensor([5, 9, 17, 33, 2])
    res = []
    for spec in ("specdec:k=3", "confidence:tau=0,max=3"):
        drafter = ModelDrafter(draft, fast=fast, compile=False, round_unit=True)
        dec = SpeculativeDecoder(target, drafter, policy=spec, fast=fast, compile=False)
        res.append(dec.generate(prompt, max_new_tokens=30, temperature=1.0, top_k=50, seed=11))
    assert res[0].new_ids.tolist() == res[1].new_ids.tolist()
    assert res[0].drafted_per_round == res[1].drafted_per_round
    assert res[0].draft_calls == res[1].draft_calls == res[0].drafted


def test_free_token_costs_no_draft_forward(tiny_llama_pair):
    """free=1: draft forwards == drafted tokens (q_{k+1} came with e_k); free=0 wastes that forward."""
    target, draft = tiny_llama_pair
    torch.manual_seed(0)
    head = AcceptanceHead(draft.config.hidden_size, 1)
    with torch.no_grad():
        head.out.bias.fill_(-0.5)  # σ ≈ 0.4: the rule stops after one or two candidates, never at the cap
    res = {}
    for free in (1, 0):
        dec = SpeculativeDecoder(target, draft, policy=f"specdecpp:h=0.6,max=8,free={free}", head=head)
        res[free] = _gen(dec, n=24, temperature=1.0)
        assert res[free].head_calls > 0
    assert res[1].draft_calls == res[1].drafted
    r, early_stops, generated = res[0], 0, 0
    for drafted, accepted in zip(r.drafted_per_round, r.accepted_per_round, strict=True):
        early_stops += 0 < drafted < min(8, 24 - generated - 1)  # stopped by the head, not the cap
        generated += accepted + 1
    assert early_stops > 0 and r.draft_calls == r.drafted + early_stops


def test_confidence_reads_draft_softmax_under_greedy(tiny_llama_pair):
    """Greedy q is one-hot; the confidence rule must read softmax(draft logits), as Hugging Face does."""
    target, draft = tiny_llama_pair
    never_sure = _gen(SpeculativeDecoder(target, draft, policy="confidence:tau=1.0,max=5"), temperature=0)
    always_sure = _gen(SpeculativeDecoder(target, draft, policy="confidence:tau=0,max=5"), temperature=0)
    assert set(never_sure.drafted_per_round) == {1}
    assert max(always_sure.drafted_per_round) == 5


def test_seed_repeats_and_streamer_sees_every_token(tiny_llama_pair):
    target, draft = tiny_llama_pair
    dec = SpeculativeDecoder(target, draft, policy="specdec:k=2", verifier="block")

    class Collect:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, ids):
            self.chunks.append(ids.reshape(-1).tolist())

        def end(self):
            self.ended = True

    s = Collect()
    a = _gen(dec, temperature=1.0, seed=5, streamer=s)
    b = _gen(dec, temperature=1.0, seed=5)
    c = _gen(dec, temperature=1.0, seed=6)
    assert a.new_ids.tolist() == b.new_ids.tolist() != c.new_ids.tolist()
    streamed = [t for chunk in s.chunks[1:] for t in chunk]
    assert s.chunks[0] == [3, 7, 11, 5] and streamed == a.new_ids.tolist() and s.ended


def test_eos_ends_generation(tiny_llama_pair):
    target, draft = tiny_llama_pair
    dec = SpeculativeDecoder(target, draft, policy="specdec:k=4")
    full = _gen(dec, n=20, temperature=0)
    eos = full.new_ids[5].item()
    cut = _gen(dec, n=20, temperature=0, eos_token_id=eos)
    first = full.new_ids.tolist().index(eos)
    assert cut.new_ids.tolist() == full.new_ids.tolist()[: first + 1]


# ------------------------------------------------------------------------------------------------ CLI


def _cli(tiny_pair_dirs, *extra):
    t, d = tiny_pair_dirs
    return decode_main(["--target", str(t), "--draft", str(d), "--prompt", "def f(x):", "--max-new-tokens",
                        "12", *extra])


def test_cli_streams_and_prints_stats(tiny_pair_dirs, capsys):
    assert _cli(tiny_pair_dirs, "--policy", "specdec:k=3", "--verifier", "block") == 0
    out = capsys.readouterr().out
    assert out.startswith("def f(x):") and "target calls" in out and "specdec:k=3" in out
    assert _cli(tiny_pair_dirs, "--policy", "confidence:tau=0.5", "--temperature", "0.8", "--json") == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["tokens"] == 12 and stats["sampling"]["temperature"] == 0.8


def test_cli_chat_puts_the_prompt_through_the_chat_template(tiny_pair_dirs, tmp_path, capsys):
    """`--chat`: the prompt as a user's turn of the target tokenizer's template; one line without one, and
    with --prompts (whose lines and sets say which prompts are chat)."""
    import shutil

    from acchead.models import load_tokenizer
    from acchead.prompting import encode_prompt

    assert _cli(tiny_pair_dirs, "--chat", "--policy", "specdec:k=2") == 2
    assert "has no chat template" in capsys.readouterr().err
    assert decode_main(["--target", str(tiny_pair_dirs[0]), "--draft", str(tiny_pair_dirs[1]), "--chat",
                        "--prompts", "humaneval", "--batch-size", "2"]) == 2  # fmt: skip
    assert "--chat applies to --prompt / --prompt-file" in capsys.readouterr().err
    target = shutil.copytree(tiny_pair_dirs[0], tmp_path / "target")
    tok = load_tokenizer(target)
    tok.chat_template = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"
    tok.save_pretrained(target)
    assert _cli((target, tiny_pair_dirs[1]), "--chat", "--policy", "specdec:k=2", "--json") == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    chat_ids = encode_prompt(load_tokenizer(target), "def f(x):", chat=True)
    assert stats["prompt_tokens"] == len(chat_ids) > len(tok("def f(x):").input_ids) and stats["tokens"] == 12


def test_cli_specdecpp_with_head_file(tiny_pair_dirs, tmp_path, capsys):
    from acchead.models import load_causal_lm

    draft = load_causal_lm(tiny_pair_dirs[1])
    head = AcceptanceHead(draft.config.hidden_size, 2)
    meta = HeadMetadata(depth=2, hidden_size=head.hidden_size, w_acc=1.0, w_rej=6.0,
                        draft=model_identity(draft), sampling=SamplingConfig(0.0).to_dict())
    path = save_head(head, tmp_path / "head.safetensors", meta=meta)
    assert _cli(tiny_pair_dirs, "--policy", "specdecpp:h=0.5,max=6", "--head", str(path), "--json") == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["head_calls"] > 0 and stats["sampling"]["temperature"] == 0.0  # S from the head
    # priced: acchead-decode warms the decoder up first (on the fast path that times the widths it reads;
    # eager, nothing is timed and the rule says it runs the paper's threshold)
    with pytest.warns(UserWarning, match="paper's threshold"):
        priced = ["--policy", "specdecpp:h=0.5,max=6,priced=1", "--head", str(path), "--json", "--no-fast"]
        assert _cli(tiny_pair_dirs, *priced) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["policy"].endswith("priced=1")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policy", "specdec:k=0"], "1 <= k <= 1024"),
        (["--policy", "nonsense"], "unknown name"),
        (["--policy", "specdecpp:h=0.5", "--head", "/nonexistent/head.safetensors"], "no acceptance head"),
        (["--policy", "oracle", "--temperature", "1"], "greedy-only"),
        (["--policy", "specdec:k=2", "--top-p", "0"], "top_p"),
        # refused before any model loads since the audit of 2026-12-08 (after loading both, before)
        (["--batch-size", "0"], "--batch-size must be >= 1"),
        (["--batch-size", "2", "--batch-stop", "foo"], "batch"),
        (["--dtype", "foo"], "unknown dtype 'foo'"),
        (["--device", "foo"], "foo"),
        (["--policy", "specdec:k=2", "--temperature", "-1"], "temperature must be >= 0"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tiny_pair_dirs, capsys, monkeypatch, extra, message):
    from acchead import models

    if "--policy" not in extra:  # the flags no model needs: checked before one loads
        monkeypatch.setattr(models, "load_causal_lm", None)
    assert _cli(tiny_pair_dirs, *extra) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_specdecpp_fast_head_path_equals_the_module():
    torch.manual_seed(0)
    head = AcceptanceHead(24, depth=3)
    policy = parse_policy("specdecpp:h=0.5", head=head)
    for _ in range(5):
        e = 3 * torch.randn(24)
        with torch.no_grad():
            assert abs(float(policy.call.logit_of(e)) - float(head(e))) < 1e-5
    # The running log P̂ stays finite in both tails of the logit and stops exactly as the product would.
    from acchead.inference.drafters import DraftStep

    for f, stop in ((-800.0, True), (-3.0, True), (0.0, False), (2.5, False), (800.0, False)):
        pol = parse_policy("specdecpp:h=0.5", head=head)
        pol.call.logit = lambda step, f=f: torch.tensor(f)  # a head that outputs f
        run = pol.start_decode()
        run.start_round(0)
        step = DraftStep(token=0, q=torch.ones(2) / 2, hidden=torch.zeros(24), index=1)
        assert run.should_stop(step) is stop
        assert bool(torch.isfinite(run.stats).all()) and run.head_calls == 1  # [log P̂, judged count]
