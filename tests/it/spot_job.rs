//! What the managed spot job tests of several clouds share: a trainer
//! that checkpoints every 5 steps and on the notice's signal, and waiting
//! for its progress.

use std::path::Path;
use std::time::Duration;

use crate::common::{wait_for, Running};

/// A 2-node spot trainer of `total` steps (`resources`: that section's
/// lines after `use_spot: true`, indented by two; `config`: the `config`
/// section's, e.g. the cloud's `ssh_user`) that checkpoints every 5
/// (waiting until gangway kept it) and at once on SIGTERM (the notice),
/// resuming from its checkpoint; rank 0 marks its progress in `dir` so the
/// test knows when to interrupt.
pub(crate) fn trainer(
    marker: &str,
    dir: &Path,
    total: u32,
    resources: &str,
    config: &str,
) -> String {
    format!(
        "num_nodes: 2\nresources:\n  use_spot: true\n{resources}\
         envs:\n  GW_TEST_MARKER: {marker}\n  TOTAL_STEPS: {total}\n\
         checkpoint:\n  sync_interval: 1\n  signal: SIGTERM\n  grace_period: 30\n\
         config:\n{config}\
         run: |\n  \
         ck=\"$GANGWAY_CHECKPOINT_DIR/step\"\n  \
         step=0\n  \
         [ -f \"$ck\" ] && step=$(cat \"$ck\")\n  \
         echo \"rank $GANGWAY_NODE_RANK run $GANGWAY_RESTART_COUNT resumes at step $step\"\n  \
         save() {{\n    \
           t=$(date +%s%3N)\n    \
           [ \"$GANGWAY_NODE_RANK\" = 0 ] && echo \"$step\" > \"$ck.tmp\" && mv \"$ck.tmp\" \"$ck\"\n    \
           while [ \"$(cat \"$GANGWAY_CHECKPOINT_DIR/.gangway-synced\" 2>/dev/null || echo 0)\" -lt \"$t\" ]; do sleep 0.05; done\n  \
         }}\n  \
         on_notice() {{\n    \
           [ \"$GANGWAY_NODE_RANK\" = 0 ] && echo \"$step\" > \"$ck.tmp\" && mv \"$ck.tmp\" \"$ck\"\n    \
           echo \"rank $GANGWAY_NODE_RANK checkpointed step $step on the notice\"\n    \
           exit 0\n  \
         }}\n  \
         trap on_notice TERM\n  \
         while [ \"$step\" -lt \"$TOTAL_STEPS\" ]; do\n    \
           sleep 0.2\n    \
           step=$((step + 1))\n    \
           [ \"$GANGWAY_NODE_RANK\" = 0 ] && touch {dir}/run$GANGWAY_RESTART_COUNT-step$step\n    \
           if [ $((step % 5)) -eq 0 ]; then save; fi\n  \
         done\n  \
         echo \"rank $GANGWAY_NODE_RANK done at step $step\"\n",
        dir = dir.display()
    )
}

/// The steps rank 0 of run `run` has reached so far (its marks in `dir`).
pub(crate) fn steps_of(dir: &Path, run: u32) -> Vec<u32> {
    let prefix = format!("run{run}-step");
    let mut steps: Vec<u32> = std::fs::read_dir(dir)
        .expect("the progress directory")
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|s| s.parse().ok())
        })
        .collect();
    steps.sort();
    steps
}

/// Waits until rank 0 of run `run` has reached a step for which `enough`
/// (given the first step of the run and the step reached) says yes;
/// returns the run's first step. Fails at once, with what it said, when
/// the job's command ended.
pub(crate) fn wait_run(
    job: &mut Running,
    dir: &Path,
    run: u32,
    what: &str,
    enough: impl Fn(u32, u32) -> bool,
) -> u32 {
    wait_for(what, Duration::from_secs(180), || {
        let steps = steps_of(dir, run);
        match (steps.first(), steps.last()) {
            (Some(&a), Some(&b)) if enough(a, b) => Ok(a),
            _ if job.exited() => panic!(
                "the job ended before {what}:\nstdout:\n{}\nstderr:\n{}",
                job.stdout_now(),
                job.stderr_now()
            ),
            _ => Err(format!(
                "run {run} at steps {steps:?}; the job said so far:\n{}\n{}",
                job.stdout_now(),
                job.stderr_now()
            )),
        }
    })
}
