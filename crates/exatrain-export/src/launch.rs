//! A [`Job`] wrapped for its launcher: `launch.sh` (torchrun, once per node) or `job.sbatch` +
//! `rank.sh` (Slurm: one task per GPU; the wrapper turns Slurm's task variables into the ones
//! `torch.distributed` reads: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT).

use exatrain_spec::{ClusterSpec, ModelSpec, ParallelConfig};

use super::{shape, File, Job, Launcher};

fn header(m: &ModelSpec, cl: &ClusterSpec, c: &ParallelConfig, job: &Job, nodes: u32, per_node: u32) -> String {
    format!(
        "# {model} on {gpus} × {device} ({nodes} node{s} × {per_node}): {grid}, \
         micro-batch {mb}, global batch {gb}, ZeRO-{zero}\n\
         # Exported by exatrain for {version}.\n\
         # Run from {run_from}. Lines marked PLACEHOLDER are yours to fill in.\n",
        model = m.name,
        gpus = c.gpus(),
        device = cl.device.name,
        s = if nodes == 1 { "" } else { "s" },
        grid = c.grid(),
        mb = c.micro_batch,
        gb = c.global_batch,
        zero = c.zero,
        version = job.framework.version(),
        run_from = job.run_from,
    )
}

fn env_lines(job: &Job) -> String {
    let mut s = String::new();
    for (k, v, why) in &job.env {
        s.push_str(&format!("export {k}=\"{v}\"  # {why}\n"));
    }
    s
}

/// `python PROGRAM \` and one flag per line (unquoted: values are placeholders to expand).
fn command(prefix: &str, job: &Job) -> String {
    let mut s = format!("{prefix} {}", job.program);
    for f in &job.flags {
        s.push_str(" \\\n    ");
        s.push_str(f);
    }
    s.push('\n');
    s
}

pub fn files(m: &ModelSpec, cl: &ClusterSpec, c: &ParallelConfig, job: Job, launcher: Launcher) -> Vec<File> {
    let (nodes, per_node) = shape(c.gpus(), cl.node.devices);
    let head = header(m, cl, c, &job, nodes, per_node);
    let mut out = Vec::new();
    match launcher {
        Launcher::Torchrun => {
            let mut s = format!("#!/bin/bash\n{head}");
            s.push_str(
                "# Start it on every node with NODE_RANK=0..nnodes-1 and MASTER_ADDR = node 0's address.\nset -euo pipefail\n\n",
            );
            s.push_str("# ---- placeholders ----\n");
            s.push_str(
                "MASTER_ADDR=${MASTER_ADDR:-localhost}\nMASTER_PORT=${MASTER_PORT:-29500}\nNODE_RANK=${NODE_RANK:-0}\n",
            );
            if let Some(var) = job.job_dir_var {
                s.push_str(&format!(
                    "{var}=${{{var}:-$(cd \"$(dirname \"${{BASH_SOURCE[0]}}\")\" && pwd)}}\n"
                ));
            }
            s.push_str(&job.placeholders);
            s.push_str("# ----------------------\n\n");
            s.push_str(&env_lines(&job));
            s.push_str(&command(
                &format!(
                    "torchrun --nnodes {nodes} --nproc-per-node {per_node} --node-rank $NODE_RANK --master-addr $MASTER_ADDR --master-port $MASTER_PORT"
                ),
                &job,
            ));
            out.push(File {
                name: "launch.sh".into(),
                contents: s,
            });
        }
        Launcher::Slurm => {
            let l = &cl.launch;
            let mut s = format!("#!/bin/bash\n{head}");
            s.push_str("# Submit with `sbatch job.sbatch` from the folder that holds rank.sh.\n");
            if !l.sources.is_empty() {
                s.push_str(&format!("# Site settings ({}): {}\n", cl.name, l.sources.join(", ")));
            }
            s.push_str(&format!(
                "#SBATCH --job-name=exatrain-{}\n#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node={per_node}\n#SBATCH --time=02:00:00  # PLACEHOLDER: wall time\n",
                m.name
            ));
            for o in &l.sbatch {
                let note = if o.contains("ACCOUNT") {
                    "  # PLACEHOLDER: your allocation"
                } else {
                    ""
                };
                s.push_str(&format!("#SBATCH {o}{note}\n"));
            }
            s.push_str("set -euo pipefail\n\n");
            for module in &l.modules {
                s.push_str(&format!("module load {module}\n"));
            }
            s.push_str("# ---- placeholders ----\n");
            if let Some(var) = job.job_dir_var {
                s.push_str(&format!("{var}=${{{var}:-$SLURM_SUBMIT_DIR}}\n"));
            }
            s.push_str(&job.placeholders);
            s.push_str("# ----------------------\n\n");
            s.push_str(
                "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\nexport MASTER_PORT=${MASTER_PORT:-29500}\n",
            );
            s.push_str(&env_lines(&job));
            s.push_str(&command(
                &format!(
                    "srun --ntasks={} --ntasks-per-node={per_node} {} \"$SLURM_SUBMIT_DIR/rank.sh\" python",
                    c.gpus(),
                    l.srun
                ),
                &job,
            ));
            out.push(File {
                name: "job.sbatch".into(),
                contents: s,
            });
            let local = if l.one_gpu_per_task {
                "0  # srun binds one GPU to each task: it is the task's device 0"
            } else {
                "$SLURM_LOCALID"
            };
            let mut site = String::new();
            for (k, v) in &l.env {
                site.push_str(&format!("export {k}=\"{v}\"\n"));
            }
            out.push(File {
                name: "rank.sh".into(),
                contents: format!(
                    "#!/bin/bash\n# One task of job.sbatch: the variables torch.distributed reads, from Slurm's.\n\
                     export RANK=$SLURM_PROCID\nexport WORLD_SIZE=$SLURM_NTASKS\nexport LOCAL_RANK={local}\n\
                     export LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE\n\
                     # site settings ({name}), per task\n{site}\
                     # MIOpen's per-task cache folder (ROCm), when the site settings name one\n\
                     if [ -n \"${{MIOPEN_USER_DB_PATH:-}}\" ]; then mkdir -p \"$MIOPEN_USER_DB_PATH\"; fi\n\
                     exec \"$@\"\n",
                    name = cl.name
                ),
            });
        }
    }
    out.extend(job.files);
    out
}
