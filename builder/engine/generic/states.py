"""Recurrent state in the grown-cache form: models whose layers keep a fixed-size state per sequence (Mamba's
and other state-space layers, linear attention, short convolutions), alone or beside attention layers.

transformers keeps those states in its Cache, through one API whatever the layer computes (cache_utils'
LinearAttentionCacheLayerMixin: conv_states and recurrent_states, a few per layer, read back with
get_conv_state / get_recurrent_state and written with update_conv_state / update_recurrent_state), and builds
the cache's layers from the config (`DynamicCache(config=...)`). So the trace needs no model's code of its own:
the cache is built inside the traced forward from the graph's inputs, `state.{j}` beside `past.{i}.key/value`,
with every state marked as already holding a sequence, and the states it holds after the model ran are the
`present_state.{j}` outputs. A new sequence starts from zero states, which is what a layer's first step computes
(a convolution padded with zeros, a scan from zero); so one trace serves a prompt's first run and every later
one, and the modeling code's one-token branch (taken on a single new token) is not traced: the general branch
computes the same for one token.

The runtime (runtimes/engines/states.py) keeps a state per slot, zeroes it for a new sequence, and runs no
padding through it: a padded position would advance a state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import (
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionAndSlidingWindowAttentionLayer,
    LinearAttentionCacheLayerMixin,
)

from builder.errors import UnsupportedModel

KINDS = ("conv", "recurrent")


@dataclass(frozen=True)
class State:
    """One state tensor of the cache: the layer it belongs to, conv or recurrent, its index in the layer, and its
    shape past the batch axis."""

    layer: int
    kind: str
    index: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """Which of the cache's layers hold keys and values (the graph's past.{i}, in this order), and its states."""

    keyed: tuple[int, ...]
    states: tuple[State, ...]


def has_states(config: Any) -> bool:
    """Whether transformers builds this model's cache with layers that keep a recurrent state."""
    try:
        cache = DynamicCache(config=config)
    except Exception:  # a config the cache's layer dispatch does not read: not a model of this API
        return False
    return any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers)


def cache(config: Any) -> DynamicCache:
    """The model's cache with each sliding-window layer as a full one: the graph's present is past + new, every
    position (the model's own mask applies the window), where a sliding layer would drop the oldest."""
    built = DynamicCache(config=config)
    for i, layer in enumerate(built.layers):
        if isinstance(layer, LinearAttentionAndSlidingWindowAttentionLayer):
            built.layers[i] = LinearAttentionAndFullAttentionLayer(number_of_states=layer.number_of_states)
        elif isinstance(layer, DynamicSlidingWindowLayer):
            built.layers[i] = DynamicLayer()
    return built


def layout(probed: DynamicCache) -> Layout:
    """What a model's cache held after the probe's steps (grown.probe)."""
    keyed = tuple(i for i, layer in enumerate(probed.layers) if getattr(layer, "keys", None) is not None
                  and getattr(layer, "is_initialized", False))
    states = []
    for i, layer in enumerate(probed.layers):
        if not isinstance(layer, LinearAttentionCacheLayerMixin):
            continue
        for index in range(layer.number_of_states):
            for kind in KINDS:
                held = getattr(layer, f"{kind}_states")[index]
                if held is not None:
                    states.append(State(i, kind, index, tuple(int(d) for d in held.shape[1:])))
    if not states:
        raise UnsupportedModel("its cache's recurrent layers kept no state after a step (its modeling code keeps "
                               "its state outside transformers' Cache), which mbuild's engines cannot carry")
    return Layout(keyed, tuple(states))


def fill(built: DynamicCache, plan: Layout, past: tuple[torch.Tensor, ...], states: tuple[torch.Tensor, ...]) -> None:
    """The traced forward's cache: each keyed layer's past, each state from its input (a copy: the layers update
    their states in place), every state marked as following a step."""
    layers: list[Any] = built.layers  # each of transformers' layer classes: attention, linear, or both
    for n, i in enumerate(plan.keyed):
        layers[i].update(past[2 * n], past[2 * n + 1])
    for state, value in zip(plan.states, states, strict=True):
        layer = layers[state.layer]
        # set as the layer's lazy_initialization would, without its zeros (and its marking for cudagraphs)
        getattr(layer, f"{state.kind}_states")[state.index] = value.clone()
        getattr(layer, f"is_{state.kind}_states_initialized")[state.index] = True
        if state.kind == "conv":
            layer.conv_kernel_size[state.index] = value.shape[-1]
        layer.dtype, layer.device = value.dtype, value.device
        layer.has_previous_state[state.index] = True


def presents(built: DynamicCache, plan: Layout) -> list[torch.Tensor]:
    """Each keyed layer's keys and values, then each state, in the graph's order."""
    layers: list[Any] = built.layers
    kv = [t for i in plan.keyed for t in (layers[i].keys, layers[i].values)]
    return kv + [getattr(layers[s.layer], f"{s.kind}_states")[s.index] for s in plan.states]
