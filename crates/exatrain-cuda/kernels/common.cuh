// common.cuh — the one header every exatrain kernel module starts with (inlined by the host
// before NVRTC compiles the module, so no include path is needed).
//
// Portability to AMD (hipRTC): no inline PTX, the warp size comes from EXA_WARP (64 on CDNA),
// warp shuffles go through exa_shfl_xor, and bf16 is handled here by bit operations instead of
// cuda_bf16.h (which NVRTC does not ship), so the same source compiles on both.
//
// Precision: `floatX` is the storage type of activations, their gradients and the GEMM copy of
// the weights — `float` in the all-fp32 mode, bf16 (`exa_bf16`, an unsigned short) when the
// module is compiled with -DEXA_BF16. Master weights, weight gradients, AdamW moments, norm
// statistics and the loss are always fp32. Arithmetic is fp32 throughout: `ldx` widens a
// floatX, `stx` rounds to nearest even.

#ifndef EXA_WARP
#define EXA_WARP 32
#endif

#define EXA_NEG_INF __int_as_float(0xff800000)

typedef unsigned short exa_bf16;

__device__ __forceinline__ float bf16_to_f32(exa_bf16 h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

__device__ __forceinline__ exa_bf16 f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u) {  // inf or nan: keep the class (nan stays nan)
        return (exa_bf16)((u >> 16) | ((u & 0xffffu) ? 0x40u : 0u));
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return (exa_bf16)(u >> 16);
}

#ifdef EXA_BF16
typedef exa_bf16 floatX;
__device__ __forceinline__ float ldx(floatX x) { return bf16_to_f32(x); }
__device__ __forceinline__ floatX stx(float f) { return f32_to_bf16(f); }
#else
typedef float floatX;
__device__ __forceinline__ float ldx(floatX x) { return x; }
__device__ __forceinline__ floatX stx(float f) { return f; }
#endif

__device__ __forceinline__ float exa_shfl_xor(float v, int lane_mask) {
#if EXA_WARP == 32
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#else
    return __shfl_xor(v, lane_mask);
#endif
}

// Sum over one warp; every lane gets the result. A butterfly in a fixed order: deterministic.
__device__ __forceinline__ float warp_sum(float v) {
    for (int m = EXA_WARP / 2; m > 0; m >>= 1) v += exa_shfl_xor(v, m);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int m = EXA_WARP / 2; m > 0; m >>= 1) v = fmaxf(v, exa_shfl_xor(v, m));
    return v;
}

// Sum over a block of blockDim.x threads (a multiple of EXA_WARP, at most EXA_WARP² threads);
// every thread gets the result. `shared` holds EXA_WARP floats. Fixed order: deterministic.
__device__ __forceinline__ float block_sum(float v, float* shared) {
    int lane = threadIdx.x % EXA_WARP, warp = threadIdx.x / EXA_WARP;
    int warps = blockDim.x / EXA_WARP;
    v = warp_sum(v);
    __syncthreads();  // shared may still be read from a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* shared) {
    int lane = threadIdx.x % EXA_WARP, warp = threadIdx.x / EXA_WARP;
    int warps = blockDim.x / EXA_WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : EXA_NEG_INF;
    return warp_max(v);
}

// A grid-stride loop over n elements.
#define EXA_FOR(i, n) for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < (long)(n); i += (long)gridDim.x * blockDim.x)
