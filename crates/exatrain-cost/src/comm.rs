//! Where a process group sits on the machine, and what its collectives cost.
//!
//! A group of `size` ranks whose neighbours are `stride` ranks apart (from the rank order) either
//! fits inside an aligned block of one node, and talks over the smallest link class that holds the
//! block, or spans nodes: then each node carries one ring edge out per group that has members on
//! it, and those rings share the node's NICs.

use exatrain_spec::ClusterSpec;

/// The effective link a group's collectives run over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Bandwidth one rank gets for its ring edge, bytes/s (after the network efficiency).
    pub bytes_per_s: f64,
    /// Per-hop latency, seconds.
    pub latency_s: f64,
    /// The group spans more than one node.
    pub inter_node: bool,
}

/// The link used by a group of `size` ranks with neighbours `stride` apart.
pub fn group_link(c: &ClusterSpec, size: u32, stride: u32) -> Link {
    let gpn = c.node.devices;
    let eff = c.network.efficiency;
    let block = size as u64 * stride as u64;
    if block <= gpn as u64 && (gpn as u64).is_multiple_of(block) {
        return Link {
            bytes_per_s: c.intra_gbps(block as u32) * 1e9 * eff,
            latency_s: c.network.intra_latency_us * 1e-6,
            inter_node: false,
        };
    }
    // Members per node and the rings that share this node's NICs.
    let per_node = if stride < gpn { (gpn / stride).clamp(1, size) } else { 1 };
    let rings = (gpn / per_node).max(1) as f64;
    let nic = c.node_nic_gbps() / rings;
    let bw = if per_node > 1 {
        nic.min(c.intra_gbps((per_node * stride).min(gpn)))
    } else {
        nic
    };
    Link {
        bytes_per_s: bw * 1e9 * eff,
        latency_s: c.network.inter_latency_us * 1e-6,
        inter_node: true,
    }
}

/// Ring all-reduce of `bytes` over `n` ranks, or the double binary tree when cheaper (small
/// messages): `min(2(n-1)/n·M/B + 2(n-1)·α, 2·M/B + 2·log2(n)·α)`.
pub fn all_reduce(bytes: f64, n: u32, l: Link) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let nf = n as f64;
    let ring = 2.0 * (nf - 1.0) / nf * bytes / l.bytes_per_s + 2.0 * (nf - 1.0) * l.latency_s;
    let tree = 2.0 * bytes / l.bytes_per_s + 2.0 * nf.log2().ceil() * l.latency_s;
    ring.min(tree)
}

/// Ring reduce-scatter (or all-gather) whose *full* buffer is `bytes`: `(n-1)/n·M/B + (n-1)·α`.
pub fn reduce_scatter(bytes: f64, n: u32, l: Link) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let nf = n as f64;
    (nf - 1.0) / nf * bytes / l.bytes_per_s + (nf - 1.0) * l.latency_s
}

/// All-gather has the cost of reduce-scatter.
pub fn all_gather(bytes: f64, n: u32, l: Link) -> f64 {
    reduce_scatter(bytes, n, l)
}

/// One point-to-point transfer.
pub fn send_recv(bytes: f64, l: Link) -> f64 {
    bytes / l.bytes_per_s + l.latency_s
}
