// optimizer.cu — mirrors optim::AdamW::update over one flat range of the rank's (ZeRO) shard,
// and the squared global norm of optim::clip_grad_norm. Everything fp32; the GEMM copy of the
// weights (floatX) is refreshed in the same pass.

// params −= lr·(m̂/(√v̂ + eps) + wd·params), with m, v the AdamW moments; `wd` is 0 on the
// ranges that are not decayed (the host splits the shard into decayed and not).
extern "C" __global__ void adamw_update(float* params, floatX* params_x, const float* grads, float* m, float* v,
                                        long n, float lr, float beta1, float beta2, float ibc1, float ibc2,
                                        float eps, float wd) {
    EXA_FOR(i, n) {
        float g = grads[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = params[i];
        p -= lr * ((mi * ibc1) / (sqrtf(vi * ibc2) + eps) + wd * p);
        params[i] = p;
        if (params_x) params_x[i] = stx(p);
    }
}

// partial[blockIdx.x] = Σ g² over this block's grid-stride elements. The host launches a fixed
// grid (NORM_BLOCKS), so the sum order never depends on the device: deterministic.
extern "C" __global__ void norm_squared_partial(float* partial, const float* g, long n) {
    __shared__ float sh[EXA_WARP];
    float s = 0.0f;
    EXA_FOR(i, n) s += g[i] * g[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// out[0] += Σ_k partial[k], in k order (several ranges' partials add into one norm).
extern "C" __global__ void norm_squared_finish(float* out, const float* partial, int k) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    float s = 0.0f;
    for (int i = 0; i < k; i++) s += partial[i];
    out[0] += s;
}
