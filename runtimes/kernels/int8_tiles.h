// MatMulInt8Tiles' layout (int8_tiles.cpp says it), the quantized rows it multiplies, and its AMX path: the tiles
// that take 10 rows or more where the core has them (int8_tiles.cpp says why).
#pragma once

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mbuild_tiles {

constexpr int64_t BLK = 128, QUADS = 32, TILE = 16, TILES = 4, GROUP = TILE * TILES, ROWS = 5;
constexpr int64_t GROUP_BLOCK_BYTES = QUADS * GROUP * 4;
constexpr int64_t AMX_ROWS = 16, AMX_FROM = 10;  // a tile's rows; the fewest rows sent to the tiles (int8_tiles.cpp)

struct Activations {
  std::vector<int8_t> q;       // [M][blocks][128]
  std::vector<float> scale;    // [M][blocks]
  std::vector<int32_t> offset; // [M][blocks]: 128 x the sum of the block's quantized values
};

// One multiplication: rows of `a` by a weight in the layout, into y [rows][n]; ParallelFor runs run_group over its
// (n + GROUP - 1) / GROUP column groups (int8_tiles.cpp has the kernels, experts.cpp runs one per expert).
struct Job {
  const Activations* a;
  int64_t rows, n, blocks;
  const uint8_t* w;
  const float* s;
  float* y;
  bool amx;  // rows go to the tiles
};

// Rows [rows][k] quantized per row and block of 128 into out; q holds `padded` rows (zeros past `rows`), as a tile
// load reads 16 rows whatever the batch.
void quantize(const float* a, int64_t rows, int64_t padded, int64_t k, int64_t blocks, Activations& out);
void job_group(const Job& job, int64_t g);  // column group g of job
void run_group(void* job, size_t g);         // the same, as ParallelFor calls it

// AMX: whether this core has the tiles and Linux lets the process use them (it asks once for the 8 KB tile state).
inline bool amx_granted() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 25) & 1)) return false;  // TILE, INT8
  constexpr long REQUEST_PERMISSION = 0x1023, TILE_DATA = 18;  // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
  static const bool granted = syscall(SYS_arch_prctl, REQUEST_PERMISSION, TILE_DATA) == 0;
  return granted;
}

struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
};

// Up to 16 rows by one group of 64 columns on the tiles. Tiles 0-3 sum a block's dots for the group's four 16-column
// tiles; 4 and 5 hold the rows' two 64-k halves of the block, 6 and 7 the weights'. acc: [16][GROUP] floats.
#define MBUILD_TILE_DOT(t)                                                            \
  _tile_loadd(6, p + (t) * TILE * 4, GROUP * 4);                                      \
  _tile_loadd(7, p + QUADS / 2 * GROUP * 4 + (t) * TILE * 4, GROUP * 4);              \
  _tile_dpbsud(t, 4, 6);                                                              \
  _tile_dpbsud(t, 5, 7);

__attribute__((target("amx-tile,amx-int8"))) inline void tile_rows(const Activations& a, int64_t row, int64_t count,
                                                              int64_t blocks, const uint8_t* w, const float* s,
                                                              float* acc) {
  alignas(64) int32_t dots[AMX_ROWS][GROUP];
  std::fill(acc, acc + AMX_ROWS * GROUP, 0.f);
  const int64_t stride = blocks * BLK;
  for (int64_t b = 0; b < blocks; b++) {
    const int8_t* x = a.q.data() + row * stride + b * BLK;
    const uint8_t* p = w + b * GROUP_BLOCK_BYTES;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, x, stride);
    _tile_loadd(5, x + BLK / 2, stride);
    MBUILD_TILE_DOT(0)
    MBUILD_TILE_DOT(1)
    MBUILD_TILE_DOT(2)
    MBUILD_TILE_DOT(3)
    _tile_stored(0, dots[0], GROUP * 4);
    _tile_stored(1, dots[0] + TILE, GROUP * 4);
    _tile_stored(2, dots[0] + 2 * TILE, GROUP * 4);
    _tile_stored(3, dots[0] + 3 * TILE, GROUP * 4);
    __m512 ws[TILES];
    for (int t = 0; t < TILES; t++) ws[t] = _mm512_loadu_ps(s + b * GROUP + t * TILE);
    for (int64_t r = 0; r < count; r++) {  // as group_rows: (dot - offset) x weight scale x row scale, per block
      const int64_t at = (row + r) * blocks + b;
      const __m512i offset = _mm512_set1_epi32(a.offset[at]);
      const __m512 scale = _mm512_set1_ps(a.scale[at]);
      for (int t = 0; t < TILES; t++) {
        float* sum = acc + r * GROUP + t * TILE;
        const __m512i dot = _mm512_load_si512(dots[r] + t * TILE);
        _mm512_storeu_ps(sum, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dot, offset)),
                                              _mm512_mul_ps(ws[t], scale), _mm512_loadu_ps(sum)));
      }
    }
  }
}
#undef MBUILD_TILE_DOT

// A constant, not a local: GCC 12 does not see that ldtilecfg reads its operand, and drops a local's stores.
constexpr TileConfig TILES_USED{1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
static_assert(TILES_USED.rows[7] == AMX_ROWS && TILES_USED.bytes_per_row[0] == GROUP);

__attribute__((target("amx-tile"))) inline void configure_tiles() { _tile_loadconfig(&TILES_USED); }

}  // namespace mbuild_tiles
