// The vector arithmetic of CausalAttention (attention.cpp): exp, sums of 16 dot products, rotary, the cache's
// stores and reads (fp32 or int8), a query row against a block of KEYS keys, and probabilities times values.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace mbuild_attention {

constexpr int64_t KEYS = 16;  // keys a block: one AVX-512 register of scores

// exp for x <= 0 (scores minus their maximum): 2^n x p(r), r = x - n ln2 in [-ln2/2, ln2/2], p of degree 6 (~1 ulp).
// Below -64 it is 0: e^-64 is invisible beside the maximum's 1 in a float sum, and products of such tiny weights with
// values would be denormals, which cost a microcode assist each.
inline __m512 exp_ps(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-64.f), _CMP_GE_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-64.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

// a[j] holds 16 partial sums of dot product j; returns lane j = the sum of a[j]'s lanes
inline __m512 sum16(__m512 a[16]) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; i++)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; i++) {  // lane L of u[i]: dots 4i..4i+3, each summed over L's four floats
    const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xDD));
}

// x rotated in place for position p: rotate-half on the first 2 x half channels
inline void rotate(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; i++) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i] + a * sin[i];
  }
}

template <typename C>
inline void store(C* to, const float* x, const float* scale, int64_t dim) {
  if constexpr (sizeof(C) == 1) {
    for (int64_t i = 0; i < dim; i++)
      to[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] / scale[i]), -128.f, 127.f));
  } else {
    std::memcpy(to, x, dim * sizeof(float));
  }
}

// KEYS rows of the cache at `from` as floats, the rows past `count` zero (an fp32 block that is whole is read in place)
template <typename C>
inline const float* widen(const C* from, int64_t count, int64_t dim, float* scratch) {
  if constexpr (sizeof(C) == 1) {
    for (int64_t i = 0; i < count * dim; i += 16)
      _mm512_storeu_ps(scratch + i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i)))));
  } else {
    if (count == KEYS) return from;
    std::memcpy(scratch, from, count * dim * sizeof(float));
  }
  std::memset(scratch + count * dim, 0, (KEYS - count) * dim * sizeof(float));
  return scratch;
}

// which of the 16 keys from j a row that sees `seen` keys attends to
inline __mmask16 live_keys(int64_t seen, int64_t j) {
  return seen - j >= 16 ? 0xFFFF : seen <= j ? 0 : static_cast<__mmask16>((1u << (seen - j)) - 1);
}

// 16 cache values as floats: an fp32 load, or int8 widened in registers (the same conversion widen() makes)
template <typename C>
inline __m512 load16(const C* from) {
  if constexpr (sizeof(C) == 1)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(from))));
  else
    return _mm512_loadu_ps(from);
}

// one query row against a block of KEYS keys [KEYS][16 V] (fp32, or int8 read where it lies: a whole block needs
// no copy): the q row stays in registers, each key's sum in one
template <int V, typename C>
inline __m512 dots(const float* q, const C* block) {
  __m512 qv[V], acc[KEYS];
  for (int c = 0; c < V; c++) qv[c] = _mm512_loadu_ps(q + 16 * c);
  for (int j = 0; j < KEYS; j++) {
    acc[j] = _mm512_mul_ps(qv[0], load16(block + j * 16 * V));
    for (int c = 1; c < V; c++) acc[j] = _mm512_fmadd_ps(qv[c], load16(block + j * 16 * V + 16 * c), acc[j]);
  }
  return sum16(acc);
}

// o [16 V] += sum over j < upto of p[j] x block row j
template <int V, typename C>
inline void weigh(float* o, const float* p, const C* block, int64_t upto) {
  __m512 acc[V];
  for (int c = 0; c < V; c++) acc[c] = _mm512_loadu_ps(o + 16 * c);
  for (int64_t j = 0; j < upto; j++) {
    const __m512 w = _mm512_set1_ps(p[j]);
    for (int c = 0; c < V; c++) acc[c] = _mm512_fmadd_ps(w, load16(block + j * 16 * V + 16 * c), acc[c]);
  }
  for (int c = 0; c < V; c++) _mm512_storeu_ps(o + 16 * c, acc[c]);
}

}  // namespace mbuild_attention
