// The 128-byte shared-memory swizzle every GPU family uses: rows of 128 bytes
// whose 16-byte segments are XORed by row % 8, so that the 8 rows an ldmatrix,
// a copy phase or a fragment store touches hit distinct banks. It is also the
// layout TMA writes and wgmma reads with SWIZZLE_128B. Columns count elements
// of kElementBytes: a 128-byte row holds 128 / kElementBytes of them.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace ffpa::detail {

constexpr int kSwizzleRowBytes = 128;
constexpr int kSwizzleAtomBytes = 8 * kSwizzleRowBytes;  // the 8 rows the XOR pattern spans

// Columns of one 128-byte swizzle row.
template <int kElementBytes>
constexpr int kSwizzleCols = kSwizzleRowBytes / kElementBytes;

// Byte offset of (row, col) within one 128-byte swizzle row (col below
// 128 / kElementBytes).
// (int arithmetic throughout, converted once by the callers: the compiler then
// folds the three terms of an address into one three-input add.)
template <int kElementBytes>
FFPA_HOST_DEVICE int swizzle128_segment(int row, int col) {
  static_assert(kElementBytes == 1 || kElementBytes == 2 || kElementBytes == 4, "elements of 1, 2 or 4 bytes");
  constexpr int kSegmentShift = kElementBytes == 1 ? 4 : kElementBytes == 2 ? 3 : 2;  // log2(16 / kElementBytes)
  return ((((col >> kSegmentShift) ^ row) & 7) << 4) + (col & ((1 << kSegmentShift) - 1)) * kElementBytes;
}

// Byte offset of (row, col) in a [rows][128 / kElementBytes] box.
template <int kElementBytes>
FFPA_HOST_DEVICE uint32_t swizzle128(int row, int col) {
  return static_cast<uint32_t>(row * kSwizzleRowBytes + swizzle128_segment<kElementBytes>(row, col));
}

// Byte offset of (row, col) in a [rows][cols] tile whose rows are cols /
// (128 / kElementBytes) consecutive 128-byte groups, each swizzled alike.
template <int kElementBytes>
FFPA_HOST_DEVICE uint32_t swizzle128_wide(int row, int col, int cols) {
  return static_cast<uint32_t>(row * cols * kElementBytes + ((col * kElementBytes) & ~(kSwizzleRowBytes - 1)) +
                               swizzle128_segment<kElementBytes>(row, col));
}

}  // namespace ffpa::detail
