//! The report ptxas writes into an NVRTC log with `--ptxas-options=-v`: per kernel, the
//! registers used and the bytes spilled to local memory (a spill is a slow kernel: the CI
//! compile fails on one).

/// One kernel's resources as ptxas reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_bytes: u32,
}

/// Parse a log: "Compiling entry function 'k' for 'sm_90'" opens kernel k; its "Function
/// properties" line gives the stack and spills, and "Used N registers" its registers.
pub fn parse(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("").to_string();
            out.push(KernelResources {
                name,
                ..Default::default()
            });
            continue;
        }
        let Some(k) = out.last_mut() else { continue };
        let num_before = |key: &str| -> Option<u32> {
            let at = line.find(key)?;
            line[..at]
                .split(|c: char| !c.is_ascii_digit())
                .rev()
                .find(|s| !s.is_empty())?
                .parse()
                .ok()
        };
        if line.contains("spill stores") {
            k.stack_bytes = num_before("bytes stack frame").unwrap_or(0);
            k.spill_stores = num_before("bytes spill stores").unwrap_or(0);
            k.spill_loads = num_before("bytes spill loads").unwrap_or(0);
        }
        if let Some(r) = num_before("registers") {
            if line.contains("Used") {
                k.registers = r;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_registers_and_spills_per_kernel() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'gelu_forward' for 'sm_90'\n\
ptxas info    : Function properties for gelu_forward\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 12 registers, used 0 barriers, 376 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'big' for 'sm_90'\n\
ptxas info    : Function properties for big\n\
    48 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads\n\
ptxas info    : Used 255 registers, 400 bytes cmem[0]\n";
        let got = parse(log);
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0],
            KernelResources {
                name: "gelu_forward".into(),
                registers: 12,
                ..Default::default()
            }
        );
        assert_eq!(
            (
                got[1].registers,
                got[1].spill_stores,
                got[1].spill_loads,
                got[1].stack_bytes
            ),
            (255, 40, 36, 48)
        );
        assert!(parse("no report here").is_empty());
    }
}
