//! Human-readable number formatting for terminal tables.

pub fn bytes(b: f64) -> String {
    let gib = (1u64 << 30) as f64;
    if b.abs() >= gib {
        format!("{:.2} GiB", b / gib)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

pub fn secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else {
        format!("{:.2} ms", s * 1e3)
    }
}

pub fn pct(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:5.1} %", 100.0 * part / whole)
    } else {
        "    - ".into()
    }
}
