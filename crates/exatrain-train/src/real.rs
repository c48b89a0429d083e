use num_traits::Float;

/// The number types the kernels run in: `f32` to train, `f64` to check gradients.
pub trait Real: Float + Send + Sync + Default + std::fmt::Debug + std::iter::Sum + 'static {
    fn of(x: f64) -> Self;

    /// `c = alpha · a · b + beta · c` for an (m × k)·(k × n) product with arbitrary strides
    /// (row stride, column stride) for each matrix.
    ///
    /// # Safety
    /// The pointers and strides must describe matrices inside live allocations, and `c` must not
    /// alias `a` or `b`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

impl Real for f32 {
    fn of(x: f64) -> Self {
        x as f32
    }
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: *const f32,
        rsa: isize,
        csa: isize,
        b: *const f32,
        rsb: isize,
        csb: isize,
        beta: f32,
        c: *mut f32,
        rsc: isize,
        csc: isize,
    ) {
        matrixmultiply::sgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
    }
}

impl Real for f64 {
    fn of(x: f64) -> Self {
        x
    }
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: f64,
        a: *const f64,
        rsa: isize,
        csa: isize,
        b: *const f64,
        rsb: isize,
        csb: isize,
        beta: f64,
        c: *mut f64,
        rsc: isize,
        csc: isize,
    ) {
        matrixmultiply::dgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc)
    }
}
