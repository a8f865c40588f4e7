"""The acceptance head as the decoder calls it: one candidate per call, in as few kernels as it can.

SpecDec++ runs the head once per drafted candidate on one vector, so its cost is all per-call overhead: a
tensor op costs a few microseconds on a CPU (a launch on a GPU) whatever its size, against a budget of
~3% of a draft step (~55 µs for the demo draft on this CPU). `HeadCall` therefore:

- applies the layers as bare `addmv`/`silu`/`dot` on cached weight tensors (~2x cheaper than the module
  call, no grad-mode context of its own: the weights are detached, so no graph is built);
- builds a lookahead head's input from the candidate's `DraftStep` with views where it can (log q and the
  token's row), computing nothing the head does not read;
- folds the `token` input into the first layer: proj(x) = W_rest·x_rest + (E W_tokᵀ + b)[Y], the
  (V, H) table computed once per draft, so the token's row never goes through a matrix product or a
  concatenation (two kernels fewer per candidate; the table is the size of the draft's LM head, and is
  built only up to TOKEN_TABLE_MAX elements: past that the draft's forward dwarfs the head anyway).

Every path equals `head(x)` on the input `acchead.lookahead.lookahead_inputs` builds (pinned by tests).
The logit stays a 0-d tensor on the head's device: the stop rule accumulates it there, and the decoder
reads only the resulting stop flag (`acchead.inference.host_reads`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from acchead.errors import AccheadError
from acchead.head import AcceptanceHead
from acchead.inference.drafters import DraftStep
from acchead.lookahead import DEPTH_WIDTH, LOGQ_FLOOR, TOPK_WIDTH, input_offset, needs_stats
from acchead.models import output_embedding_table

TOKEN_TABLE_MAX = 1 << 24  # elements (64 MB in float32): the largest folded token table built
TOP_BLOCK = 64  # entries per block of `top_values`' first pass
TOP_TWO_PASS_MIN = 4096  # the shortest vector `top_values` takes in two passes on a CPU


def rows(table: torch.Tensor, token: torch.Tensor | int) -> torch.Tensor:
    """table[[token]]: (1, ...) the token's entry, by `index_select` rather than `table[token]`, which with a
    0-d tensor index reads the token back to the host (and cannot be traced into a compiled step)."""
    return table.index_select(0, torch.as_tensor(token, device=table.device).view(1))


def top_values(x: torch.Tensor, k: int) -> torch.Tensor:
    """`x.topk(k).values` of a 1-D x (n,) -> (k,), on a CPU in two passes when x is long.

    A top-k over the real pair's 12,224 head rows costs ~20 µs on one CPU thread, a quarter of the head's
    call; a block's max over blocks of 64 and a top-k over the k best blocks' entries give the same values
    in ~13 µs. Exact, ties included: a value of the top k whose block is not among the k blocks of largest
    max is matched by those k maxima, each at least as large. One top-k elsewhere: a GPU's is one kernel,
    and a compiled unit's ops cost no per-call dispatch (its graphs stay as they were).
    """
    n = x.numel()
    if x.device.type != "cpu" or torch.compiler.is_compiling() or n < max(TOP_TWO_PASS_MIN, k * TOP_BLOCK):
        return x.topk(k).values
    pad = -n % TOP_BLOCK
    if pad:  # -inf never outranks a real entry
        x = torch.cat([x, x.new_full((pad,), float("-inf"))])
    blocks = x.reshape(-1, TOP_BLOCK)  # (n / 64, 64)
    best = blocks.index_select(0, blocks.amax(1).topk(k).indices)  # (k, 64): every top-k value is here
    return best.reshape(-1).topk(k).values


class HeadCall:
    """One head evaluation per candidate: `logit(step)`; `input(step)` is the vector it reads.

    Args:
        head: a candidate or lookahead `AcceptanceHead` (put in eval mode).
    """

    def __init__(self, head: AcceptanceHead) -> None:
        self.head = head.eval()
        self.inputs = head.inputs
        self.lookahead = head.kind == "lookahead"
        self._needs_stats = needs_stats(self.inputs)
        self._out_emb: torch.Tensor | None = None  # (V, H) the draft's LM-head weight (lookahead "token")
        # A reduced-vocabulary draft's head rows: (V_d,) their token ids, (V,) each id's row or -1, and
        # the latter on the host, for a token the decoder holds as an int (the eager path).
        self._vocab: tuple[torch.Tensor, torch.Tensor, list[int]] | None = None
        self._cache_weights()

    def attach_draft(self, model: torch.nn.Module) -> None:
        """Read the draft's output embedding (a head reading "token") and fold it into the first layer; for
        a reduced-vocabulary draft (`acchead.reduced_vocab`), which token ids its head has rows for."""
        if "token" in self.inputs:
            self._out_emb = output_embedding_table(model)
            self._cache_weights()
        out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if self._needs_stats and hasattr(out, "to_full") and hasattr(out, "to_draft"):
            # log q, its entropy and top-k over the V_d rows only: every other logit is -inf (q = 0), and
            # a log-softmax and top-k over 49,152 entries cost ~6x those over 8,192 (the real pair)
            self._vocab = (out.to_full.detach(), out.to_draft.detach(), out.to_draft.tolist())

    def to(self, device: torch.device | str) -> HeadCall:
        self.head.to(device)
        if self._vocab is not None:
            to_full, to_draft, host_rows = self._vocab
            self._vocab = (to_full.to(device), to_draft.to(device), host_rows)
        self._cache_weights()
        return self

    def _cache_weights(self) -> None:
        head = self.head
        self._blocks = [(b.linear.weight.detach(), b.linear.bias.detach()) for b in head.blocks]
        self._w_out = head.out.weight.detach()[0]  # (H,)
        self._b_out = head.out.bias.detach()[0]  # 0-d: a float() here would read the device
        self._proj: tuple[torch.Tensor, torch.Tensor] | None = None  # (H, D), (H,)
        self._token_table: torch.Tensor | None = None  # (V, H)
        # the "depth" input's one-hot rows, on the head's device: row min(k - 1, 3) for candidate k
        self._depth_rows = torch.eye(DEPTH_WIDTH, device=self._w_out.device)
        self._proj_rest: torch.Tensor | None = None  # (H, D - H): proj's columns other than the token's
        if head.proj is None:
            return
        w, b = head.proj.weight.detach(), head.proj.bias.detach()
        self._proj = (w, b)
        emb = self._out_emb
        if emb is not None and emb.numel() <= TOKEN_TABLE_MAX:
            lo = input_offset(self.inputs, "token", head.hidden_size)  # the token's columns
            hi = lo + head.hidden_size
            # Row Y is W_tok @ E[Y] + b: the token's whole contribution to proj(x), bias included.
            self._token_table = torch.addmm(b, emb.to(w), w[:, lo:hi].T)
            self._proj_rest = torch.cat([w[:, :lo], w[:, hi:]], dim=1)

    def input(self, step: DraftStep) -> torch.Tensor:
        """The head's input for a candidate: (input_size,), as `acchead.lookahead` lays it out (a
        candidate head reads `step.hidden`, a lookahead head what it names of `step.state`, `step.logits` or
        `step.q`, the token and its depth)."""
        return self._input(step, with_token=True)

    def _input(self, step: DraftStep, with_token: bool) -> torch.Tensor:
        if not self.lookahead:
            if step.hidden is None:
                raise AccheadError("specdecpp needs the drafter's hidden states; this drafter returns none")
            return step.hidden
        inputs = self.inputs
        if "state" in inputs and step.state is None:
            raise AccheadError("a head reading 'state' needs the drafter's states; this drafter returns none")
        if inputs == ("state",):
            return step.state
        device = self._w_out.device  # the head's: a state-free head reads no state to take it from
        if "token" in inputs and self._out_emb is None:
            raise AccheadError("a lookahead head reading 'token' needs the draft's output embedding")
        parts = [step.state.float()] if "state" in inputs else []
        if self._needs_stats:
            # feature_logprobs: greedy keeps the logits (q is one-hot), sampling keeps q = S(q).
            source, token = step.logits.float() if step.logits is not None else step.q, step.token
            if self._vocab is not None:  # (V_d,): the entries outside add exp(-inf) = 0 to every statistic
                source = source.index_select(-1, self._vocab[0])  # on the draft's device (`to`)
                token = self._vocab[2][token] if isinstance(token, int) else rows(self._vocab[1], token)[0]
            logq = torch.log_softmax(source, -1) if step.logits is not None else source.log()
            logq = logq.clamp_min_(-LOGQ_FLOOR).to(device)  # (V,) or (V_d,)
            if "logq" in inputs:  # a host int's entry is a view (no kernel); a tensor's is gathered
                parts.append(logq[token : token + 1] if isinstance(token, int) else rows(logq, token))
            if "entropy" in inputs:
                parts.append(torch.dot(logq.exp(), logq).neg_()[None])
        if "token" in inputs and with_token:
            parts.append(rows(self._out_emb, step.token)[0].float())
        if "topk" in inputs:
            parts.append(top_values(logq, TOPK_WIDTH))
        if "depth" in inputs:  # step.index is a host int (1-based): a row of a cached table, no kernel
            parts.append(self._depth_rows[min(step.index, DEPTH_WIDTH) - 1])
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def logit(self, step: DraftStep) -> torch.Tensor:
        """The head's logit for a candidate, 0-d: `head(input(step))`, faster."""
        if self._token_table is None:
            return self.logit_of(self._input(step, with_token=True))
        x = self._input(step, with_token=False).to(self._w_out.dtype)
        return self._layers(torch.addmv(rows(self._token_table, step.token)[0], self._proj_rest, x))

    def logit_of(self, x: torch.Tensor) -> torch.Tensor:
        """The head's logit for one full input vector (input_size,), 0-d: `head(x)`, faster."""
        x = x.to(self._w_out.dtype)
        if self._proj is not None:
            x = torch.addmv(self._proj[1], self._proj[0], x)
        return self._layers(x)

    def _layers(self, x: torch.Tensor) -> torch.Tensor:
        """The residual blocks and the output layer on the projected input (H,)."""
        for w, b in self._blocks:
            # x + SiLU(W x + b); the in-place SiLU saves an allocation per block (~20% of the call).
            x = torch.add(x, F.silu(torch.addmv(b, w, x), inplace=True))
        return torch.dot(self._w_out, x) + self._b_out
