// MatMulInt8Tiles (domain ai.mbuild): Y[..., N] = A[..., K] x W, W in symmetric int8 blocks of 128 along K.
//
// Why mbuild has its own kernel: ONNX Runtime's MatMulNBits (8 bits, accuracy_level 4, the int8 default) reads one
// row at the core's memory rate but takes each further row at a fraction of the core's int8 rate, so a speculative
// verify row of 5 tokens costs well over one token's (docs/benchmarks/matmul_rows.md); DynamicQuantizeMatMul takes
// further rows faster but one row slower, and both in one graph would hold the weights twice. This kernel streams
// each weight vector once and applies it to up to ROWS rows with VNNI, so rows 2 to 5 ride on the weight read. Same
// numbers as MatMulNBits: activations quantized per row and block of 128 to int8 (scale max/127, round to nearest
// even), int32 dot products, one float scale per block; only the order of float sums differs.
//
// Weights, written by builder/engine/int8_tiles.py: columns in groups of 64 (N padded), and per group, per block of
// 128 k, per quad of 4 consecutive k, 64 columns x 4 bytes: W[g][b][q][c][j] = w[64g + c][128b + 4q + j] + 128
// (unsigned, as MatMulNBits stores them). Scales S[g][b][c] = scale of column 64g + c in block b.
// vpdpbusd multiplies unsigned by signed bytes: the +128 offset comes back out as 128 x the block's activation sum.
//
// On a core with AMX (Intel's tile unit, Sapphire Rapids on), 10 rows or more go to its tiles: one TDPBSUD takes 16
// rows x 64 k x 16 columns, where VNNI pays each row's multiply-adds (matmul_rows.md's VNNI-only arm beside it: at 8
// and 9 rows the tiles were no faster, as the weight read bounds both, and from 10 faster, so a one-stream verify row
// of 8 drafts stays on VNNI; ONNX Runtime's AMX kernel for per-column scales does better
// still, as a block's float sums here cost about what its tiles do). The tiles read the same weight layout (a quad's
// 16 columns x 4 bytes are a B-tile row, 256 bytes apart) and make the same int32 dots, summed in the same order:
// both paths give the same bits. A session whose options hold the entry mbuild.no_amx=1 (runtimes/kernels'
// NO_AMX_ENTRY, set by MBUILD_NO_AMX) before the library registers stays on VNNI.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "int8_tiles.h"

namespace mbuild_tiles {

void quantize(const float* a, int64_t rows, int64_t padded, int64_t k, int64_t blocks, Activations& out) {
  out.q.assign(padded * blocks * BLK, 0);
  out.scale.assign(rows * blocks, 0.f);
  out.offset.assign(rows * blocks, 0);
  for (int64_t m = 0; m < rows; m++)
    for (int64_t b = 0; b < blocks; b++) {
      const float* x = a + m * k + b * BLK;
      const int64_t n = std::min(BLK, k - b * BLK);
      __m512 v[BLK / 16];
      __m512 top = _mm512_setzero_ps();
      for (int64_t i = 0; i < BLK / 16; i++) {
        const int64_t left = n - i * 16;
        const __mmask16 mask = left >= 16 ? 0xFFFF : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
        v[i] = _mm512_maskz_loadu_ps(mask, x + i * 16);
        top = _mm512_max_ps(top, _mm512_abs_ps(v[i]));
      }
      const float most = _mm512_reduce_max_ps(top);
      const __m512 inverse = _mm512_set1_ps(most > 0.f ? 127.f / most : 0.f);
      __m512i sum = _mm512_setzero_si512();
      int8_t* q = out.q.data() + (m * blocks + b) * BLK;
      for (int64_t i = 0; i < BLK / 16; i++) {
        const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], inverse));
        sum = _mm512_add_epi32(sum, r);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i * 16), _mm512_cvtsepi32_epi8(r));
      }
      out.scale[m * blocks + b] = most / 127.f;
      out.offset[m * blocks + b] = 128 * _mm512_reduce_add_epi32(sum);
    }
}

namespace {

// R rows by one group of 64 columns: each 64-byte weight vector is loaded once and used by all R rows.
template <int R>
void group_rows(const Activations& a, int64_t row, int64_t blocks, const uint8_t* w, const float* s,
                float out[ROWS][GROUP]) {
  __m512 acc[R][TILES];
  for (int r = 0; r < R; r++)
    for (int t = 0; t < TILES; t++) acc[r][t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; b++) {
    __m512i dot[R][TILES];
    for (int r = 0; r < R; r++)
      for (int t = 0; t < TILES; t++) dot[r][t] = _mm512_setzero_si512();
    const uint8_t* p = w + b * GROUP_BLOCK_BYTES;
    const int32_t* x[R];
    for (int r = 0; r < R; r++) x[r] = reinterpret_cast<const int32_t*>(a.q.data() + ((row + r) * blocks + b) * BLK);
#pragma GCC unroll 2
    for (int64_t q = 0; q < QUADS; q++) {
      __m512i v[TILES];
      for (int t = 0; t < TILES; t++) v[t] = _mm512_loadu_si512(p + (q * TILES + t) * 64);
      for (int t = 0; t < TILES; t++) _mm_prefetch(reinterpret_cast<const char*>(p + (q * TILES + t) * 64 + 4096), _MM_HINT_T1);
      for (int r = 0; r < R; r++) {
        const __m512i y = _mm512_set1_epi32(x[r][q]);
        for (int t = 0; t < TILES; t++) dot[r][t] = _mm512_dpbusd_epi32(dot[r][t], v[t], y);
      }
    }
    for (int r = 0; r < R; r++) {
      const int64_t at = (row + r) * blocks + b;
      const __m512i offset = _mm512_set1_epi32(a.offset[at]);
      const __m512 scale = _mm512_set1_ps(a.scale[at]);
      for (int t = 0; t < TILES; t++) {
        const __m512 ws = _mm512_mul_ps(_mm512_loadu_ps(s + b * GROUP + t * TILE), scale);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dot[r][t], offset)), ws, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; r++)
    for (int t = 0; t < TILES; t++) _mm512_storeu_ps(out[r] + t * TILE, acc[r][t]);
}

// The group's rows on the tiles, 16 at a time. The tile configuration is the thread's, set for each group as ONNX
// Runtime's own kernels may set theirs on the thread between our calls; it is not released after (a release per
// group made a verify row of 5 take 1.7x as long in a 100M model's step).
void tile_group(const Job& job, const uint8_t* w, const float* s, int64_t g, int64_t columns) {
  alignas(64) float out[AMX_ROWS][GROUP];
  configure_tiles();
  for (int64_t row = 0; row < job.rows; row += AMX_ROWS) {
    const int64_t count = std::min(AMX_ROWS, job.rows - row);
    tile_rows(*job.a, row, count, job.blocks, w, s, out[0]);
    for (int64_t r = 0; r < count; r++)
      std::memcpy(job.y + (row + r) * job.n + g * GROUP, out[r], columns * sizeof(float));
  }
}

}  // namespace

void job_group(const Job& job, int64_t g) {
  const uint8_t* w = job.w + g * job.blocks * GROUP_BLOCK_BYTES;
  const float* s = job.s + g * job.blocks * GROUP;
  const int64_t columns = std::min(GROUP, job.n - g * GROUP);
  if (job.amx) return tile_group(job, w, s, g, columns);
  alignas(64) float out[ROWS][GROUP];
  for (int64_t row = 0; row < job.rows; row += ROWS) {
    const int64_t count = std::min(ROWS, job.rows - row);
    switch (count) {
      case 5: group_rows<5>(*job.a, row, job.blocks, w, s, out); break;
      case 4: group_rows<4>(*job.a, row, job.blocks, w, s, out); break;
      case 3: group_rows<3>(*job.a, row, job.blocks, w, s, out); break;
      case 2: group_rows<2>(*job.a, row, job.blocks, w, s, out); break;
      default: group_rows<1>(*job.a, row, job.blocks, w, s, out);
    }
    for (int64_t r = 0; r < count; r++)
      std::memcpy(job.y + (row + r) * job.n + g * GROUP, out[r], columns * sizeof(float));
  }
}

void run_group(void* data, size_t index) { job_group(*static_cast<const Job*>(data), static_cast<int64_t>(index)); }

}  // namespace mbuild_tiles

namespace {

using namespace mbuild_tiles;  // the layout's names (int8_tiles.h), shared with the AMX path and the experts

struct Kernel {
  int64_t k, n;
  bool amx;  // this core's tiles may be used

  OrtStatusPtr ComputeV2(OrtKernelContext* raw) const {
    try {
      Ort::KernelContext context(raw);
      const Ort::ConstValue a = context.GetInput(0), w = context.GetInput(1), s = context.GetInput(2);
      std::vector<int64_t> shape = a.GetTensorTypeAndShapeInfo().GetShape();
      if (shape.empty() || shape.back() != k)
        return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, "MatMulInt8Tiles: A's last dimension is not K");
      const int64_t blocks = (k + BLK - 1) / BLK, groups = (n + GROUP - 1) / GROUP;
      if (w.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(groups * blocks * GROUP_BLOCK_BYTES) ||
          s.GetTensorTypeAndShapeInfo().GetElementCount() != static_cast<size_t>(groups * blocks * GROUP))
        return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, "MatMulInt8Tiles: W or S does not fit K and N");
      const int64_t rows = static_cast<int64_t>(a.GetTensorTypeAndShapeInfo().GetElementCount()) / k;
      shape.back() = n;
      Ort::UnownedValue y = context.GetOutput(0, shape);
      if (rows == 0) return nullptr;
      const bool tiles = amx && rows >= AMX_FROM;
      Activations activations;
      quantize(a.GetTensorData<float>(), rows, tiles ? (rows + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS : rows, k, blocks,
               activations);
      Job job{&activations, rows, n, blocks, w.GetTensorData<uint8_t>(), s.GetTensorData<float>(),
              y.GetTensorMutableData<float>(), tiles};
      context.ParallelFor(run_group, static_cast<size_t>(groups), 0, &job);
      return nullptr;
    } catch (const std::exception& e) {
      return Ort::GetApi().CreateStatus(ORT_FAIL, (std::string("MatMulInt8Tiles: ") + e.what()).c_str());
    }
  }
};

struct Op : Ort::CustomOpBase<Op, Kernel, true> {
  bool amx = false;  // its kernels may use the tiles

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    try {
      Ort::ConstKernelInfo attributes(info);
      const int64_t k = attributes.GetAttribute<int64_t>("K"), n = attributes.GetAttribute<int64_t>("N");
      if (k <= 0 || n <= 0) return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, "MatMulInt8Tiles: K and N must be positive");
      *kernel = new Kernel{k, n, amx};
      return nullptr;
    } catch (const std::exception& e) {
      return Ort::GetApi().CreateStatus(ORT_FAIL, (std::string("MatMulInt8Tiles: ") + e.what()).c_str());
    }
  }
  const char* GetName() const { return "MatMulInt8Tiles"; }
  size_t GetInputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    return index == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
};

}  // namespace

void mbuild_attention_ops(std::vector<OrtCustomOp*>& ops);  // attention.cpp
void mbuild_expert_ops(std::vector<OrtCustomOp*>& ops, bool amx);  // experts.cpp

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options,
                                                                                           const OrtApiBase* base) {
  Ort::InitApi(base->GetApi(ORT_API_VERSION));
  // Checked here, not trusted: on a CPU without these the first step would die of an illegal instruction.
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vnni"))
    return Ort::GetApi().CreateStatus(ORT_FAIL, "MatMulInt8Tiles needs a CPU with AVX-512 BW and VNNI; "
                                                "package this model for this CPU (mbuild package --gpu cpu)");
  // Two domains of the same ops, one per choice: ORT hands a registration the session's options, not the kernels.
  static Op tiles, vnni;
  static OrtCustomOpDomain* domains[2] = {nullptr, nullptr};
  const OrtApi& api = Ort::GetApi();
  int has_entry = 0;
  if (OrtStatus* status = api.HasSessionConfigEntry(options, "mbuild.no_amx", &has_entry)) return status;
  const int choice = has_entry ? 1 : 0;
  if (domains[choice] == nullptr) {
    Op& op = choice ? vnni : tiles;
    op.amx = !choice && amx_granted();
    std::vector<OrtCustomOp*> ops{&op};
    mbuild_attention_ops(ops);
    mbuild_expert_ops(ops, op.amx);
    if (OrtStatus* status = api.CreateCustomOpDomain("ai.mbuild", &domains[choice])) return status;
    for (OrtCustomOp* each : ops)
      if (OrtStatus* status = api.CustomOpDomain_Add(domains[choice], each)) return status;
  }
  return api.AddCustomOpDomain(options, domains[choice]);
}
