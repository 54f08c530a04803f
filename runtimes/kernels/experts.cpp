// ExpertsInt8Tiles (domain ai.mbuild): a mixture-of-experts feed-forward block whose experts are 8-bit blocks of
// 128 in MatMulInt8Tiles' layout, with ONNX Runtime's QMoE's inputs and numbers (builder/engine/decoder_moe.py).
//
// Why mbuild has its own: QMoE's CPU kernel ran a sixteen-row decode step of a Qwen3-MoE shape at 31% of this
// core's int8 peak, 68% of the step, where MatMulInt8Tiles ran the same model's dense layers at 81%
// (docs/benchmarks/step_breakdown.md). Here each expert is two linear layers on MatMulInt8Tiles' kernels: the tokens
// routed to it are gathered (their activations quantized once for every expert), so its weights are read once for
// all of them, on AMX's tiles from 10 rows where the core has them, and every expert's column groups of a projection
// are one ParallelFor. Activations are quantized per row and block of 128, as the int8 linear layers' are.
//
// Inputs: 0 x [..., H]; 1 router logits [T, E]; 2 fc1 weights, E experts of the layout for N = 2I (gate and up rows
// interleaved: gate0, up0, gate1, ...), K = H; 3 fc1 scales; 4 fc1 bias [E, 2I] (optional); 5, 6 fc2 weights and
// scales for N = H, K = I; 7 fc2 bias [E, H] (optional).
// Attributes: k, normalize_routing_weights, activation_alpha, activation_beta, swiglu_limit (optional), inter (I).
// Routing as QMoE's: softmax over the E logits, the k most probable (ties to the lower index), renormalised to sum 1
// when normalize_routing_weights is 1. Output [..., H]: over a token's experts, weight x (fc2 act(fc1 x + b1) + b2),
// act(gate, up) = (clamp(up, -limit, limit) + beta) x g sigmoid(alpha g) with g = min(gate, limit): QMoE's swiglu.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "int8_tiles.h"

namespace {

using namespace mbuild_tiles;

// Every expert's column groups of one projection as one ParallelFor: item i is group i - first[j] of jobs[j].
struct Jobs {
  std::vector<Job> jobs;
  std::vector<int64_t> first{0};  // each job's first item; the last entry is the total

  void add(const Job& job) {
    jobs.push_back(job);
    first.push_back(first.back() + (job.n + GROUP - 1) / GROUP);
  }
};

void run_item(void* data, size_t index) {
  const Jobs& all = *static_cast<const Jobs*>(data);
  const int64_t i = static_cast<int64_t>(index);
  const size_t at = static_cast<size_t>(std::upper_bound(all.first.begin(), all.first.end(), i) - all.first.begin()) - 1;
  job_group(all.jobs[at], i - all.first[at]);
}

// One projection of all experts in the layout: expert e's weights and scales start e x its size in.
struct Projection {
  const uint8_t* w;
  const float* s;
  int64_t n, k, blocks, groups;

  Projection(const Ort::ConstValue& weights, const Ort::ConstValue& scales, int64_t n_, int64_t k_)
      : w(weights.GetTensorData<uint8_t>()), s(scales.GetTensorData<float>()), n(n_), k(k_),
        blocks((k_ + BLK - 1) / BLK), groups((n_ + GROUP - 1) / GROUP) {}
  int64_t weight_bytes() const { return groups * blocks * GROUP_BLOCK_BYTES; }
  int64_t scale_count() const { return groups * blocks * GROUP; }
  bool fits(const Ort::ConstValue& weights, const Ort::ConstValue& scales, int64_t experts) const {
    return weights.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(experts * weight_bytes()) &&
           scales.GetTensorTypeAndShapeInfo().GetElementCount() == static_cast<size_t>(experts * scale_count());
  }
  Job job(const Activations& a, int64_t rows, int64_t expert, float* y, bool tiles) const {
    return Job{&a, rows, n, blocks, w + expert * weight_bytes(), s + expert * scale_count(), y, tiles};
  }
};

struct Routed {  // each expert's tokens and their weights
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<float>> weights;
};

struct Kernel {
  int64_t top, inter;
  bool normalize;
  float alpha, beta, limit;
  bool amx;

  Routed route(const float* logits, int64_t tokens, int64_t experts) const {
    Routed out{std::vector<std::vector<int64_t>>(experts), std::vector<std::vector<float>>(experts)};
    std::vector<float> p(experts);
    std::vector<int64_t> order(experts);
    for (int64_t t = 0; t < tokens; t++) {
      const float* l = logits + t * experts;
      float most = -std::numeric_limits<float>::infinity();
      for (int64_t e = 0; e < experts; e++) most = std::isnan(l[e]) ? most : std::max(most, l[e]);
      double sum = 0.;
      for (int64_t e = 0; e < experts; e++) {  // a NaN logit is never chosen
        p[e] = std::isnan(l[e]) || !std::isfinite(most) ? 0.f : std::exp(l[e] - most);
        sum += p[e];
      }
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + top, order.end(),
                        [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
      double chosen = 0.;
      for (int64_t j = 0; j < top; j++) chosen += p[order[j]];
      const double total = normalize ? chosen : sum;
      for (int64_t j = 0; j < top; j++) {
        const int64_t e = order[j];
        out.tokens[e].push_back(t);
        out.weights[e].push_back(total > 0. ? static_cast<float>(p[e] / total) : 0.f);
      }
    }
    return out;
  }

  // fc1's interleaved gate and up columns (plus bias) -> [rows][I], the activation
  void activate(const float* h, int64_t rows, const float* bias, float* out) const {
    for (int64_t r = 0; r < rows; r++)
      for (int64_t j = 0; j < inter; j++) {
        float gate = h[r * 2 * inter + 2 * j], up = h[r * 2 * inter + 2 * j + 1];
        if (bias) gate += bias[2 * j], up += bias[2 * j + 1];
        gate = std::min(gate, limit);
        up = std::max(std::min(up, limit), -limit);
        out[r * inter + j] = (up + beta) * gate / (1.f + std::exp(-alpha * gate));
      }
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) const {
    auto fail = [](const char* why) {
      return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, (std::string("ExpertsInt8Tiles: ") + why).c_str());
    };
    try {
      Ort::KernelContext context(raw);
      const Ort::ConstValue x = context.GetInput(0), logits = context.GetInput(1);
      const Ort::ConstValue w1 = context.GetInput(2), s1 = context.GetInput(3), b1 = context.GetInput(4);
      const Ort::ConstValue w2 = context.GetInput(5), s2 = context.GetInput(6), b2 = context.GetInput(7);
      const std::vector<int64_t> shape = x.GetTensorTypeAndShapeInfo().GetShape();
      const std::vector<int64_t> ls = logits.GetTensorTypeAndShapeInfo().GetShape();
      if (shape.empty() || shape.back() <= 0) return fail("x must be [..., hidden]");
      const int64_t hidden = shape.back();
      const int64_t tokens = static_cast<int64_t>(x.GetTensorTypeAndShapeInfo().GetElementCount()) / hidden;
      if (ls.size() != 2 || ls[0] != tokens || ls[1] < top) return fail("router logits must be [tokens, experts >= k]");
      const int64_t experts = ls[1];
      const Projection fc1(w1, s1, 2 * inter, hidden), fc2(w2, s2, hidden, inter);
      if (!fc1.fits(w1, s1, experts) || !fc2.fits(w2, s2, experts))
        return fail("the expert weights or scales do not fit the experts, hidden and inter sizes");
      if ((b1 && b1.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(experts * 2 * inter)) ||
          (b2 && b2.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(experts * hidden)))
        return fail("the biases must be [experts, 2 x inter] and [experts, hidden]");
      float* y = context.GetOutput(0, shape).GetTensorMutableData<float>();
      std::fill(y, y + tokens * hidden, 0.f);
      if (tokens == 0) return nullptr;
      const Routed routed = route(logits.GetTensorData<float>(), tokens, experts);

      Activations all;  // every token's x, quantized once
      quantize(x.GetTensorData<float>(), tokens, tokens, hidden, fc1.blocks, all);
      std::vector<Activations> in(experts), mid(experts);
      std::vector<std::vector<float>> h(experts), out(experts);
      Jobs first, second;
      for (int64_t e = 0; e < experts; e++) {
        const std::vector<int64_t>& rows = routed.tokens[e];
        const int64_t m = static_cast<int64_t>(rows.size());
        if (m == 0) continue;
        const bool tiles = amx && m >= AMX_FROM;
        const int64_t padded = tiles ? (m + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS : m;
        Activations& a = in[e];
        a.q.assign(padded * fc1.blocks * BLK, 0);
        a.scale.resize(m * fc1.blocks);
        a.offset.resize(m * fc1.blocks);
        for (int64_t r = 0; r < m; r++) {
          std::memcpy(a.q.data() + r * fc1.blocks * BLK, all.q.data() + rows[r] * fc1.blocks * BLK, fc1.blocks * BLK);
          std::copy_n(all.scale.data() + rows[r] * fc1.blocks, fc1.blocks, a.scale.data() + r * fc1.blocks);
          std::copy_n(all.offset.data() + rows[r] * fc1.blocks, fc1.blocks, a.offset.data() + r * fc1.blocks);
        }
        h[e].resize(m * 2 * inter);
        first.add(fc1.job(a, m, e, h[e].data(), tiles));
      }
      context.ParallelFor(run_item, static_cast<size_t>(first.first.back()), 0, &first);

      std::vector<float> act;
      for (int64_t e = 0; e < experts; e++) {
        const int64_t m = static_cast<int64_t>(routed.tokens[e].size());
        if (m == 0) continue;
        const bool tiles = amx && m >= AMX_FROM;
        act.resize(m * inter);
        activate(h[e].data(), m, b1 ? b1.GetTensorData<float>() + e * 2 * inter : nullptr, act.data());
        quantize(act.data(), m, tiles ? (m + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS : m, inter, fc2.blocks, mid[e]);
        out[e].resize(m * hidden);
        second.add(fc2.job(mid[e], m, e, out[e].data(), tiles));
      }
      context.ParallelFor(run_item, static_cast<size_t>(second.first.back()), 0, &second);

      for (int64_t e = 0; e < experts; e++) {  // in expert order: a token's sum does not depend on the threads
        const float* bias = b2 ? b2.GetTensorData<float>() + e * hidden : nullptr;
        for (size_t r = 0; r < routed.tokens[e].size(); r++) {
          float* row = y + routed.tokens[e][r] * hidden;
          const float* o = out[e].data() + r * hidden;
          const float weight = routed.weights[e][r];
          for (int64_t j = 0; j < hidden; j++) row[j] += weight * (bias ? o[j] + bias[j] : o[j]);
        }
      }
      return nullptr;
    } catch (const std::exception& e) {
      return Ort::GetApi().CreateStatus(ORT_FAIL, (std::string("ExpertsInt8Tiles: ") + e.what()).c_str());
    }
  }
};

float optional_float(const Ort::ConstKernelInfo& info, const char* name, float otherwise) {
  try {
    return info.GetAttribute<float>(name);
  } catch (const Ort::Exception&) {
    return otherwise;
  }
}

struct Op : Ort::CustomOpBase<Op, Kernel, true> {
  bool amx = false;

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    try {
      Ort::ConstKernelInfo attributes(info);
      const int64_t top = attributes.GetAttribute<int64_t>("k"), inter = attributes.GetAttribute<int64_t>("inter");
      const int64_t normalize = attributes.GetAttribute<int64_t>("normalize_routing_weights");
      const float limit = optional_float(attributes, "swiglu_limit", std::numeric_limits<float>::infinity());
      if (top <= 0 || inter <= 0 || !(limit > 0.f))
        return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, "ExpertsInt8Tiles: k, inter and swiglu_limit must "
                                                                "be positive");
      *kernel = new Kernel{top, inter, normalize != 0, optional_float(attributes, "activation_alpha", 1.f),
                           optional_float(attributes, "activation_beta", 0.f), limit, amx};
      return nullptr;
    } catch (const std::exception& e) {
      return Ort::GetApi().CreateStatus(ORT_FAIL, (std::string("ExpertsInt8Tiles: ") + e.what()).c_str());
    }
  }
  const char* GetName() const { return "ExpertsInt8Tiles"; }
  size_t GetInputTypeCount() const { return 8; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 2 || index == 5 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index == 4 || index == 7 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

// the op for a registration that may (amx) or may not use the tiles (int8_tiles.cpp's RegisterCustomOps)
void mbuild_expert_ops(std::vector<OrtCustomOp*>& ops, bool amx) {
  static Op tiles, vnni;
  Op& op = amx ? tiles : vnni;
  op.amx = amx;
  ops.push_back(&op);
}
