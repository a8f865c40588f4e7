"""Where a fast-path decode step's time goes on CUDA (run on the H100 with OUT set; results in this folder).

Measures per-token wall time of `specdec:k=3`, the bare fast-path `runner.feed` of each model (token ids
from the CPU with a host sync per step as the decoder does, from the CPU without a sync, already on the
device), the GPU time of one replay (CUDA events), and a torch.profiler table of one 64-token generate.
"""

import json
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM, AutoTokenizer

from acchead.inference.decoder import SpeculativeDecoder
from acchead.inference.model_runner import make_runner
from acchead.zoo import DRAFT_DIR, TARGET_DIR
from acchead.zoo.prompts import load_prompt_set


@torch.inference_mode()  # the runners are used as the decoder uses them
def feed_times(model, prompt: torch.Tensor, res: dict, name: str) -> None:
    runner = make_runner(model, True)
    one, one_gpu = torch.tensor([5]), torch.tensor([5], device="cuda")
    for label, x, sync in (
        ("cpu ids, sync", one, True),
        ("cpu ids, no sync", one, False),
        ("device ids, no sync", one_gpu, False),
    ):
        runner.reset(prompt.numel() + 130)
        runner.feed(prompt[:-1])
        base = runner.length
        times = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(100):
                runner.rollback(base)
                logits, _ = runner.feed(x, keep=1)
                if sync:
                    int(logits[-1].argmax())
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) / 100 * 1e3)
        res[f"{name} feed ({label}) ms"] = times
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(100):
        runner.rollback(base)
        runner.feed(one_gpu, keep=1)
    end.record()
    torch.cuda.synchronize()
    res[f"{name} feed GPU-event ms"] = start.elapsed_time(end) / 100


def main() -> None:
    out = os.environ.get("OUT", "/tmp")
    target = AutoModelForCausalLM.from_pretrained(TARGET_DIR, dtype=torch.float32).to("cuda").eval()
    draft = AutoModelForCausalLM.from_pretrained(DRAFT_DIR, dtype=torch.float32).to("cuda").eval()
    tok = AutoTokenizer.from_pretrained(TARGET_DIR)
    prompt = torch.tensor(tok(load_prompt_set("humaneval")[0])["input_ids"])
    res: dict = {"prompt_tokens": int(prompt.numel())}
    dec = SpeculativeDecoder(target, draft, policy="specdec:k=3")
    dec.warm_up(prompt.numel() + 130)
    dec.generate(prompt, 128, temperature=0)
    runs = [dec.generate(prompt, 128, temperature=0) for _ in range(5)]
    res["generate specdec:k=3 ms/token"] = [r.wall_time / r.tokens * 1e3 for r in runs]
    feed_times(target, prompt, res, "target")
    feed_times(draft, prompt, res, "draft")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        r = dec.generate(prompt, 64, temperature=0)
    torch.cuda.synchronize()
    averages = prof.key_averages()
    with open(f"{out}/profile_specdec_k3.txt", "w") as f:
        f.write(f"tokens {r.tokens} rounds {r.rounds} draft_calls {r.draft_calls} ")
        f.write(f"wall {r.wall_time * 1e3:.2f} ms\n")
        f.write(averages.table(sort_by="cpu_time_total", row_limit=45))
    res["profiled generate"] = {"tokens": r.tokens, "rounds": r.rounds, "draft_calls": r.draft_calls,
                                "wall_ms": r.wall_time * 1e3}  # fmt: skip
    with open(f"{out}/step_times.json", "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
