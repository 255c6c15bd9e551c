// Reading and writing one element of a tensor in any of the library's dtypes,
// as double: the CPU reference's only contact with the inputs' storage. f16 and
// bf16 convert exactly to float and double; a result is written through float
// for the 16-bit dtypes (the rounding the reference has always used).
#pragma once

#include <cstdint>

#include "common/float16_bits.hpp"
#include "common/fp8_e4m3.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail {

inline int64_t element_bytes(DType dtype) {
  switch (dtype) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f64: return 8;
    case DType::boolean:
    case DType::u8:
    case DType::e4m3: return 1;
  }
  return 1;
}

inline double load_element(DType dtype, const void* base, int64_t offset) {
  switch (dtype) {
    case DType::f16: return half_bits_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::bf16: return bf16_bits_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::f32: return static_cast<const float*>(base)[offset];
    case DType::f64: return static_cast<const double*>(base)[offset];
    case DType::boolean: return static_cast<const uint8_t*>(base)[offset] != 0 ? 1.0 : 0.0;
    case DType::e4m3: return e4m3_bits_to_float(static_cast<const uint8_t*>(base)[offset]);
    case DType::i32: return static_cast<const int32_t*>(base)[offset];
    case DType::u8: break;  // codes of an FP8 KV cache: never an input of the reference
  }
  return 0.0;  // unreachable after validation
}

inline void store_element(DType dtype, void* base, int64_t offset, double value) {
  switch (dtype) {
    case DType::f16: static_cast<uint16_t*>(base)[offset] = float_to_half_bits(static_cast<float>(value)); break;
    case DType::bf16: static_cast<uint16_t*>(base)[offset] = float_to_bf16_bits(static_cast<float>(value)); break;
    case DType::f32: static_cast<float*>(base)[offset] = static_cast<float>(value); break;
    case DType::f64: static_cast<double*>(base)[offset] = value; break;
    case DType::boolean:
    case DType::u8:
    case DType::e4m3:
    case DType::i32: break;  // never an output
  }
}

}  // namespace ffpa::detail
