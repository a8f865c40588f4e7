"""The pipeline's CUDA paths: gen-data in bf16, training on a GPU, decoding and the bench on CUDA, and the
fast path (static caches + CUDA graphs) against eager decoding.

Marked `gpu` (skipped by default, and skipped without CUDA): run with `pytest -m gpu` on a GPU machine.
"""

from __future__ import annotations

import json

import pytest
import torch
from gendata_fixture import gen_data  # noqa: F401  (pytest fixture)
from test_bench import _argv, bench_inputs  # noqa: F401  (pytest fixture)
from test_gen_data_cli import PROMPTS, base_args, read_run, write_jsonl

from acchead.head import AcceptanceHead
from acchead.inference.decoder import SpeculativeDecoder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_gen_data_in_bf16_on_cuda_matches_float32(tiny_pair_dirs, tmp_path):
    """gen-data on CUDA in bfloat16 writes the contract's columns; its labels stay close to float32's."""
    from acchead.data_gen.cli import main as gen_main

    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPTS[:6])
    runs = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        assert gen_main(base_args(tiny_pair_dirs, prompts, out, "--device", "cuda", "--dtype", dtype)) == 0
        runs[dtype] = read_run(out)
    (rows32, feats32, cfg32), (rows16, feats16, cfg16) = runs["float32"], runs["bfloat16"]
    assert rows16["prompt_index"] == rows32["prompt_index"] == list(range(6))
    assert feats16.shape[1] == feats32.shape[1] and cfg16["sampling"] == cfg32["sampling"]


def test_training_on_gpu_bf16_exports_a_head(gen_data, tmp_path):  # noqa: F811
    from acchead.head_io import load_head
    from acchead.train.cli import main as train_main

    argv = ["--data", str(gen_data["data"]), "--out", str(tmp_path / "o"), "--w-rej", "6", "--depth", "2",
            "--kind", "candidate", "--epochs", "1", "--batch-size", "64", "--no-progress",
            "--accelerator", "gpu", "--precision", "bf16-mixed"]  # fmt: skip
    assert train_main(argv) == 0
    head, _ = load_head(tmp_path / "o" / "head.safetensors")
    assert all(bool(p.isfinite().all()) for p in head.parameters())


@pytest.mark.parametrize("spec", ["autoregressive", "specdec:k=3", "specdecpp:h=0.5,max=4"])
def test_fast_path_on_cuda_equals_eager(tiny_llama_pair, spec):
    """CUDA graphs over static caches give eager decoding's greedy tokens, and compile nothing after
    `warm_up`."""
    target, draft = (m.to("cuda") for m in tiny_llama_pair)
    head = AcceptanceHead(draft.config.hidden_size, depth=1).to("cuda")
    prompt = torch.tensor([5, 9, 17, 33, 2])
    eager = SpeculativeDecoder(target, draft, policy=spec, head=head, fast=False)
    fast = SpeculativeDecoder(target, draft, policy=spec, head=head)  # the default on CUDA
    assert fast.fast
    fast.warm_up(prompt.numel() + 32)
    fast.warm_up(prompt.numel() + 32, temperature=1.0)
    with torch.compiler.set_stance("fail_on_recompile"):
        got = fast.generate(prompt, max_new_tokens=32, temperature=0).new_ids.tolist()
        sampled = fast.generate(prompt, max_new_tokens=32, temperature=1.0, seed=1)
    assert got == eager.generate(prompt, max_new_tokens=32, temperature=0).new_ids.tolist()
    assert sampled.tokens == 32


@pytest.mark.parametrize("spec", ["specdec:k=3", "specdecpp:h=0.5,max=4"])
def test_fast_path_on_cuda_synchronises_only_through_host_reads(tiny_llama_pair, spec):
    """Under `set_sync_debug_mode("warn")` every stream synchronisation warns, except the counted reads of
    `acchead.inference.host_reads`: a sampled decode makes at most 2 others (the prompt's prefill, whose
    eager attention mask transformers builds with host checks), and fixed K reads once per round: stream
    syncs per decode <= rounds + 2, the device-resident loop's budget."""
    import warnings

    import acchead.inference.host_reads as host_reads

    target, draft = (m.to("cuda") for m in tiny_llama_pair)
    head = AcceptanceHead(draft.config.hidden_size, depth=1).to("cuda")
    prompt = torch.tensor([5, 9, 17, 33, 2])
    fast = SpeculativeDecoder(target, draft, policy=spec, head=head)
    fast.warm_up(prompt.numel() + 32, temperature=1.0)
    fast.generate(prompt, max_new_tokens=4, temperature=1.0, seed=1)
    reads0 = host_reads.count
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            res = fast.generate(prompt, max_new_tokens=32, temperature=1.0, seed=1)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    # Only the per-sync warnings: the first switch into the mode also warns that it is a prototype
    # ("Synchronization debug mode is a prototype feature..."), which is no sync (an H100, 2026-11-27).
    syncs = [w for w in caught if "called a synchronizing" in str(w.message)]
    assert len(syncs) <= 2, [str(w.message) for w in syncs]
    if spec.startswith("specdec:"):
        assert host_reads.count - reads0 == res.rounds


def test_bench_on_cuda_with_both_paths(bench_inputs, tmp_path):  # noqa: F811
    from acchead.inference.bench.run import main

    out = tmp_path / "bench"
    argv = [*_argv(bench_inputs, out), "--methods", "autoregressive,specdec,hf-assisted,hf-generate",
            "--k-grid", "2", "--paths", "eager,fast", "--device", "cuda"]  # fmt: skip
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["speed_by_path"]) == {"eager", "fast", "hf"}
    assert sum(g["goal"].startswith("GPU: ") for g in res["goals"]) == 3
    assert all(r["matches_autoregressive"] == 1.0 for r in res["rows"])
