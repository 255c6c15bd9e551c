// wgmma.mma_async with both operands in shared memory (SS):
//   D[64 x N] (+)= A[64 x 16] B[16 x N], fp32 accumulators, bf16 or fp16 inputs.
// A is K-major. B is K-major (kTransposeB = false: stored [n][k], as K is for
// S = Q K^T) or N-major (kTransposeB = true: stored [k][n], as V is for O = P V).
// The instantiated shapes are the ones the sm90 family uses: N = 128 for S,
// N = 128/192/256 (half the padded head dim) for O.
//
// Accumulators are bound "+f"; the caller fences them (fence_operands) around
// the asynchronous section so the compiler leaves them alone while the tensor
// cores own them. PTX needs literal operand lists: the macros below spell them
// out once per accumulator count.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/element.cuh"

namespace ffpa::detail::sm90_wgmma {

// The accumulator registers of an N = 128, 192, 256 wgmma (64, 96, 128 of them):
// asm placeholders and operands, each list extending the one before.
#define FFPA_WGMMA_REGS_64 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
  "%56, %57, %58, %59, %60, %61, %62, %63"
#define FFPA_WGMMA_OPERANDS_64(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
  "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
  "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
  "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
  "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
  "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
  "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
  "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
  "+f"(d[63])
#define FFPA_WGMMA_REGS_96 \
  FFPA_WGMMA_REGS_64 ", " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define FFPA_WGMMA_OPERANDS_96(d) \
  FFPA_WGMMA_OPERANDS_64(d), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), \
  "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), \
  "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), \
  "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), \
  "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define FFPA_WGMMA_REGS_128 \
  FFPA_WGMMA_REGS_96 ", " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, " \
  "%127"
#define FFPA_WGMMA_OPERANDS_128(d) \
  FFPA_WGMMA_OPERANDS_96(d), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), \
  "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), \
  "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), \
  "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), \
  "+f"(d[126]), "+f"(d[127])

// One SS wgmma: SHAPE "m64nNk16", TYPE "bf16" or "f16", TRANSPOSE_B "0" or "1",
// REGS accumulators (a multiple of 32 so that the operand numbers follow).
#define FFPA_WGMMA_SS(SHAPE, TYPE, TRANSPOSE_B, REGS, A_INDEX, B_INDEX, ACC_INDEX)                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" ACC_INDEX ", 0;\n"                            \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE "\n"                    \
               "{" FFPA_WGMMA_REGS_##REGS "},\n%" A_INDEX ", %" B_INDEX ", p, 1, 1, 0, " TRANSPOSE_B \
               ";\n}\n"                                                                        \
               : FFPA_WGMMA_OPERANDS_##REGS(d)                                                   \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate))

// accumulate == 0 overwrites D (the first k step of a product).
template <typename Element, int N, bool kTransposeB>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                         int accumulate) {
  // The operand kind is the element's trait: a 16-bit element is k16 per
  // instruction (32 bytes of a 128-byte row, as for an 8-bit one at k32); an
  // e4m3 operand adds its kind here, K-major B only.
  static_assert(ElementTraits<Element>::kBytes == 2, "16-bit operands: bf16 or fp16");
  constexpr bool kBf16 = ElementTraits<Element>::kIsBf16;
  static_assert(kTransposeB ? (N == 128 || N == 192 || N == 256) : N == 128,
                "instantiated shapes: K-major B with N = 128, N-major B with N = 128, 192, 256");
  if constexpr (!kTransposeB) {
    if constexpr (kBf16) {
      FFPA_WGMMA_SS("m64n128k16", "bf16", "0", 64, "64", "65", "66");
    } else {
      FFPA_WGMMA_SS("m64n128k16", "f16", "0", 64, "64", "65", "66");
    }
  } else if constexpr (N == 128) {
    if constexpr (kBf16) {
      FFPA_WGMMA_SS("m64n128k16", "bf16", "1", 64, "64", "65", "66");
    } else {
      FFPA_WGMMA_SS("m64n128k16", "f16", "1", 64, "64", "65", "66");
    }
  } else if constexpr (N == 192) {
    if constexpr (kBf16) {
      FFPA_WGMMA_SS("m64n192k16", "bf16", "1", 96, "96", "97", "98");
    } else {
      FFPA_WGMMA_SS("m64n192k16", "f16", "1", 96, "96", "97", "98");
    }
  } else {
    if constexpr (kBf16) {
      FFPA_WGMMA_SS("m64n256k16", "bf16", "1", 128, "128", "129", "130");
    } else {
      FFPA_WGMMA_SS("m64n256k16", "f16", "1", 128, "128", "129", "130");
    }
  }
}

#undef FFPA_WGMMA_SS
#undef FFPA_WGMMA_REGS_64
#undef FFPA_WGMMA_REGS_96
#undef FFPA_WGMMA_REGS_128
#undef FFPA_WGMMA_OPERANDS_64
#undef FFPA_WGMMA_OPERANDS_96
#undef FFPA_WGMMA_OPERANDS_128

}  // namespace ffpa::detail::sm90_wgmma
