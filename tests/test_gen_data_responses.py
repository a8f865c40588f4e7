"""Labels for responses generated elsewhere (`acchead-gen-data --responses`, acchead.data_gen.responses).

The teacher-forced labels are checked against the online labels of the same responses (same streams, so
the same draft samples) and against an independent recomputation with transformers' warpers on unbatched
forwards; the command is checked end to end from its own emitted responses, with resumption, skipped
records counted, and bad input as one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from conftest import make_tiny_llama, make_tiny_tokenizer, record_forward_shapes
from test_gen_data import encode, hf_probs, make_labeler
from test_gen_data_cli import PROMPTS, REPO, read_run, write_jsonl

from acchead.data_gen import cli
from acchead.data_gen.labeler import Labeler, sample_inverse_cdf, stream_uniforms
from acchead.data_gen.responses import (
    Record,
    ResponsesSource,
    encode_responses,
    read_responses,
    select_responses,
)
from acchead.data_gen.shards import RunDir
from acchead.errors import AccheadError
from acchead.sampling import SamplingConfig

SAMPLINGS = [SamplingConfig(0.0), SamplingConfig(1.0), SamplingConfig(0.7, 20, 0.9)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
def test_labels_from_responses_equal_online_labels(tiny_llama_pair, tiny_tokenizer, sampling):
    prompts = encode(tiny_tokenizer)
    indices = [3, 1, 7, 2]
    lab = make_labeler(tiny_llama_pair, tiny_tokenizer, sampling, max_new_tokens=16, mix_ratio=0.4)
    online = lab.label(indices, prompts)
    if sampling == SamplingConfig(1.0):  # EOS ends some early: the layout for mixed lengths is exercised
        assert len({len(r.response_ids) for r in online}) > 1
    # Another batch order than online: a row does not depend on its neighbours.
    order = [2, 0, 3, 1]
    given = lab.label_responses(
        [indices[k] for k in order],
        [prompts[k] for k in order],
        [online[k].response_ids.tolist() for k in order],
    )
    for k, b in zip(order, given, strict=True):
        a = online[k]
        assert b.prompt_index == a.prompt_index and (b.prompt_ids == a.prompt_ids).all()
        for name in ("response_ids", "draft_ids", "mixed_ids", "from_draft"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        np.testing.assert_allclose(b.accept_prob, a.accept_prob, atol=1e-5, rtol=0)
        np.testing.assert_allclose(b.features.astype(np.float32), a.features, atol=2e-3, rtol=0)
        np.testing.assert_allclose(
            b.lookahead_features.astype(np.float32), a.lookahead_features, atol=2e-3, rtol=0
        )
    labels = np.concatenate([r.accept_prob for r in given])
    if sampling == SamplingConfig(1.0):
        assert ((labels > 0) & (labels < 1)).any()


@pytest.mark.parametrize("sampling", [SamplingConfig(0.0), SamplingConfig(0.8, 0, 0.95)], ids=str)
@pytest.mark.parametrize("padded_draft", [False, True], ids=["same-vocab", "draft-vocab+64"])
def test_teacher_forced_labels_match_transformers_warpers(
    tiny_llama_pair, tiny_tokenizer, sampling, padded_draft
):
    """Arbitrary responses (not the target's samples, of mixed lengths) against unbatched forwards."""
    target, draft = tiny_llama_pair
    vocab = len(tiny_tokenizer)
    if padded_draft:  # its extra tokens have p = 0 under the target
        draft = make_tiny_llama(vocab + 64, hidden_size=32, num_layers=2, seed=3, eos_token_id=0)
    prompts = encode(tiny_tokenizer)
    rng = np.random.default_rng(0)
    responses = [rng.integers(1, vocab, n).tolist() for n in (5, 12, 1, 9)]
    lab = make_labeler((target, draft), tiny_tokenizer, sampling, max_new_tokens=12)
    rows = lab.label_responses([0, 1, 2, 3], prompts, responses)
    for i, (row, prompt, resp) in enumerate(zip(rows, prompts, responses, strict=True)):
        assert row.response_ids.tolist() == resp
        p, q = hf_probs(target, prompt, resp, sampling), hf_probs(draft, prompt, resp, sampling)
        p = torch.nn.functional.pad(p, (0, q.size(-1) - p.size(-1)))
        u = torch.from_numpy(stream_uniforms(0, i, "draft", len(resp)))
        y = sample_inverse_cdf(q, u)
        assert row.draft_ids.tolist() == y.tolist()
        expected = torch.clamp(p.gather(-1, y[:, None]) / q.gather(-1, y[:, None]), max=1).squeeze(-1)
        torch.testing.assert_close(torch.from_numpy(row.accept_prob), expected, atol=1e-5, rtol=1e-5)
    if padded_draft and not sampling.greedy:
        y = np.concatenate([r.draft_ids for r in rows])
        assert (y >= vocab).any() and (np.concatenate([r.accept_prob for r in rows])[y >= vocab] == 0).all()


def test_one_teacher_forced_forward_per_model(tiny_llama_pair, tiny_tokenizer):
    target, draft = tiny_llama_pair
    calls = record_forward_shapes(target, draft)
    prompts = encode(tiny_tokenizer)
    responses = [[5] * n for n in (3, 10, 7, 1)]
    make_labeler(tiny_llama_pair, tiny_tokenizer, SamplingConfig(1.0)).label_responses(
        [0, 1, 2, 3], prompts, responses
    )
    width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    assert calls[target] == [(4, width)]  # no per-token loop: one forward over prompt + X
    feature_pass = (4, max(map(len, prompts)) + 10)  # prompt + Z, as online
    assert calls[draft] == [(4, width), feature_pass]


def test_text_round_trip_and_skip_reasons():
    tok = make_tiny_tokenizer()
    records = [
        Record("def f(x):", "    return x\n", 0),  # text, round-trips
        Record([0, 5, 6], [7, 8, 0], 1),  # ids, ends with EOS: kept
        Record("def g():", "", 2),  # empty response
        Record([], [7], 3),  # empty prompt
        Record([5], [7, 0, 8], 4),  # EOS before the end
        Record([5], [7, 9999], 5),  # outside the embeddings
        Record([5], [7] * 9, 6),  # longer than max_new_tokens 8
        Record([5] * 20, [7] * 8, 7),  # 28 > context 24
    ]
    data = encode_responses(records, tok)
    assert data.responses[0] == tok("    return x\n", add_special_tokens=False).input_ids
    assert data.prompts[0] == tok("def f(x):").input_ids and data.round_trips[0]
    kept, skipped = select_responses(data, vocab_size=len(tok), eos_ids=[0], max_new_tokens=8, context=24)
    assert kept == [0, 1]
    assert skipped == {
        "empty": 2,
        "not_round_trip": 0,
        "out_of_vocab": 1,
        "eos_inside": 1,
        "too_long": 1,
        "over_context": 1,
    }
    # A tokenizer that normalises (here: lowercases) does not give back the text it was handed.
    from tokenizers import normalizers

    lower = make_tiny_tokenizer()
    lower.backend_tokenizer.normalizer = normalizers.Lowercase()
    data = encode_responses([Record("x", "Return X"), Record("x", "return x")], lower)
    assert data.round_trips == [False, True]
    kept, skipped = select_responses(data, vocab_size=len(lower), eos_ids=[0], max_new_tokens=8, context=99)
    assert kept == [1] and skipped["not_round_trip"] == 1


def test_jsonl_and_datasets_directory_read_the_same(tmp_path):
    recs = [
        {"prompt": "def f():", "response_ids": [4, 5, 0], "prompt_index": 7},
        {"prompt": "def g():", "response_ids": [6], "prompt_index": 2},
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + "\n")  # a blank line is skipped
    from_file = read_responses(ResponsesSource(str(path)))
    datasets.Dataset.from_list(recs).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"test": datasets.Dataset.from_list(recs)}).save_to_disk(str(tmp_path / "dd"))
    assert read_responses(ResponsesSource(str(tmp_path / "ds"))) == from_file
    assert read_responses(ResponsesSource(str(tmp_path / "dd"), split="test")) == from_file
    assert [(r.prompt, r.response, r.index) for r in from_file] == [
        ("def f():", [4, 5, 0], 7),
        ("def g():", [6], 2),
    ]
    with pytest.raises(AccheadError, match="no split 'train'"):
        read_responses(ResponsesSource(str(tmp_path / "dd")))
    # Without prompt_index, a record's position is its index; --num-prompts takes the first N.
    path.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "c", "response": "d"}\n')
    assert [r.index for r in read_responses(ResponsesSource(str(path)))] == [0, 1]
    assert len(read_responses(ResponsesSource(str(path)), limit=1)) == 1


# --- the command -------------------------------------------------------------------------------------

LONG = "def g(x):\n    return " + " + ".join(f"x{i}" for i in range(200))  # no room in the 256-token context


def args_for(pair_dirs, out: Path, source: list[str], *extra: str, sampled: bool = True) -> list[str]:
    target, draft = pair_dirs
    s = ["--temperature", "0.8", "--top-p", "0.95"] if sampled else ["--temperature", "0"]
    return [
        "--target", str(target), "--draft", str(draft), *source, "--out", str(out),
        "--max-new-tokens", "8", *s, "--mix-ratio", "0.3", "--batch-size", "3", "--shard-size", "3",
        "--cache-features", "on", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def emitted(tiny_pair_dirs, tmp_path_factory) -> dict:
    """Online runs (sampled and greedy) over prompts with a skipped one, and their emitted responses."""
    root = tmp_path_factory.mktemp("emitted")
    prompts = write_jsonl(root / "prompts.jsonl", [*PROMPTS[:4], LONG, *PROMPTS[4:]])
    runs = {}
    for sampled in (True, False):
        name = "sampled" if sampled else "greedy"
        out, file = root / f"online-{name}", root / f"{name}.jsonl"
        source = ["--prompts", str(prompts)]
        argv = args_for(tiny_pair_dirs, out, source, "--emit-responses", str(file), sampled=sampled)
        assert cli.main(argv) == 0
        runs[name] = (out, file)
    return runs


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "greedy"])
def test_labels_from_emitted_responses_equal_the_online_run(tiny_pair_dirs, emitted, tmp_path, sampled):
    online_out, file = emitted["sampled" if sampled else "greedy"]
    records = [json.loads(line) for line in file.read_text().splitlines()]
    assert [r["prompt_index"] for r in records] == [0, 1, 2, 3, 5, 6, 7, 8, 9, 10]  # 4 was too long
    out = tmp_path / "from-responses"
    assert cli.main(args_for(tiny_pair_dirs, out, ["--responses", str(file)], sampled=sampled)) == 0
    a, b = read_run(online_out), read_run(out)
    for key in ("prompt_index", "prompt_ids", "response_ids", "draft_ids", "mixed_ids", "from_draft"):
        assert a[0][key] == b[0][key], key
    for x, y in zip(a[0]["accept_prob"], b[0]["accept_prob"], strict=True):
        np.testing.assert_allclose(y, x, atol=1e-5, rtol=0)
    np.testing.assert_allclose(b[1].astype(np.float32), a[1], atol=2e-3, rtol=0)
    la, lb = (np.load(o / "lookahead_features.npy") for o in (online_out, out))
    np.testing.assert_allclose(lb.astype(np.float32), la, atol=2e-3, rtol=0)
    cfg = b[2]
    assert cfg["sampling"] == a[2]["sampling"] and cfg["counts"]["positions"] == a[2]["counts"]["positions"]
    assert cfg["prompts"]["kind"] == "responses" and cfg["prompts"]["num_prompts"] == 10
    assert cfg["responses"]["labelled"] == 10 and sum(cfg["responses"]["skipped"].values()) == 0
    assert cfg["responses"]["given_as"]["response_ids"] == 10
    assert cfg["responses"]["ending_with_eos"] == sum(r["response_ids"][-1] == 0 for r in records)


def test_responses_run_resumes_after_a_crash(tiny_pair_dirs, emitted, tmp_path, monkeypatch):
    file = emitted["sampled"][1]
    ref = tmp_path / "ref"
    assert cli.main(args_for(tiny_pair_dirs, ref, ["--responses", str(file)])) == 0
    out = tmp_path / "crashy"
    real_write, written = RunDir.write_shard, []

    def crash_after_one(self, k, rows, hidden):
        if written:
            raise RuntimeError("simulated kill")
        real_write(self, k, rows, hidden)
        written.append([r.prompt_index for r in rows])

    monkeypatch.setattr(RunDir, "write_shard", crash_after_one)
    with pytest.raises(RuntimeError, match="simulated kill"):
        cli.main(args_for(tiny_pair_dirs, out, ["--responses", str(file)]))
    monkeypatch.setattr(RunDir, "write_shard", real_write)
    labelled = []
    real_label = Labeler.label_responses

    def counting(self, idx, prompts, responses):
        labelled.extend(idx)
        return real_label(self, idx, prompts, responses)

    monkeypatch.setattr(Labeler, "label_responses", counting)
    assert cli.main(args_for(tiny_pair_dirs, out, ["--responses", str(file)])) == 0
    assert sorted(labelled + written[0]) == [0, 1, 2, 3, 5, 6, 7, 8, 9, 10]
    a, b = read_run(ref), read_run(out)
    assert a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2] == b[2]
    # Another response set is another run: refused, not mixed into this one.
    other = tmp_path / "other.jsonl"
    other.write_text(file.read_text().replace('"response_ids": [', '"response_ids": [5, ', 1))
    assert cli.main(args_for(tiny_pair_dirs, out, ["--responses", str(other)])) == 2


def test_text_responses_and_skips_are_counted_and_reported(tiny_pair_dirs, tiny_tokenizer, tmp_path, capsys):
    eos = tiny_tokenizer.eos_token
    lines = [
        {"prompt": PROMPTS[0], "response": " x + 1\n" + eos},  # text, EOS as text: kept
        {"prompt": PROMPTS[1], "response": ""},  # empty
        {"prompt": PROMPTS[2], "response_ids": [7, 0, 8]},  # EOS inside
        {"prompt": PROMPTS[3], "response_ids": [7] * 9},  # longer than --max-new-tokens 8
        {"prompt": LONG, "response_ids": [7]},  # prompt + response past the context
        {"prompt": PROMPTS[4], "response_ids": [7, 10**6]},  # outside the embeddings
        {"prompt_ids": [5, 6, 7], "response_ids": [9, 9]},  # ids, no EOS: kept
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tmp_path / "out"
    assert cli.main(args_for(tiny_pair_dirs, out, ["--responses", str(path)])) == 0
    err = capsys.readouterr().err
    assert "skipping 5 of 7 responses: 1 empty prompt or response;" in err
    assert "1 an EOS token before the response's last token" in err and "1 response longer than" in err
    rows, _, cfg = read_run(out)
    assert rows["prompt_index"] == [0, 6]
    text_ids = tiny_tokenizer(" x + 1\n" + eos, add_special_tokens=False).input_ids
    assert rows["response_ids"] == [text_ids, [9, 9]] and text_ids[-1] == 0
    assert rows["prompt_ids"][1] == [5, 6, 7]
    assert cfg["responses"]["skipped"] == {
        "empty": 1, "not_round_trip": 0, "out_of_vocab": 1, "eos_inside": 1, "too_long": 1, "over_context": 1,
    }  # fmt: skip
    assert cfg["responses"]["ending_with_eos"] == 1 and cfg["prompts"]["skipped_too_long"] == 2
    # Only unlabellable responses: one line, exit 2.
    path.write_text(json.dumps(lines[1]) + "\n")
    assert cli.main(args_for(tiny_pair_dirs, tmp_path / "out2", ["--responses", str(path)])) == 2
    assert "no response can be labelled: skipping 1 of 1" in capsys.readouterr().err


OK = '{"prompt": "a", "response": "b"}\n'


@pytest.mark.parametrize(
    ("content", "name", "extra", "message"),
    [
        (None, "r.jsonl", [], "responses file not found"),
        (OK[:-2] + "\n", "r.jsonl", [], "line 1: not valid JSON"),
        ('{"prompt": "a"}\n', "r.jsonl", [], "line 1: no 'response' or 'response_ids' field"),
        ('{"response": "a"}\n', "r.jsonl", [], "no 'prompt' or 'prompt_ids' field"),
        ('{"prompt": "a", "response_ids": [1, "2"]}\n', "r.jsonl", [], "response_ids must be a list of int"),
        ('{"prompt": 3, "response": "b"}\n', "r.jsonl", [], "prompt must be a string"),
        ('["a", "b"]\n', "r.jsonl", [], "expected an object"),
        (OK.replace("}", ', "prompt_index": 1}') * 2, "r.jsonl", [], "repeats prompt_index 1"),
        (OK.replace("}", ', "prompt_index": 0}') + OK, "r.jsonl", [], "record 1 has no prompt_index"),
        (OK.replace("}", ', "prompt_index": -1}'), "r.jsonl", [], "prompt_index must be"),
        ("", "r.jsonl", [], "no responses in"),
        (OK, "r.csv", [], "must be a .jsonl file or a `datasets` directory"),
        (OK, "r.jsonl", ["--prompt-set", "humaneval"], "exactly one source"),
        (OK, "r.jsonl", ["--emit-responses", "e.jsonl"], "are the input"),
    ],
    ids=[
        "missing", "bad-json", "no-response", "no-prompt", "ids-not-ints", "prompt-not-str", "not-object",
        "duplicate-index", "partial-index", "negative-index", "empty-file", "csv", "two-sources", "emit",
    ],
)  # fmt: skip
def test_bad_responses_input_is_one_line_error(
    tiny_pair_dirs, tmp_path, capsys, content, name, extra, message
):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert cli.main(args_for(tiny_pair_dirs, tmp_path / "out", ["--responses", str(path)], *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_two_accelerate_processes_label_responses_like_one(tiny_pair_dirs, emitted, tmp_path):
    file = emitted["sampled"][1]
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli.main(args_for(tiny_pair_dirs, one, ["--responses", str(file)])) == 0
    launch = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # this process runs one thread (conftest): same kernels
    res = subprocess.run(
        [*launch, "-m", "acchead.data_gen.cli", *args_for(tiny_pair_dirs, two, ["--responses", str(file)])],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    a, b = read_run(one), read_run(two)
    assert a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_labelling_benchmark_runs_both_modes_and_they_agree(tiny_pair_dirs, tmp_path, capsys):
    from acchead.data_gen import bench_responses

    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPTS[:5])
    target, draft = (str(d) for d in tiny_pair_dirs)
    argv = ["--target", target, "--draft", draft, "--prompts", str(prompts), "--num-prompts", "5",
            "--max-new-tokens", "6", "--batch-size", "2", "--temperature", "1"]  # fmt: skip
    assert bench_responses.main(argv) == 0
    out = capsys.readouterr().out
    assert "5 prompts in 3 batches of <= 2" in out and "from responses / online:" in out
    rates = [
        float(line.split()[2]) for line in out.splitlines() if line.split()[:1] in (["online"], ["responses"])
    ]
    assert len(rates) == 2 and all(r > 0 for r in rates)
    diff = float(out.split("labels differ by at most ")[1].split(",")[0])
    assert diff <= 1e-5 and "draft tokens in 0 positions" in out


def test_overhead_benchmark_shares_the_inputs_loader(tiny_pair_dirs, tmp_path, capsys):
    """The labelling-vs-generate benchmark (`bench_overhead`) loads its models and prompts through the same
    `load_bench_inputs` as the responses benchmark, and prints its goal line."""
    from acchead.data_gen import bench_overhead

    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPTS[:3])
    target, draft = (str(d) for d in tiny_pair_dirs)
    argv = ["--target", target, "--draft", draft, "--prompts", str(prompts), "--num-prompts", "3",
            "--max-new-tokens", "4", "--batch-size", "2"]  # fmt: skip
    assert bench_overhead.main(argv) == 0
    assert "labelling overhead:" in capsys.readouterr().out
