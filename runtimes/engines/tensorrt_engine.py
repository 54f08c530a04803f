"""Every TensorRT and CUDA call mbuild makes, in one module: build a plan, load it, run it.

The builder calls build_plan() at package time on the target GPU; the runtime loads the plan into a
TrtSession, which looks like an ONNX Runtime session to the engines (run(names, feeds) -> arrays), so
the embedding and generation engines work over either backend unchanged. Tests replace this module's
edge with a fake; the real thing needs an NVIDIA GPU, its driver, `tensorrt` and `cuda-python`.

Memory handling is deliberately plain: device buffers are allocated per call and inputs/outputs go
through host memory. It is correct first; pinned staging and persistent buffers are the next step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtimes.bundle.tensorrt import TrtBuild

try:  # the optional extra: mbuild[tensorrt] on the build host, the NVIDIA base image at run time
    import tensorrt as trt

    if not hasattr(trt, "Builder"):  # type stubs alone (tensorrt-stubs) import as an empty namespace
        trt = None
except ImportError:  # pragma: no cover - depends on the host
    trt = None
try:
    from cuda.bindings import runtime as cudart
except ImportError:  # pragma: no cover - depends on the host
    cudart = None


class TensorRTUnavailable(RuntimeError):
    """TensorRT or CUDA is not importable here; the message says what to install."""


def trt_version() -> str | None:
    return str(trt.__version__) if trt is not None else None


def _require() -> None:
    if trt is None:
        raise TensorRTUnavailable("the tensorrt Python package is not installed (pip install 'mbuild[tensorrt]', or "
                                  "use an NVIDIA TensorRT base image)")
    if cudart is None:
        raise TensorRTUnavailable("cuda-python is not installed (pip install cuda-python)")


def _check(result: Any, what: str) -> Any:
    """cuda-python returns (error, value...); raise on any error."""
    error, *rest = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise RuntimeError(f"CUDA call {what} failed with error {int(error)}")
    return rest[0] if len(rest) == 1 else rest


def use_device(index: int) -> None:
    """Build and run on this GPU (an index into what NVML lists)."""
    _require()
    _check(cudart.cudaSetDevice(index), "cudaSetDevice")


def build_plan(onnx_path: Path, settings: TrtBuild, timing_cache: Path) -> bytes:
    """Parse the ONNX graph and build a serialized engine as the settings say (engine-meta.json keeps them)."""
    _require()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if settings.strongly_typed else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT cannot parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_bytes)
    config.builder_optimization_level = settings.optimization_level
    for flag in settings.precision_flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    if settings.version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, settings.hardware_compatibility)
    for shapes in settings.profiles:
        profile = builder.create_optimization_profile()
        for name, span in shapes.items():
            profile.set_shape(name, span.min, span.opt, span.max)
        config.add_optimization_profile(profile)
    cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError("TensorRT could not build an engine with these settings; see its log above")
    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    timing_cache.write_bytes(bytes(config.get_timing_cache().serialize()))
    return bytes(plan)


@dataclass(frozen=True)
class _Input:
    name: str


class TrtSession:
    """A deserialized plan with an ONNX-Runtime-shaped run(); picks the optimization profile per call."""

    def __init__(self, plan_path: Path) -> None:
        _require()
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(plan_path.read_bytes())
        if self.engine is None:
            raise RuntimeError(f"TensorRT cannot load {plan_path} (built by another TensorRT version or GPU?)")
        self.context = self.engine.create_execution_context()
        self.stream = _check(cudart.cudaStreamCreate(), "cudaStreamCreate")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.current_profile = -1

    def get_inputs(self) -> list[_Input]:
        return [_Input(name) for name in self.inputs]

    def _profile_for(self, feeds: dict[str, np.ndarray]) -> int:
        for index in range(self.engine.num_optimization_profiles):
            fits = True
            for name, array in feeds.items():
                low, _, high = self.engine.get_tensor_profile_shape(name, index)
                fits &= all(lo <= dim <= hi for lo, dim, hi in zip(low, array.shape, high, strict=True))
            if fits:
                return index
        shapes = {name: array.shape for name, array in feeds.items()}
        raise ValueError(f"no optimization profile of this engine takes the shapes {shapes}")

    def run(self, output_names: Sequence[str] | None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        profile = self._profile_for(feeds)
        if profile != self.current_profile:
            self.context.set_optimization_profile_async(profile, self.stream)
            self.current_profile = profile
        buffers: list[int] = []
        try:
            for name in self.inputs:
                array = np.ascontiguousarray(feeds[name], dtype=trt.nptype(self.engine.get_tensor_dtype(name)))
                self.context.set_input_shape(name, array.shape)
                pointer = _check(cudart.cudaMalloc(max(array.nbytes, 1)), "cudaMalloc")
                buffers.append(pointer)
                _check(cudart.cudaMemcpyAsync(pointer, array.ctypes.data, array.nbytes,
                                              cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream), "H2D")
                self.context.set_tensor_address(name, pointer)
            results = {}
            for name in self.outputs:
                shape = tuple(self.context.get_tensor_shape(name))
                host = np.empty(shape, dtype=trt.nptype(self.engine.get_tensor_dtype(name)))
                pointer = _check(cudart.cudaMalloc(max(host.nbytes, 1)), "cudaMalloc")
                buffers.append(pointer)
                self.context.set_tensor_address(name, pointer)
                results[name] = (host, pointer)
            if not self.context.execute_async_v3(self.stream):
                raise RuntimeError("TensorRT execution failed")
            for host, pointer in results.values():
                _check(cudart.cudaMemcpyAsync(host.ctypes.data, pointer, host.nbytes,
                                              cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.stream), "D2H")
            _check(cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")
        finally:
            for pointer in buffers:
                cudart.cudaFree(pointer)
        wanted = list(output_names) if output_names else self.outputs
        return [results[name][0] for name in wanted]
