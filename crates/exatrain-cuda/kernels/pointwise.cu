// pointwise.cu — mirrors kernels::gelu_* and residual_*, and the precision conversions.

#define GELU_K 0.7978845608028654f  // sqrt(2/pi)

// out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))  (GPT-2's "gelu_new")
extern "C" __global__ void gelu_forward(floatX* out, const floatX* inp, long n) {
    EXA_FOR(i, n) {
        float x = ldx(inp[i]);
        out[i] = stx(0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x))));
    }
}

// dinp += dout · gelu'(inp)
extern "C" __global__ void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, long n) {
    EXA_FOR(i, n) {
        float x = ldx(inp[i]);
        float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
        float local = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = stx(ldx(dinp[i]) + local * ldx(dout[i]));
    }
}

// out = a + b
extern "C" __global__ void residual_forward(floatX* out, const floatX* a, const floatX* b, long n) {
    EXA_FOR(i, n) out[i] = stx(ldx(a[i]) + ldx(b[i]));
}

// da += dout; db += dout
extern "C" __global__ void residual_backward(floatX* da, floatX* db, const floatX* dout, long n) {
    EXA_FOR(i, n) {
        float d = ldx(dout[i]);
        da[i] = stx(ldx(da[i]) + d);
        db[i] = stx(ldx(db[i]) + d);
    }
}

// The GEMM copy of the fp32 master weights: out = round(master).
extern "C" __global__ void to_floatx(floatX* out, const float* master, long n) {
    EXA_FOR(i, n) out[i] = stx(master[i]);
}

// Widen: out = in (a floatX gradient into an fp32 buffer, or a tensor read back for a check).
extern "C" __global__ void to_f32(float* out, const floatX* in, long n) {
    EXA_FOR(i, n) out[i] = ldx(in[i]);
}

// x *= s (clipping to the global norm; scaling a loss gradient)
extern "C" __global__ void scale_f32(float* x, float s, long n) {
    EXA_FOR(i, n) x[i] *= s;
}
