//! Open a GPU through the dynamically loaded driver, with one clear error for each way it can
//! be missing (no driver library, no device, a wrong ordinal), never a panic: cudarc panics on
//! a library it cannot load, so presence is checked first. Compiled kernel modules are cached
//! per (module, precision) for the device's architecture.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::kernels::{self, Precision};
use crate::{nvrtc, GpuError};

/// What the device is.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor)
    pub compute_capability: (i32, i32),
    pub total_bytes: u64,
    pub free_bytes: u64,
}

impl DeviceInfo {
    /// The architecture NVRTC compiles for: sm_<major><minor>.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

/// The libraries the GPU path loads, and whether each is found.
pub fn libraries() -> Vec<(&'static str, bool)> {
    // SAFETY: each call only tries to dlopen the library's candidate names.
    unsafe {
        vec![
            ("libcuda (driver)", cudarc::driver::sys::is_culib_present()),
            ("libnvrtc", cudarc::nvrtc::sys::is_culib_present()),
            ("libcublasLt", cudarc::cublaslt::sys::is_culib_present()),
            ("libnccl", cudarc::nccl::sys::is_culib_present()),
        ]
    }
}

/// An open device: its context, one stream, and the compiled-module cache.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub info: DeviceInfo,
    modules: Mutex<HashMap<(&'static str, Precision), Arc<CudaModule>>>,
}

fn driver_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> GpuError + '_ {
    move |e| GpuError::new(format!("{what}: {e}"))
}

/// Open device `ordinal`.
pub fn open(ordinal: usize) -> Result<Gpu, GpuError> {
    // SAFETY: only tries to dlopen the driver's candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::new(
            "no CUDA driver: libcuda.so.1 was not found (this machine has no NVIDIA driver; use --device cpu)",
        ));
    }
    let count = CudaContext::device_count()
        .map_err(|e| GpuError::new(format!("no CUDA device: the driver says {e} (use --device cpu)")))?;
    if count < 1 {
        return Err(GpuError::new("no CUDA device: the driver sees none (use --device cpu)"));
    }
    if ordinal >= count as usize {
        return Err(GpuError::new(format!(
            "--gpu {ordinal}: this machine has {count} CUDA device(s), numbered 0..{}",
            count - 1
        )));
    }
    let ctx = CudaContext::new(ordinal).map_err(driver_err("cannot open the CUDA device"))?;
    let name = ctx.name().map_err(driver_err("cuDeviceGetName"))?;
    let compute_capability = ctx.compute_capability().map_err(driver_err("compute capability"))?;
    let (free, total) = ctx.mem_get_info().map_err(driver_err("cuMemGetInfo"))?;
    let stream = ctx.default_stream();
    Ok(Gpu {
        ctx,
        stream,
        info: DeviceInfo {
            ordinal,
            name,
            compute_capability,
            total_bytes: total as u64,
            free_bytes: free as u64,
        },
        modules: Mutex::new(HashMap::new()),
    })
}

impl Gpu {
    /// Refuse, before allocating, what does not fit in the device's free memory.
    pub fn check_fits(&self, bytes: u64, what: &str) -> Result<(), GpuError> {
        check_fits(&self.info, bytes, what)
    }

    /// The compiled module (NVRTC on first use, for this device's architecture).
    pub fn module(&self, name: &str, p: Precision) -> Result<Arc<CudaModule>, GpuError> {
        let m = kernels::module(name).ok_or_else(|| GpuError::new(format!("no kernel module `{name}`")))?;
        let mut cache = self.modules.lock().expect("the module cache is never poisoned");
        if let Some(got) = cache.get(&(m.name, p)) {
            return Ok(got.clone());
        }
        let compiled = nvrtc::compile(m, &self.info.arch(), p)?;
        let loaded = self
            .ctx
            .load_module(Ptx::from_binary(compiled.cubin))
            .map_err(driver_err("cannot load the compiled kernels"))?;
        cache.insert((m.name, p), loaded.clone());
        Ok(loaded)
    }

    /// One kernel of a module.
    pub fn function(&self, module: &str, kernel: &str, p: Precision) -> Result<CudaFunction, GpuError> {
        self.module(module, p)?
            .load_function(kernel)
            .map_err(|e| GpuError::new(format!("kernel {module}/{kernel}: {e}")))
    }
}

/// The check behind [`Gpu::check_fits`], on a description of the device (pure, testable
/// without one).
pub fn check_fits(info: &DeviceInfo, bytes: u64, what: &str) -> Result<(), GpuError> {
    if bytes <= info.free_bytes {
        return Ok(());
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    Err(GpuError::new(format!(
        "{what} needs {:.2} GiB but {} (GPU {}) has {:.2} GiB free of {:.2} GiB: use a smaller micro-batch, more \
         tensor/pipeline parallelism or recomputation",
        gib(bytes),
        info.name,
        info.ordinal,
        gib(info.free_bytes),
        gib(info.total_bytes)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_little_memory_is_refused_with_the_numbers() {
        let info = DeviceInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            total_bytes: 140 << 30,
            free_bytes: 100 << 30,
        };
        assert_eq!(info.arch(), "sm_90");
        assert!(check_fits(&info, 99 << 30, "the layout").is_ok());
        let e = check_fits(&info, 120 << 30, "the layout").unwrap_err();
        assert!(
            e.0.contains("120.00 GiB") && e.0.contains("100.00 GiB free of 140.00 GiB"),
            "{e}"
        );
    }
}
