//! A job's files on its nodes before its setup: the checkpoint directory
//! (with a kept checkpoint restored into it), the workdir and the file
//! mounts; and the GPUs of machines gangway did not create, asked once
//! they are reached.

use std::path::Path;

use super::{survivor, JobSpec, Transport, TransportError, DEFAULT_CHECKPOINT_DIR};
use crate::core::state::NodeRow;

/// How many nodes have their files placed at once: each placement is a
/// few ssh (or kubectl, srun) processes and a stream of the files, so a
/// 64-node gang takes four waves' time rather than 64 nodes' one after
/// another.
const PLACE_AT_ONCE: usize = 16;

/// The checkpoint directory the job's nodes use.
pub(super) fn checkpoint_dir(spec: &JobSpec) -> &str {
    spec.checkpoint_dir
        .as_deref()
        .unwrap_or(DEFAULT_CHECKPOINT_DIR)
}

/// For the nodes of rank `r` with `only[r]`, once they are reached: their
/// GPUs where they must be asked, then their files ([`place_files`]).
pub(super) fn discover_and_place(
    spec: &JobSpec,
    nodes: &mut [NodeRow],
    transport: &dyn Transport,
    only: &[bool],
) -> Result<(), String> {
    discover_gpus(transport, nodes, only);
    let ck = checkpoint_dir(spec);
    let dirs: Vec<String> = nodes.iter().map(|n| transport.node_path(n, ck)).collect();
    place_files(spec, nodes, transport, &dirs, only)
}

/// Machines gangway did not create say what GPUs they have: asks them,
/// and orders `CUDA_VISIBLE_DEVICES` by what they answer.
fn discover_gpus(transport: &dyn Transport, nodes: &mut [NodeRow], only: &[bool]) {
    for (n, _) in nodes
        .iter_mut()
        .zip(only)
        .filter(|(n, o)| **o && n.extra.get("gpus.discover").is_some_and(|v| v == "true"))
    {
        let out = transport
            .probe(n, super::gpus::DISCOVER_SCRIPT)
            .unwrap_or_default();
        let (gpus, order) = super::gpus::discovered(&out);
        n.extra.insert("gpus.discovered".into(), gpus.to_string());
        if !order.is_empty() {
            let order: Vec<String> = order.iter().map(u32::to_string).collect();
            n.extra
                .insert("env.CUDA_VISIBLE_DEVICES".into(), order.join(","));
        }
    }
}

/// Files on every node of rank `r` with `only[r]` at once (at most
/// [`PLACE_AT_ONCE`] at a time). A failure names the lowest rank that
/// failed.
fn place_files(
    spec: &JobSpec,
    nodes: &[NodeRow],
    transport: &dyn Transport,
    checkpoint_dirs: &[String],
    only: &[bool],
) -> Result<(), String> {
    let placed = on_every_node(nodes, PLACE_AT_ONCE, |rank, n| {
        only[rank].then(|| place_on(spec, n, transport, &checkpoint_dirs[rank]))
    });
    // Nodes that share a file system (an NFS home on a pool or a Slurm
    // cluster, several addresses of one machine) place the same files at
    // the same time and can trip over each other's (a file another node
    // just replaced): a node that failed, or whose thread did, is placed
    // again alone, once the others are done.
    let mut done: Vec<bool> = only.iter().map(|o| !o).collect();
    for (rank, placed) in &placed {
        done[*rank] = placed.as_ref().is_none_or(Result::is_ok);
    }
    for rank in (0..nodes.len()).filter(|r| !done[*r]) {
        place_on(spec, &nodes[rank], transport, &checkpoint_dirs[rank])
            .map_err(|e| format!("rank {rank}: {e}"))?;
    }
    Ok(())
}

/// One node's files (see [`place_files`]). A survivor of a lost node
/// keeps the workdir and file mounts it was given when the job started
/// (and whatever its setup made of them): only its checkpoint directory
/// goes back to the kept checkpoint. Placing them again would also race
/// a new node's setup reading them where the two share a file system.
fn place_on(
    spec: &JobSpec,
    n: &NodeRow,
    transport: &dyn Transport,
    checkpoint_dir_on_node: &str,
) -> Result<(), String> {
    let survivor = survivor(n);
    if survivor {
        // A survivor resumes from the kept checkpoint as the new nodes
        // do: whatever it wrote after that checkpoint goes.
        roll_back_checkpoint(transport, n, checkpoint_dir_on_node)
            .map_err(|e| format!("rolling back the checkpoint directory: {e}"))?;
    }
    transport
        .make_dir(n, checkpoint_dir_on_node)
        .map_err(|e| e.to_string())?;
    if let Some(kept) = spec.restore_from.as_deref().filter(|p| p.is_dir()) {
        // `upload` takes the node's own spelling of the path.
        transport
            .upload(n, kept, checkpoint_dir(spec))
            .map_err(|e| format!("restoring the checkpoint: {e}"))?;
    }
    if survivor {
        return Ok(());
    }
    let mut uploads: Vec<(&Path, &str)> = Vec::new();
    if let Some(w) = &spec.workdir {
        uploads.push((w.as_path(), super::WORKDIR_ON_NODE));
    }
    for (dest, src) in &spec.file_mounts {
        uploads.push((src.as_path(), dest.as_str()));
    }
    for (src, dest) in uploads {
        transport.upload(n, src, dest).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `f(rank, node)` for every node, on at most `at_once` threads at a time:
/// `(rank, answer)` in rank order (a rank whose `f` panicked is missing).
fn on_every_node<T, F>(nodes: &[NodeRow], at_once: usize, f: F) -> Vec<(usize, T)>
where
    T: Send,
    F: Fn(usize, &NodeRow) -> T + Sync,
{
    if nodes.len() <= 1 {
        return nodes
            .iter()
            .enumerate()
            .map(|(r, n)| (r, f(r, n)))
            .collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut answers: Vec<(usize, T)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..at_once.clamp(1, nodes.len()))
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let rank = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(n) = nodes.get(rank) else { break mine };
                        // A panic loses this rank's answer only.
                        let answer =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(rank, n)));
                        if let Ok(a) = answer {
                            mine.push((rank, a));
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    answers.sort_by_key(|(rank, _)| *rank);
    answers
}

/// Empties a surviving node's checkpoint directory `dir` (as the node
/// spells it; `~/` is its home).
fn roll_back_checkpoint(
    transport: &dyn Transport,
    node: &NodeRow,
    dir: &str,
) -> Result<(), TransportError> {
    let quoted = gangway_provider::sh_quote(dir);
    let script = format!(
        "d={quoted}; case \"$d\" in \"~/\"*) d=\"$HOME/${{d#\"~/\"}}\" ;; esac; \
         if [ -d \"$d\" ]; then find \"$d\" -mindepth 1 -maxdepth 1 -exec rm -rf {{}} +; fi"
    );
    transport.probe(node, &script).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn nodes(n: u32) -> Vec<NodeRow> {
        (0..n)
            .map(|rank| NodeRow {
                rank,
                instance_id: format!("i-{rank}"),
                private_ip: format!("10.0.0.{rank}"),
                public_ip: None,
                zone: "a".into(),
                topology: String::new(),
                state: "running".into(),
                extra: Default::default(),
            })
            .collect()
    }

    #[test]
    fn every_node_is_served_at_once_up_to_the_limit_and_answers_in_rank_order() {
        let (active, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let answers = on_every_node(&nodes(10), 4, |rank, n| {
            let now = active.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(60));
            active.fetch_sub(1, Ordering::SeqCst);
            (rank, n.instance_id.clone())
        });
        assert_eq!(most.load(Ordering::SeqCst), 4, "four nodes at a time");
        assert_eq!(answers.len(), 10);
        for (i, (rank, (r, id))) in answers.iter().enumerate() {
            assert_eq!((*rank, *r), (i, i));
            assert_eq!(id, &format!("i-{i}"));
        }
    }

    #[test]
    fn a_node_whose_work_panics_is_missing_from_the_answers_not_fatal() {
        let answers = on_every_node(&nodes(3), 3, |rank, _| {
            if rank == 1 {
                panic!("boom (expected by this test)");
            }
            rank
        });
        let ranks: Vec<usize> = answers.iter().map(|(r, _)| *r).collect();
        assert_eq!(ranks, vec![0, 2]);
    }
}
