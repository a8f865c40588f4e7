"""Bad input to acchead-decode and to the decoder's Python API is one line (issue 12): binary and too-long
prompts, a NaN head, a mistyped draft path, token ids outside the vocabulary, an unreachable hub id; a long
prompt is cut only when asked."""

from __future__ import annotations

import json

import pytest
import torch
from test_faults import PROG, _bench_argv, bench_inputs, one_error_line  # noqa: F401 (a fixture)

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference import cli_decode
from acchead.inference.bench import run as bench_cli


def _decode_argv(inp, *extra: str) -> list[str]:
    return ["--target", str(inp["target"]), "--draft", str(inp["draft"]), "--policy", "specdec:k=2",
            "--max-new-tokens", "6", "--json", *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("binary-prompt", "is not UTF-8 text"),
        ("long-prompt", "exceeds the model's 256-token context; pass --truncate-prompt"),
        ("nan-head", "head weights contain NaN or Inf"),
        ("typo-draft", "path does not exist"),
    ],
)
def test_decode_bad_input_is_one_line(bench_inputs, tmp_path, capsys, case, message):  # noqa: F811
    inp = bench_inputs
    extra = {
        "binary-prompt": ["--prompt-file", str(inp["binary"])],
        "long-prompt": ["--prompt", "x = [" + ", ".join(map(str, range(300))) + "]"],
        "nan-head": ["--policy", "specdecpp:h=0.5", "--head", str(inp["nan_head"]), "--prompt", "x = 1"],
        "typo-draft": ["--draft", str(tmp_path / "runs-typo")],  # tmp_path exists, its child does not
    }[case]
    assert cli_decode.main(_decode_argv(inp, *extra)) == 2
    assert message in one_error_line(capsys.readouterr().err, PROG)


def test_decode_truncates_a_long_prompt_only_when_asked(bench_inputs, capsys):  # noqa: F811
    long = "x = [" + ", ".join(map(str, range(300))) + "]"
    assert cli_decode.main(_decode_argv(bench_inputs, "--prompt", long, "--truncate-prompt")) == 0
    captured = capsys.readouterr()
    stats = json.loads(captured.out.strip().splitlines()[-1])
    assert stats["prompt_tokens"] == 250 and stats["prompt_truncated_from"] > 250
    assert "prompt truncated from" in captured.err


def test_bench_binary_prompt_file_is_one_line(bench_inputs, tmp_path, capsys):  # noqa: F811
    argv = _bench_argv(bench_inputs, tmp_path / "b", "--prompts", str(bench_inputs["binary"]))
    assert bench_cli.main(argv) == 2
    assert "is not UTF-8 text" in one_error_line(capsys.readouterr().err, PROG)


def test_decoder_api_refuses_bad_arguments(tiny_llama_pair):
    from acchead.inference.decoder import SpeculativeDecoder

    target, draft = tiny_llama_pair
    with pytest.raises(AccheadError, match="policy must be a spec string"):
        SpeculativeDecoder(target, draft, policy=3)  # type: ignore[arg-type]
    dec = SpeculativeDecoder(target, draft, policy="specdec:k=2")
    vocab = target.get_input_embeddings().weight.shape[0]
    with pytest.raises(AccheadError, match=f"token id {vocab} in input_ids is outside the vocabulary"):
        dec.generate(torch.tensor([1, 2, vocab]), max_new_tokens=4, temperature=0)
    with pytest.raises(AccheadError, match="outside the vocabulary"):
        dec.generate(torch.tensor([1, -3]), max_new_tokens=4, temperature=0)
    with pytest.raises(AccheadError, match=r"250 tokens \+ max_new_tokens 7 exceeds the model's 256"):
        dec.generate(torch.ones(250, dtype=torch.long), max_new_tokens=7, temperature=0)
    assert dec.generate(torch.ones(250, dtype=torch.long), max_new_tokens=6, temperature=0).tokens <= 6
    nan_head = AcceptanceHead(32, 1)
    with torch.no_grad():
        nan_head.out.bias.fill_(float("inf"))
    with pytest.raises(AccheadError, match="NaN or Inf"):
        SpeculativeDecoder(target, draft, policy="specdecpp:h=0.5", head=nan_head)
    with pytest.raises(AccheadError, match=r"non-empty \(T,\) or \(1, T\) tensor, got \(0,\)"):
        dec.generate([], max_new_tokens=4)
    with pytest.raises(AccheadError, match="decodes one sequence at a time; got batch 2"):
        dec.generate(torch.ones(2, 3, dtype=torch.long), max_new_tokens=4)
    with pytest.raises(AccheadError, match="max_new_tokens must be >= 1, got 0"):
        dec.generate([1, 2], max_new_tokens=0)
    with pytest.raises(AccheadError, match="top_p"):
        dec.generate([1, 2], max_new_tokens=2, top_p=1.5)
    with pytest.raises(AccheadError, match="temperature"):
        SpeculativeDecoder(target, draft, policy="specdec:k=2", fast=True, compile=False).warm_up(16, -1.0)
    with pytest.raises(AccheadError, match="'specdec:k=2' needs a draft model or drafter"):
        SpeculativeDecoder(target, None, policy="specdec:k=2")


def test_unreachable_hub_id_fails_fast_in_one_line(monkeypatch, tmp_path):
    import acchead.models as models

    # Fast, without timing it: one bounded probe of the hub (its default timeout, 3 s) for the hub id, none
    # for a mistyped local path, and no download attempted (the probe said unreachable).
    probes = []
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: probes.append(timeout) or False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(AccheadError, match="not in the local Hugging Face cache, and the hub is unreachable"):
        models.load_causal_lm("no-such-org-xq/no-such-model")
    assert probes == [3.0]
    with pytest.raises(AccheadError, match="model path does not exist: runs/pycode-draf"):
        models.load_causal_lm("runs/pycode-draf")  # runs/ exists: a mistyped path, not a hub id
    assert probes == [3.0]
