"""Structured output on the shard: the tokens a constrained row may sample this step.

The router holds each request's grammar (router/structured.py) and sends, with every step, one
packed bitmask per constrained request: bit i % 32 of little-endian uint32 word i / 32 allows
token i (llguidance's layout). The shard only applies them: the sampler sets every other logit
to -inf before it chooses, so greedy, sampled and truncated rows all stay inside the grammar,
and the reported logprobs are those of the masked distribution, like every other processing
stage's (shard/sampling/sampler.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from shard.platforms import platform_of

BITS_PER_WORD = 32


@dataclass(frozen=True)
class TokenMasks:
    rows: Tensor  # [R] int64: rows of the sampled logits that are constrained
    words: Tensor  # [R, W] int32: their packed masks

    def allowed(self, vocab: int) -> Tensor:
        """[R, vocab] bool: the tokens each row may sample; ids past the mask are not allowed."""
        shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=self.words.device)
        bits = (self.words[:, :, None] >> shifts) & 1
        allowed = bits.view(bits.shape[0], -1).bool()
        if allowed.shape[1] < vocab:
            return torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
        return allowed[:, :vocab]


def gather_token_masks(
    request_ids: Sequence[int],
    constrained: Sequence[bool],
    masks: Mapping[int, bytes],
    device: torch.device,
    after_proposals: tuple[Sequence[Sequence[bytes]], Sequence[int]] | None = None,
) -> TokenMasks | None:
    """The masks of the sampled rows that are constrained (row i samples for request_ids[i]).

    `after_proposals` (speculative decoding, shard/speculation.py): for each row, the masks
    after its request's proposed tokens and how many proposals precede the row's sample; a
    sample after j > 0 of them takes the j-th of those masks instead of the step's.

    A constrained row without a mask, or with one that allows nothing, fails the step: sampling
    it unconstrained would silently break the request's grammar."""
    rows, packed = [], []
    for row, (rid, needs) in enumerate(zip(request_ids, constrained, strict=True)):
        if not needs:
            continue
        mask = masks.get(rid)
        if after_proposals is not None and after_proposals[1][row] > 0:
            mask = after_proposals[0][row][after_proposals[1][row] - 1]
        if mask is None:
            raise ValueError(f"request {rid} is constrained but the step carries no token mask")
        if len(mask) % 4 or not any(mask):
            raise ValueError(
                f"request {rid}: its token mask must be whole uint32 words allowing a token"
            )
        rows.append(row)
        packed.append(mask)
    if not rows:
        return None
    count, width = len(rows), max(len(m) for m in packed) // 4
    # The rows and the words in one host buffer, uploaded in one copy the host does not wait
    # for where the platform pins it (as a step's other inputs, shard/step_inputs.py).
    platform = platform_of(device)
    buffer = platform.host_buffer(count * (1 + width), torch.int32)
    buffer[:count] = torch.tensor(rows, dtype=torch.int32)
    words = buffer[count:].view(count, width).zero_()
    for i, mask in enumerate(packed):
        words[i, : len(mask) // 4] = torch.frombuffer(bytearray(mask), dtype=torch.int32)
    on_device = platform.upload(buffer, device)
    return TokenMasks(on_device[:count].long(), on_device[count:].view(count, width))


def apply_token_masks(scores: Tensor, masks: TokenMasks | None, owned: bool) -> Tensor:
    """scores with the tokens the masks forbid at -inf: scores itself when there are no masks
    or `owned` says it may be written, else a new tensor."""
    if masks is None:
        return scores
    if not owned:
        scores = scores.clone()
    allowed = masks.allowed(scores.shape[1])
    rows = scores.index_select(0, masks.rows).masked_fill_(~allowed, float("-inf"))
    return scores.index_copy_(0, masks.rows, rows)
