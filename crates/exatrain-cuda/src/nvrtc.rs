//! Compile a kernel module with NVRTC for one architecture, to a CUBIN (what the driver loads)
//! with ptxas's register and spill report. The library is loaded at run time: its absence is a
//! [`GpuError`] naming the wheel that provides it, never a panic.

use std::ffi::CString;
use std::time::Instant;

use cudarc::nvrtc::{result, sys};

use crate::kernels::{source, Module, Precision};
use crate::ptxas::{self, KernelResources};
use crate::GpuError;

/// A compiled module.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub module: &'static str,
    pub arch: String,
    pub precision: Precision,
    /// The device code the driver loads for `arch`.
    pub cubin: Vec<u8>,
    /// NVRTC's log: warnings and ptxas's report.
    pub log: String,
    pub kernels: Vec<KernelResources>,
    pub seconds: f64,
}

/// Whether libnvrtc can be loaded (cudarc panics on a missing library: ask first).
pub fn library_present() -> bool {
    // SAFETY: only tries to dlopen the candidate names.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version, (major, minor).
pub fn version() -> Result<(i32, i32), GpuError> {
    need_library()?;
    let (mut maj, mut min) = (0, 0);
    // SAFETY: the library is present; two out-parameters.
    unsafe { sys::nvrtcVersion(&mut maj, &mut min) }
        .result()
        .map_err(|e| GpuError::new(format!("nvrtcVersion: {e:?}")))?;
    Ok((maj, min))
}

fn need_library() -> Result<(), GpuError> {
    if library_present() {
        Ok(())
    } else {
        Err(GpuError::new(
            "NVRTC not found: libnvrtc.so.13 is not on the library path (install the `nvidia-cuda-nvrtc` \
             wheel and add its nvidia/cu13/lib folder to LD_LIBRARY_PATH, or install the CUDA toolkit)",
        ))
    }
}

/// Check an architecture name: `sm_` and two or three digits (sm_80, sm_90, sm_100).
pub fn check_arch(arch: &str) -> Result<(), GpuError> {
    let digits = arch.strip_prefix("sm_").unwrap_or("");
    if (2..=3).contains(&digits.len()) && digits.chars().all(|c| c.is_ascii_digit()) {
        Ok(())
    } else {
        Err(GpuError::new(format!(
            "architecture `{arch}`: expected sm_XY (for example sm_80 for A100, sm_90 for H100/H200)"
        )))
    }
}

/// Compile `m` in precision `p` for `arch` (`sm_90`). A compile error returns NVRTC's log.
pub fn compile(m: &'static Module, arch: &str, p: Precision) -> Result<Compiled, GpuError> {
    need_library()?;
    check_arch(arch)?;
    let t0 = Instant::now();
    let src = CString::new(source(m, p)).map_err(|_| GpuError::new("kernel source holds a NUL byte"))?;
    let name = CString::new(format!("{}.cu", m.name)).expect("no NUL in a module name");
    let opts = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--ptxas-options=-v".to_string(),
        format!("-DEXA_WARP={}", 32),
    ];
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| GpuError::new(format!("nvrtcCreateProgram ({}): {e:?}", m.name)))?;
    // SAFETY: `prog` was just created and is destroyed once, below.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(prog) }
        .map(|raw| {
            let bytes: Vec<u8> = raw.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .unwrap_or_default();
    let cubin = compiled.map_err(|e| {
        GpuError::new(format!(
            "NVRTC could not compile kernel module `{}` ({}, {arch}): {e:?}\n{log}",
            m.name,
            p.name()
        ))
    });
    let cubin = cubin.and_then(|_| {
        let mut size = 0usize;
        // SAFETY: the program compiled; size then buffer of that size.
        unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
            .result()
            .map_err(|e| GpuError::new(format!("nvrtcGetCUBINSize: {e:?}")))?;
        let mut buf = vec![0u8; size];
        unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _) }
            .result()
            .map_err(|e| GpuError::new(format!("nvrtcGetCUBIN: {e:?}")))?;
        Ok(buf)
    });
    // SAFETY: created above, not destroyed before.
    let _ = unsafe { result::destroy_program(prog) };
    let cubin = cubin?;
    let kernels = ptxas::parse(&log);
    for k in m.kernels {
        if !kernels.iter().any(|r| r.name == *k) {
            return Err(GpuError::new(format!(
                "kernel module `{}`: ptxas did not report kernel `{k}` (is it extern \"C\"?)\n{log}",
                m.name
            )));
        }
    }
    Ok(Compiled {
        module: m.name,
        arch: arch.to_string(),
        precision: p,
        cubin,
        log,
        kernels,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// A compiled module's spills, as one line per kernel that spills (empty: none).
pub fn spills(c: &Compiled) -> Vec<String> {
    c.kernels
        .iter()
        .filter(|k| k.spill_stores > 0 || k.spill_loads > 0)
        .map(|k| {
            format!(
                "{}/{} ({}, {}): {} bytes spill stores, {} bytes spill loads, {} registers",
                c.module,
                k.name,
                c.precision.name(),
                c.arch,
                k.spill_stores,
                k.spill_loads,
                k.registers
            )
        })
        .collect()
}
