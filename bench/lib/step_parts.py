"""Where a served decode step goes, in two views, and the matmul work it holds.

The loop view (`loop_steps`): the runtime's own engine loop (runtimes/generation/engine_loop.py) over the bundle's
real DecoderEngine, loaded as the server loads it (GenerationRuntime), driven one tick at a time in this thread with
requests decoding in process; each tick timed whole and in its parts by wrapping the methods it calls, here only:
the scheduler's plan_step (scheduling), the engine's step and, inside it, ONNX Runtime's session call (the rest of
the step is the Python around it: packing works into runs, binding), the scheduler's apply and, inside it, each
row's next_token (sampling). What the tick spends outside those is the loop's own (its metrics). Between ticks the
events are taken off the requests' queues, as a server's readers take them, so no row pauses for its reader.

The profiler view is bench/lib/step_profile.py's: ONNX Runtime's profiler over the same engine's decode steps, ms
per op type. `parts` joins the two: the session's time in the served step split in the profiler's shares.

`matmul_flops` reads the graph: each weight matmul's FLOPs a row (2 x K x N; a mixture of experts' top-k experts),
by op type, the LM head apart, and the precision of its weights.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

import numpy as np
import onnx

from bench.lib.step_profile import HEAD
from builder.engine import int8_tiles
from runtimes.bundle import load_engine_config
from runtimes.generation import scheduler as scheduler_module
from runtimes.generation.engine_loop import EngineLoop
from runtimes.generation.loader import GenerationRuntime
from runtimes.generation.requests import Request
from runtimes.generation.sampling_request import exactly
from runtimes.kernels import ATTENTION_INT8_OP, ATTENTION_OP, EXPERTS_OP
from runtimes.metrics import Metrics
from runtimes.settings import Settings

LM_HEAD = "LM head"  # step_profile's line for the LM head's node
MATMULS = ("MatMul", "MatMulNBits", int8_tiles.OP, "DynamicQuantizeMatMul", "MoE", "QMoE", EXPERTS_OP)
ATTENTION = ("GroupQueryAttention", ATTENTION_OP, ATTENTION_INT8_OP, "MultiHeadAttention", "Attention")
EXPERTS = ("MoE", "QMoE", EXPERTS_OP)
TIMED = ("scheduling", "engine step", "ONNX Runtime", "apply", "sampling")  # what loop_steps wraps
WARM = 3  # decode ticks a batch runs before the timed ones
SPARE = 16  # tokens a request may still make after the timed ticks: rows start decoding a few ticks apart
T = TypeVar("T")


def _timed(spent: dict[str, float], part: str, call: Callable[..., T]) -> Callable[..., T]:
    def timed(*args: Any, **kwargs: Any) -> T:
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - started
    return timed


def loop_steps(model_dir: Path, batches: Sequence[int], context: int, steps: int,
               warm: int = WARM) -> dict[str, dict[str, float]]:
    """Per batch, ms of a decode tick with that many requests decoding, each after a prompt of `context` random ids,
    whole ("step") and in TIMED's parts: the mean over `steps` ticks after `warm`, one intra-op thread on the
    calling thread's cores. The batches run one after another on one runtime, each request greedy (exactly())."""
    config = load_engine_config(model_dir)
    settings = dataclasses.replace(Settings.from_env({}), model_dir=model_dir, threads=1, max_queue=1024)
    runtime = GenerationRuntime.load(model_dir, config, settings, Metrics())
    runtime.engine.warm_up()
    loop, engine = runtime.engine_loop, runtime.engine
    spent: dict[str, float] = defaultdict(float)
    with ExitStack() as stack:
        for owner, name, part in ((loop.scheduler, "plan_step", "scheduling"), (engine, "step", "engine step"),
                                  (engine.session, "run_with_iobinding", "ONNX Runtime"),
                                  (loop.scheduler, "apply", "apply"), (scheduler_module, "next_token", "sampling")):
            stack.enter_context(mock.patch.object(owner, name, _timed(spent, part, getattr(owner, name))))
        return {str(batch): _decode(loop, spent, batch, context, steps, warm, config.decoder.vocab_size)
                for batch in batches}


def _decode(loop: EngineLoop, spent: dict[str, float], batch: int, context: int, steps: int, warm: int,
            vocab: int) -> dict[str, float]:
    events = asyncio.new_event_loop()  # the requests' loop: never run but to hand their events over
    rng = np.random.default_rng(batch)
    requests = [Request(rng.integers(3, vocab, context).tolist(), exactly(warm + steps + SPARE), events,
                        asyncio.Queue()) for _ in range(batch)]
    loop.submit(requests)
    ticks: list[dict[str, float]] = []
    try:
        for _ in range(warm + steps + 4 * batch + 64):  # the prompts' ticks, then the decode ticks
            spent.clear()
            started = time.perf_counter()
            plan = loop.tick()
            spent["step"] = time.perf_counter() - started
            _read(events, requests)
            if len(plan.of("decode")) == len(plan.rows) == batch:
                ticks.append(dict(spent))
            if len(ticks) == warm + steps:
                break
        else:
            raise RuntimeError(f"{batch} requests gave {len(ticks)} decode steps of {batch} rows, not {warm + steps}")
    finally:
        for request in requests:
            request.cancelled = True
        loop.tick()  # ends them
        events.close()
    return {part: 1000 * statistics.fmean(tick.get(part, 0.0) for tick in ticks[warm:]) for part in ("step", *TIMED)}


def _read(events: asyncio.AbstractEventLoop, requests: list[Request]) -> None:
    """What a server's readers do between steps: the posted events reach their queues and are taken."""
    events.run_until_complete(asyncio.sleep(0))
    for request in requests:
        while not request.events.empty():
            request.events.get_nowait()
            request.taken += 1


def kind(op: str) -> tuple[int, str]:
    """The breakdown's line of a profiled op type (or step_profile's LM head), after its rank in the table."""
    if op in MATMULS:
        return 0, f"matmuls: {op}"
    if op == LM_HEAD:
        return 1, LM_HEAD
    return (2, "attention") if op in ATTENTION else (3, "other ONNX Runtime ops")


def parts(loop: dict[str, float], profile: dict[str, Any]) -> dict[str, float]:
    """One step's parts in ms, summing to the loop's step: ONNX Runtime's session time in it (loop["ONNX Runtime"])
    split in the profiler's shares of its own session time (profile["step_ms"]): each matmul op type, the LM head,
    attention, the other ops, and the session's time between its kernels; then the Python around the session call,
    scheduling, sampling, the rest of apply (a row's events, metrics) and the rest of the loop's tick."""
    scale = loop["ONNX Runtime"] / profile["step_ms"]
    found: dict[str, float] = defaultdict(float)
    for op, ms in sorted(profile["ops_ms"].items(), key=lambda item: (kind(item[0]), -item[1])):
        found[kind(op)[1]] += ms * scale
    found["ONNX Runtime between its kernels"] = loop["ONNX Runtime"] - sum(found.values())
    found["Python around the session call"] = loop["engine step"] - loop["ONNX Runtime"]
    found["scheduling"] = loop["scheduling"]
    found["sampling"] = loop["sampling"]
    found["apply, less sampling"] = loop["apply"] - loop["sampling"]
    found["the loop's rest"] = loop["step"] - loop["scheduling"] - loop["engine step"] - loop["apply"]
    return dict(found)


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _precision(node: onnx.NodeProto) -> str:
    found = _attributes(node)
    bits = found.get("bits", found.get("expert_weight_bits"))
    if bits is not None:
        return f"int{bits}"
    return "int8" if node.op_type in (int8_tiles.OP, "DynamicQuantizeMatMul", EXPERTS_OP) else "fp32"


def _node_flops(node: onnx.NodeProto, shapes: dict[str, list[int]]) -> float:
    """A row's FLOPs through the node's weights: 2 x K x N; an experts node's k experts, each fc1 and fc2."""
    found = _attributes(node)
    if "K" in found and "N" in found:
        return 2.0 * found["K"] * found["N"]
    if node.op_type == EXPERTS_OP:  # [E, groups, blocks, 32, 64, 4]: 64 columns by 128 k a group's block, padding in
        each = sum(group * block * int8_tiles.GROUP * int8_tiles.BLOCK
                   for _, group, block, *_ in (shapes[node.input[2]], shapes[node.input[5]]))
        return 2.0 * found["k"] * each
    if node.op_type in EXPERTS:
        unpacked = 8 // found.get("expert_weight_bits", 8)  # QMoE's [E, N, K x bits / 8] bytes; MoE's [E, N, K]
        fc1, fc2 = shapes[node.input[2]], shapes[node.input[5 if node.op_type == "QMoE" else 4]]
        each = sum(rows * columns * unpacked for _, rows, columns in (fc1, fc2))
        return 2.0 * found["k"] * each
    weight = shapes.get(node.input[1])
    return 2.0 * float(np.prod(weight)) if weight is not None else 0.0  # a product of two activations: none


def matmul_flops(model: Path) -> dict[str, dict[str, Any]]:
    """Per matmul op type of the graph (the LM head apart, as step_profile names it): FLOPs a row (a token) through
    its nodes' weights, its nodes, and the precision of their weights (fp32, int8, int4)."""
    graph = onnx.load(str(model), load_external_data=False).graph
    shapes = {tensor.name: list(tensor.dims) for tensor in graph.initializer}
    found: dict[str, dict[str, Any]] = {}
    for node in graph.node:
        if node.op_type in MATMULS:
            entry = found.setdefault(LM_HEAD if node.name == HEAD else node.op_type,
                                     {"op": node.op_type, "precision": _precision(node), "nodes": 0, "flops": 0.0})
            entry["nodes"] += 1
            entry["flops"] += _node_flops(node, shapes)
    return found


def rates(flops: dict[str, dict[str, Any]], profile: dict[str, Any], rows: int,
          peaks: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Per matmul line of the profile: its GFLOP a step at `rows` rows, its kernels' ms (the profiler's), the GFLOP/s
    they reached, and that as a share of the core's peak at its precision (None where none was measured)."""
    found = {}
    for key, entry in flops.items():
        ms = profile["ops_ms"].get(key)
        if ms and entry["flops"]:
            gflops = entry["flops"] * rows / ms / 1e6
            peak = peaks.get(entry["precision"])
            found[key] = {**entry, "gflop": entry["flops"] * rows / 1e9, "ms": ms, "gflops": gflops,
                          "peak_share": gflops / peak if peak else None}
    return found
