// CausalAttention / CausalAttentionInt8Cache (domain ai.mbuild): GroupQueryAttention for an in-place KV cache, as
// builder/engine/decoder_graph.py writes it (rotary inside, past and present one buffer, one length per row).
//
// Why mbuild has its own: ONNX Runtime's CPU GroupQueryAttention runs each query head as a small MLAS GEMM with its
// own packing, softmax pass and probability buffer as wide as the cache, so a short query over a cache costs far more
// than its arithmetic, and each further token of a speculative verify row cost as much in attention as in the
// weights (docs/benchmarks/llm_notes.md has both kernels measured). Here all query heads sharing a KV head (and all
// of a row's new tokens) go over the cache together: each key and value is read once per KV head, dot products for
// 16 keys are summed by one transpose-add tree, and the softmax is vectorized
// (AVX-512). The numbers are GroupQueryAttention's: same rotary (rotate-half on the first 2 x cos_cache width
// channels), same scale, causal over each row's own length, int8 caches with a static scale per KV head and channel
// (what builder/engine/kv_cache_quant.py calibrates), rounded to nearest even and saturated.
//
// Inputs: 0 query [B,S,H*D] (or q|k|v packed [B,S,(H+2KV)*D] with 1 and 2 empty), 1 key, 2 value [B,S,KV*D],
// 3 past_key, 4 past_value [B,KV,M,D], 5 seqlens_k [B] (each row's length after this step - 1),
// 6 total_sequence_length [], 7 cos_cache, 8 sin_cache [P, R/2] (optional), 9 k_scale, 10 v_scale [KV,1,D] (int8).
// Outputs: 0 [B,S,H*D], 1 present_key, 2 present_value: past's buffers when the caller binds them so.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attention_simd.h"

namespace {

using namespace mbuild_attention;

constexpr int64_t ROW_CHUNK = 32;  // query rows scored at once (the scores buffer holds rows x keys)
// Past this many rows of a chunk, an int8 block is widened once into a scratch all of them read; up to it, each row
// widens it in registers. Storing and reloading 4 KB a block cost more than converting it twice: a 16-row decode
// call with 2 query heads a KV head (the ~100M shape, 80 keys) took 189 us widening once, 106-133 us in registers;
// with 4 (Llama-3.2-1B's) the scratch was still the faster, 263 us against 283.
constexpr int64_t SHARED_WIDENING = 2;

struct Shape {
  int64_t seq, heads, kv_heads, dim, buffer, past_buffer, rotary_half;
  bool packed, shared;
};

template <typename C>
struct Job {
  Shape shape;
  const float *q, *k, *v, *cos, *sin, *k_scale, *v_scale;
  const C *past_key, *past_value;
  C *present_key, *present_value;
  const int32_t* seqlens;
  float* out;
  float alpha;
};

template <typename C, int V>
void run_item(void* data, size_t index) {
  const Job<C>& job = *static_cast<const Job<C>*>(data);
  const Shape& sh = job.shape;
  const int64_t b = static_cast<int64_t>(index) / sh.kv_heads, kvh = static_cast<int64_t>(index) % sh.kv_heads;
  const int64_t d = sh.dim, group = sh.heads / sh.kv_heads, seq = sh.seq;
  const int64_t past = static_cast<int64_t>(job.seqlens[b]) + 1 - seq;
  const int64_t width = sh.packed ? (sh.heads + 2 * sh.kv_heads) * d : sh.heads * d;
  const int64_t kv_width = sh.packed ? width : sh.kv_heads * d;
  const int64_t cache_at = (b * sh.kv_heads + kvh) * sh.buffer * d;
  C* keys = job.present_key + cache_at;
  C* values = job.present_value + cache_at;
  const float* ks = job.k_scale ? job.k_scale + kvh * d : nullptr;
  const float* vs = job.v_scale ? job.v_scale + kvh * d : nullptr;
  if (!sh.shared) {  // a fresh present buffer: zeros, then the past's positions (GroupQueryAttention's own rule)
    std::memset(keys, 0, sh.buffer * d * sizeof(C));
    std::memset(values, 0, sh.buffer * d * sizeof(C));
    const int64_t past_at = (b * sh.kv_heads + kvh) * sh.past_buffer * d;
    std::memcpy(keys, job.past_key + past_at, past * d * sizeof(C));
    std::memcpy(values, job.past_value + past_at, past * d * sizeof(C));
  }
  thread_local std::vector<float> row, queries, scores, block, sums;
  row.resize(d);
  // the new keys and values, rotated and stored at past..past+seq-1
  for (int64_t s = 0; s < seq; s++) {
    const int64_t at = (b * seq + s) * kv_width;
    const float* k = sh.packed ? job.q + at + (sh.heads + kvh) * d : job.k + at + kvh * d;
    const float* v = sh.packed ? job.q + at + (sh.heads + sh.kv_heads + kvh) * d : job.v + at + kvh * d;
    std::memcpy(row.data(), k, d * sizeof(float));
    if (job.cos) rotate(row.data(), job.cos + (past + s) * sh.rotary_half, job.sin + (past + s) * sh.rotary_half,
                        sh.rotary_half);
    store(keys + (past + s) * d, row.data(), ks, d);
    store(values + (past + s) * d, v, vs, d);
  }
  // every query head of this KV head, every new token: rows r = s * group + g, rotated and scaled
  const int64_t rows = seq * group;
  queries.resize(rows * d);
  for (int64_t s = 0; s < seq; s++)
    for (int64_t g = 0; g < group; g++) {
      float* q = queries.data() + (s * group + g) * d;
      std::memcpy(q, job.q + (b * seq + s) * width + (kvh * group + g) * d, d * sizeof(float));
      if (job.cos) rotate(q, job.cos + (past + s) * sh.rotary_half, job.sin + (past + s) * sh.rotary_half,
                          sh.rotary_half);
      for (int64_t i = 0; i < d; i++) q[i] *= job.alpha * (ks ? ks[i] : 1.f);
    }
  block.resize(KEYS * d);
  auto output = [&](int64_t r) {  // query row r (token r / group, head r % group of this KV head) in the output
    return job.out + (b * seq + r / group) * sh.heads * d + (kvh * group + r % group) * d;
  };
  for (int64_t first = 0; first < rows; first += ROW_CHUNK) {
    const int64_t count = std::min(ROW_CHUNK, rows - first);
    const int64_t total = past + (first + count - 1) / group + 1;  // keys the chunk's last row sees
    const int64_t padded = (total + KEYS - 1) / KEYS * KEYS;
    scores.assign(count * padded, 0.f);
    for (int64_t j0 = 0; j0 < total; j0 += KEYS) {
      const int64_t n = std::min(KEYS, total - j0);
      // read where it lies (int8 widened in registers) unless many rows share the block's widening, or it is the
      // last, partial block (its zero padding is in the scratch)
      const bool direct = n == KEYS && (sizeof(C) == sizeof(float) || count <= SHARED_WIDENING);
      const float* kb = direct ? nullptr : widen(keys + j0 * d, n, d, block.data());
      for (int64_t r = 0; r < count; r++) {
        const int64_t seen = past + (first + r) / group + 1;
        if (j0 >= seen) continue;
        const float* q = queries.data() + (first + r) * d;
        _mm512_storeu_ps(scores.data() + r * padded + j0, kb ? dots<V>(q, kb) : dots<V>(q, keys + j0 * d));
      }
    }
    sums.resize(count);
    for (int64_t r = 0; r < count; r++) {  // softmax over the row's own keys, zeros past them
      const int64_t seen = past + (first + r) / group + 1;
      float* p = scores.data() + r * padded;
      __m512 top = _mm512_set1_ps(-INFINITY);
      for (int64_t j = 0; j < padded; j += 16) {
        const __mmask16 live = live_keys(seen, j);
        top = _mm512_mask_max_ps(top, live, top, _mm512_loadu_ps(p + j));
      }
      const __m512 most = _mm512_set1_ps(_mm512_reduce_max_ps(top));
      __m512 sum = _mm512_setzero_ps();
      for (int64_t j = 0; j < padded; j += 16) {
        const __mmask16 live = live_keys(seen, j);
        const __m512 e = _mm512_maskz_mov_ps(live, exp_ps(_mm512_sub_ps(_mm512_loadu_ps(p + j), most)));
        _mm512_storeu_ps(p + j, e);
        sum = _mm512_add_ps(sum, e);
      }
      sums[r] = _mm512_reduce_add_ps(sum);
    }
    for (int64_t r = 0; r < count; r++) {  // probabilities x values, an int8 block widened once for several rows
      float* o = output(first + r);
      std::memset(o, 0, d * sizeof(float));
    }
    for (int64_t j0 = 0; j0 < total; j0 += KEYS) {
      const int64_t n = std::min(KEYS, total - j0);
      const bool direct = sizeof(C) == sizeof(float) || count <= SHARED_WIDENING;  // a row reads its n live values
      const float* vb = direct ? nullptr : widen(values + j0 * d, n, d, block.data());
      for (int64_t r = 0; r < count; r++) {
        const int64_t seen = past + (first + r) / group + 1;
        if (j0 >= seen) continue;
        float* o = output(first + r);
        const float* p = scores.data() + r * padded + j0;
        const int64_t upto = std::min(n, seen - j0);
        vb ? weigh<V>(o, p, vb, upto) : weigh<V>(o, p, values + j0 * d, upto);
      }
    }
    for (int64_t r = 0; r < count; r++) {
      float* o = output(first + r);
      const float inverse = 1.f / sums[r];
      for (int64_t i = 0; i < d; i++) o[i] *= inverse * (vs ? vs[i] : 1.f);
    }
  }
}

template <typename C>
struct Kernel {
  int64_t heads, kv_heads, rotary;
  float scale;

  OrtStatusPtr fail(const std::string& what) const {
    return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, ("CausalAttention: " + what).c_str());
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) const {
    try {
      Ort::KernelContext context(raw);
      const Ort::ConstValue query = context.GetInput(0), key = context.GetInput(1), value = context.GetInput(2);
      const Ort::ConstValue past_key = context.GetInput(3), past_value = context.GetInput(4);
      const Ort::ConstValue seqlens = context.GetInput(5), total_input = context.GetInput(6);
      const std::vector<int64_t> qs = query.GetTensorTypeAndShapeInfo().GetShape();
      const std::vector<int64_t> ps = past_key.GetTensorTypeAndShapeInfo().GetShape();
      const bool packed = !key;
      if (qs.size() != 3 || ps.size() != 4 || ps[0] != qs[0] || ps[1] != kv_heads ||
          past_value.GetTensorTypeAndShapeInfo().GetShape() != ps)
        return fail("query must be [B,S,width] and the past caches [B,kv_num_heads,M,head_size]");
      const int64_t d = ps[3];
      if ((d != 16 && d != 32 && d != 64 && d != 128) || qs[2] != (packed ? heads + 2 * kv_heads : heads) * d)
        return fail("the query's width does not fit the heads and head size (16, 32, 64 or 128)");
      if (!packed && (!value || key.GetTensorTypeAndShapeInfo().GetShape() != std::vector<int64_t>{qs[0], qs[1], kv_heads * d} ||
                      value.GetTensorTypeAndShapeInfo().GetShape() != std::vector<int64_t>{qs[0], qs[1], kv_heads * d}))
        return fail("key and value must be [B,S,kv_num_heads*head_size]");
      if (seqlens.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(qs[0]))
        return fail("seqlens_k must hold one length per row");
      if (total_input.GetTensorTypeAndShapeInfo().GetElementCount() != 1)
        return fail("total_sequence_length must be one number");
      const int32_t* lengths = seqlens.GetTensorData<int32_t>();
      const int64_t total = total_input.GetTensorData<int32_t>()[0];
      const int64_t buffer = std::max<int64_t>(total, ps[2]);
      for (int64_t b = 0; b < qs[0]; b++)
        if (lengths[b] + 1 - qs[1] < 0 || lengths[b] + 1 > buffer)
          return fail("a row's seqlens_k is shorter than its new tokens or past the cache");
      Shape shape{qs[1], heads, kv_heads, d, buffer, ps[2], 0, packed, false};
      const float *cos = nullptr, *sin = nullptr;
      if (rotary) {
        const Ort::ConstValue c = context.GetInput(7), s = context.GetInput(8);
        const std::vector<int64_t> cs = c.GetTensorTypeAndShapeInfo().GetShape();
        if (cs.size() != 2 || 2 * cs[1] > d || s.GetTensorTypeAndShapeInfo().GetShape() != cs)
          return fail("cos_cache and sin_cache must be [positions, at most head_size/2]");
        shape.rotary_half = cs[1];
        for (int64_t b = 0; b < qs[0]; b++)
          if (lengths[b] + 1 > cs[0]) return fail("a position is past the rotary tables");
        cos = c.GetTensorData<float>();
        sin = s.GetTensorData<float>();
      }
      const float *k_scale = nullptr, *v_scale = nullptr;
      if constexpr (sizeof(C) == 1) {
        const Ort::ConstValue ksv = context.GetInput(9), vsv = context.GetInput(10);
        if (!ksv || !vsv || ksv.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(kv_heads * d) ||
            vsv.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(kv_heads * d))
          return fail("an int8 cache needs k_scale and v_scale [kv_num_heads,1,head_size]");
        k_scale = ksv.GetTensorData<float>();
        v_scale = vsv.GetTensorData<float>();
      }
      const std::vector<int64_t> present{qs[0], kv_heads, buffer, d};
      Ort::UnownedValue out = context.GetOutput(0, {qs[0], qs[1], heads * d});
      Ort::UnownedValue pk = context.GetOutput(1, present), pv = context.GetOutput(2, present);
      const C* past_k = past_key.GetTensorData<C>();
      C* present_k = pk.GetTensorMutableData<C>();
      shape.shared = past_k == present_k;
      if (shape.shared != (past_value.GetTensorData<C>() == pv.GetTensorMutableData<C>()))
        return fail("the key and value caches must both share their past buffers or neither");
      Job<C> job{shape, query.GetTensorData<float>(), packed ? nullptr : key.GetTensorData<float>(),
                 packed ? nullptr : value.GetTensorData<float>(), cos, sin, k_scale, v_scale, past_k,
                 past_value.GetTensorData<C>(), present_k, pv.GetTensorMutableData<C>(), lengths,
                 out.GetTensorMutableData<float>(), scale > 0.f ? scale : 1.f / std::sqrt(static_cast<float>(d))};
      void (*item)(void*, size_t) = d == 16 ? run_item<C, 1> : d == 32 ? run_item<C, 2> : d == 64 ? run_item<C, 4>
                                                                                          : run_item<C, 8>;
      context.ParallelFor(item, static_cast<size_t>(qs[0] * kv_heads), 0, &job);
      return nullptr;
    } catch (const std::exception& e) {
      return Ort::GetApi().CreateStatus(ORT_FAIL, (std::string("CausalAttention: ") + e.what()).c_str());
    }
  }
};

template <typename C>
struct Op : Ort::CustomOpBase<Op<C>, Kernel<C>, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    try {
      Ort::ConstKernelInfo attributes(info);
      const int64_t heads = attributes.GetAttribute<int64_t>("num_heads");
      const int64_t kv_heads = attributes.GetAttribute<int64_t>("kv_num_heads");
      const int64_t rotary = attributes.GetAttribute<int64_t>("do_rotary");
      const float scale = attributes.GetAttribute<float>("scale");
      if (heads <= 0 || kv_heads <= 0 || heads % kv_heads)
        return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, "CausalAttention: num_heads must be a positive "
                                                                "multiple of kv_num_heads");
      *kernel = new Kernel<C>{heads, kv_heads, rotary, scale};
      return nullptr;
    } catch (const std::exception& e) {
      return Ort::GetApi().CreateStatus(ORT_FAIL, (std::string("CausalAttention: ") + e.what()).c_str());
    }
  }
  const char* GetName() const { return sizeof(C) == 1 ? "CausalAttentionInt8Cache" : "CausalAttention"; }
  size_t GetInputTypeCount() const { return sizeof(C) == 1 ? 11 : 9; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    if (index == 3 || index == 4)
      return sizeof(C) == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    return index == 5 || index == 6 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return index == 1 || index == 2 || index == 7 || index == 8 ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t index) const {
    return index > 0 && sizeof(C) == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
};

}  // namespace

void mbuild_attention_ops(std::vector<OrtCustomOp*>& ops) {
  static Op<float> fp32;
  static Op<int8_t> int8;
  ops.push_back(&fp32);
  ops.push_back(&int8);
}
