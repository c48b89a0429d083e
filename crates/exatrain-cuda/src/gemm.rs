//! GEMMs through cuBLASLt with cached plans (descriptor, matrix layouts and the heuristic's
//! algorithm per shape), fp32 compute, bf16 or fp32 inputs, bf16 or fp32 output, and `beta`:
//! `beta = 1` accumulates a bf16 product into fp32 gradients, which cudarc's safe API (one type
//! for A, B and C) does not offer, so this goes through its `result` layer. cuBLASLt is
//! column-major; a row-major `out[N, OC] = inp[N, C] · wᵀ` is the column-major
//! `outᵀ[OC, N] = w[OC, C]ᵀᵀ · inpᵀ`, i.e. m = OC, n = N, k = C with A = w transposed.

use std::collections::HashMap;
use std::mem::size_of;
use std::sync::Arc;

use cudarc::cublaslt::{result, sys};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::GpuError;

/// An element type of a GEMM operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ty {
    Bf16,
    F32,
}

impl Ty {
    fn cuda(self) -> sys::cudaDataType {
        match self {
            Ty::Bf16 => sys::cudaDataType_t::CUDA_R_16BF,
            Ty::F32 => sys::cudaDataType_t::CUDA_R_32F,
        }
    }
    pub fn bytes(self) -> usize {
        match self {
            Ty::Bf16 => 2,
            Ty::F32 => 4,
        }
    }
}

/// One GEMM's shape in cuBLAS's column-major terms: C[m, n] = op(A)[m, k] · op(B)[k, n],
/// `batch` times with the given element strides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub transa: bool,
    pub transb: bool,
    pub lda: i64,
    pub ldb: i64,
    pub ldc: i64,
    pub batch: i32,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
    /// The type of A and B.
    pub ab: Ty,
    /// The type of C.
    pub c: Ty,
    /// The alignment, bytes, every operand's address (and each batch's) is known to have:
    /// cuBLASLt's heuristic assumes 256 unless told, and may pick an algorithm that faults on
    /// a less aligned operand (a tensor at an odd offset of a flat buffer, a narrow head).
    pub align: u32,
    /// fp32 operands multiplied on the tensor cores in TF32 (10-bit mantissa, fp32
    /// accumulation: `CUBLAS_COMPUTE_32F_FAST_TF32`, what llm.c's fp32 build uses); no effect
    /// on bf16 operands.
    pub tf32: bool,
}

impl Shape {
    /// A plain m×n×k product, no transposes, packed.
    pub fn plain(m: u64, n: u64, k: u64, ab: Ty, c: Ty) -> Shape {
        Shape {
            m,
            n,
            k,
            transa: false,
            transb: false,
            lda: m as i64,
            ldb: k as i64,
            ldc: m as i64,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            ab,
            c,
            align: 256,
            tf32: false,
        }
    }

    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
}

/// A cuBLASLt handle with its workspace and plan cache, bound to one stream.
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    stream: Arc<CudaStream>,
    workspace: CudaSlice<u8>,
    plans: HashMap<Shape, Plan>,
}

fn lt_err(what: &'static str) -> impl Fn(result::CublasError) -> GpuError {
    move |e| GpuError::new(format!("cuBLASLt {what}: {e:?}"))
}

impl Lt {
    pub fn new(stream: Arc<CudaStream>) -> Result<Lt, GpuError> {
        // SAFETY: only tries to dlopen the library's candidate names.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::new(
                "cuBLASLt not found: libcublasLt.so.13 is not on the library path (the `nvidia-cublas` wheel's \
                 nvidia/cu13/lib, or the CUDA toolkit)",
            ));
        }
        let handle = result::create_handle().map_err(lt_err("create handle"))?;
        // 32 MiB: what NVIDIA recommends for Hopper (more than enough before it)
        let workspace = stream
            .alloc_zeros::<u8>(32 << 20)
            .map_err(|e| GpuError::new(format!("cuBLASLt workspace: {e}")))?;
        Ok(Lt {
            handle,
            stream,
            workspace,
            plans: HashMap::new(),
        })
    }

    fn plan(&mut self, s: &Shape) -> Result<(), GpuError> {
        if !self.plans.contains_key(s) {
            let p = self.make_plan(s)?;
            self.plans.insert(*s, p);
        }
        Ok(())
    }

    fn make_plan(&self, s: &Shape) -> Result<Plan, GpuError> {
        let compute = if s.tf32 && s.ab == Ty::F32 {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let desc = result::create_matmul_desc(compute, sys::cudaDataType_t::CUDA_R_32F)
            .map_err(lt_err("matmul descriptor"))?;
        let set_transpose = |attr: sys::cublasLtMatmulDescAttributes_t, t: bool| {
            let op = t as i32; // CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
                               // SAFETY: `desc` is live; the attribute is a 32-bit cublasOperation_t.
            unsafe { result::set_matmul_desc_attribute(desc, attr, (&op) as *const i32 as *const _, size_of::<i32>()) }
                .map_err(lt_err("transpose attribute"))
        };
        set_transpose(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            s.transa,
        )?;
        set_transpose(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            s.transb,
        )?;
        let (ar, ac) = if s.transa { (s.k, s.m) } else { (s.m, s.k) };
        let (br, bc) = if s.transb { (s.n, s.k) } else { (s.k, s.n) };
        let mut layouts = [std::ptr::null_mut(); 3];
        for (i, (ty, rows, cols, ld, stride)) in [
            (s.ab, ar, ac, s.lda, s.stride_a),
            (s.ab, br, bc, s.ldb, s.stride_b),
            (s.c, s.m, s.n, s.ldc, s.stride_c),
        ]
        .into_iter()
        .enumerate()
        {
            let l = result::create_matrix_layout(ty.cuda(), rows, cols, ld).map_err(lt_err("matrix layout"))?;
            if s.batch > 1 {
                // SAFETY: `l` is live; an i32 count and an i64 stride, as cuBLASLt documents.
                unsafe {
                    result::set_matrix_layout_attribute(
                        l,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&s.batch) as *const _ as *const _,
                        size_of::<i32>(),
                    )
                    .map_err(lt_err("batch count"))?;
                    result::set_matrix_layout_attribute(
                        l,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        (&stride) as *const _ as *const _,
                        size_of::<i64>(),
                    )
                    .map_err(lt_err("batch stride"))?;
                }
            }
            layouts[i] = l;
        }
        let pref = result::create_matmul_pref().map_err(lt_err("preference"))?;
        let ws = self.workspace.len();
        // SAFETY: `pref` is live; the workspace size is a usize (u64) as documented.
        unsafe {
            result::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const _ as *const _,
                size_of::<usize>(),
            )
        }
        .map_err(lt_err("workspace preference"))?;
        for attr in [
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        ] {
            // SAFETY: `pref` is live; the alignments are uint32_t as documented.
            unsafe {
                result::set_matmul_pref_attribute(pref, attr, (&s.align) as *const u32 as *const _, size_of::<u32>())
            }
            .map_err(lt_err("alignment preference"))?;
        }
        // SAFETY: every handle is live.
        let heuristic = unsafe {
            result::get_matmul_algo_heuristic(self.handle, desc, layouts[0], layouts[1], layouts[2], layouts[2], pref)
        };
        // SAFETY: created above, destroyed once.
        let _ = unsafe { result::destroy_matmul_pref(pref) };
        let heuristic = heuristic.map_err(|e| GpuError::new(format!("cuBLASLt has no algorithm for {s:?}: {e:?}")))?;
        Ok(Plan {
            desc,
            layouts,
            algo: heuristic.algo,
        })
    }

    /// C = alpha·op(A)·op(B) + beta·C on this handle's stream.
    ///
    /// # Safety
    /// `a`, `b`, `c` must point to device buffers of the shape's types holding at least what
    /// its leading dimensions, strides and batch address.
    pub unsafe fn gemm(
        &mut self,
        s: &Shape,
        alpha: f32,
        a: CUdeviceptr,
        b: CUdeviceptr,
        beta: f32,
        c: CUdeviceptr,
    ) -> Result<(), GpuError> {
        let s = &Shape {
            align: s.align.min(alignment(s, [a, b, c])),
            ..*s
        };
        self.plan(s)?;
        let plan = &self.plans[s];
        let (handle, stream, ws_len) = (self.handle, self.stream.cu_stream(), self.workspace.len());
        let (ws, _sync) = self.workspace.device_ptr(&self.stream);
        let ws = ws as *mut std::ffi::c_void;
        result::matmul(
            handle,
            plan.desc,
            (&alpha) as *const f32 as *const _,
            (&beta) as *const f32 as *const _,
            a as *const _,
            plan.layouts[0],
            b as *const _,
            plan.layouts[1],
            c as *const _,
            plan.layouts[2],
            c as *mut _,
            plan.layouts[2],
            (&plan.algo) as *const _,
            ws,
            ws_len,
            stream as *mut _,
        )
        .map_err(lt_err("matmul"))
    }
}

// SAFETY: the cuBLASLt handle and plans are only used through `&mut self` (one thread at a
// time); cuBLASLt handles may move between host threads.
unsafe impl Send for Lt {}

/// The largest power of two, at most 256, dividing the three addresses and (batched) each
/// operand's batch stride in bytes.
pub fn alignment(s: &Shape, ptrs: [CUdeviceptr; 3]) -> u32 {
    let mut x: u64 = 256;
    for p in ptrs {
        x |= p;
    }
    if s.batch > 1 {
        x |= s.stride_a as u64 * s.ab.bytes() as u64;
        x |= s.stride_b as u64 * s.ab.bytes() as u64;
        x |= s.stride_c as u64 * s.c.bytes() as u64;
    }
    // the lowest set bit
    (x & x.wrapping_neg()).min(256) as u32
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: each was created once by this handle and is destroyed once here.
        unsafe {
            for (_, p) in self.plans.drain() {
                for l in p.layouts {
                    let _ = result::destroy_matrix_layout(l);
                }
                let _ = result::destroy_matmul_desc(p.desc);
            }
            let _ = result::destroy_handle(self.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alignment_is_what_every_operand_and_batch_has() {
        let s = Shape::plain(64, 64, 64, Ty::F32, Ty::F32);
        assert_eq!(alignment(&s, [0x1000, 0x2000, 0x3000]), 256);
        // a tensor 3 floats into a buffer: 4 bytes
        assert_eq!(alignment(&s, [0x1000 + 12, 0x2000, 0x3000]), 4);
        assert_eq!(alignment(&s, [0x1000, 0x2000 + 32, 0x3000]), 32);
        // heads of 8 floats, batched: the strides are 32 bytes even where the bases are not
        let b = Shape {
            batch: 4,
            stride_a: 8,
            stride_b: 8,
            stride_c: 64,
            ..s
        };
        assert_eq!(alignment(&b, [0x1000, 0x2000, 0x3000]), 32);
        // unbatched strides do not count
        assert_eq!(alignment(&Shape { stride_a: 1, ..s }, [0x1000, 0x2000, 0x3000]), 256);
    }
}
