"""The grown-cache trace's lengths (builder/engine/generic/axes.py): a graph torch.export traced for some lengths
only is refused with what it assumed, and a max of lengths (an alibi table sliced by max(0, size - keys)) traces as
the slice it is. Small modules with the grown graph's inputs, exported by torch.export as grown.py has them
exported."""

from __future__ import annotations

from typing import Any

import torch
from torch.export import Dim
from torch.fx.experimental import _config as fx_config

from builder.engine.generic import axes

HALF = 64  # each of new tokens and past at most half the context, as grown.py bounds them


class _Model(torch.nn.Module):
    """The grown graph's inputs; what it computes over the keys' scores is `over`'s to say."""

    def __init__(self, over: Any) -> None:
        super().__init__()
        self.over = over
        self.table = torch.nn.Buffer(torch.arange(2 * HALF, dtype=torch.float32))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                logits_at: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        keys = torch.cat([past, torch.ones(past.shape[0], past.shape[1], input_ids.shape[1], past.shape[3])], 2)
        scores = self.over(self, keys.sum(-1), input_ids, attention_mask)
        return scores.sum(-1)[:, :, None] + logits_at.sum() + position_ids.sum()


def _masked(model: _Model, scores: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return scores + mask[:, None, -scores.shape[-1]:]  # a mask over past and new, as the engine passes it


def _top_past_a_window(model: _Model, scores: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if scores.shape[-1] > 16:  # a branch on the keys' count: torch.export traces the example's side
        return scores.topk(16, -1).values
    return scores


def _masked_as_long_as_the_input(model: _Model, scores: torch.Tensor, ids: torch.Tensor,
                                 mask: torch.Tensor) -> torch.Tensor:
    return scores[..., -ids.shape[1]:] * mask[:, None, :]  # code that takes the whole sequence each step


def _alibi_slice(model: _Model, scores: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """MPT's alibi: a context-long table [1, 1, T] cut to the queries and keys by max(0, size - count)."""
    bias, queries = model.table.view(1, 1, -1), ids.shape[1] + scores.shape[-1]
    bias = bias[:, max(0, bias.shape[1] - queries):, max(0, bias.shape[2] - scores.shape[-1]):]
    return (scores[:, :, None, :] + bias).sum(2)


def _exported(over: Any, mask: int = 8) -> Any:
    """torch.export's program of the module, traced as torch.onnx's exporter traces it (non-strict, sizes 0 and 1
    not special) over grown.py's bounds, with a mask over past and new unless told its length."""
    batch, new, past = 2, 3, 5
    example = (torch.ones(batch, new, dtype=torch.long), torch.ones(batch, mask),
               torch.ones(batch, new, dtype=torch.long), torch.tensor([0, 1]), torch.zeros(batch, 2, past, 4))
    length = Dim.DYNAMIC(min=1, max=HALF)
    shapes = ({0: Dim.DYNAMIC, 1: length}, {0: Dim.DYNAMIC, 1: Dim.DYNAMIC(min=1, max=2 * HALF)},
              {0: Dim.DYNAMIC, 1: length}, {0: Dim.DYNAMIC}, {0: Dim.DYNAMIC, 2: Dim.DYNAMIC(min=0, max=HALF)})
    with axes.guarded_extremes(), fx_config.patch(backed_size_oblivious=True):  # type: ignore[attr-defined]
        return torch.export.export(_Model(over), example, dynamic_shapes=shapes, strict=False)


def test_a_graph_for_every_length_is_kept() -> None:
    assert axes.refusal(_exported(_masked), HALF) is None


def test_a_slice_by_a_max_of_lengths_traces_for_every_length() -> None:
    assert axes.refusal(_exported(_alibi_slice), HALF) is None


def test_a_branch_on_the_length_is_refused_with_the_lengths_traced() -> None:
    said = axes.refusal(_exported(_top_past_a_window), HALF) or ""
    assert "branches on the sequence's length" in said and "tokens only" in said, said


def test_a_mask_as_long_as_the_new_tokens_is_refused() -> None:
    said = axes.refusal(_exported(_masked_as_long_as_the_input, mask=3), HALF) or ""
    assert "takes the whole sequence each step" in said, said
