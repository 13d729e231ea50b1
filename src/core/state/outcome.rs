//! How a run ended, as data: what the managed-job controller decides from.
//! The sentences in `detail` and the events are built for people and never
//! read back.

use serde::{Deserialize, Serialize};

/// How one rank's command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum RankEnd {
    /// It exited with this code.
    Exited {
        /// The exit code.
        code: i32,
    },
    /// A signal ended it.
    Signalled {
        /// The signal number.
        signal: i32,
    },
    /// It could not be waited for.
    Unknown,
}

impl RankEnd {
    /// The exit code, when it exited.
    pub(crate) fn code(self) -> Option<i32> {
        match self {
            RankEnd::Exited { code } => Some(code),
            _ => None,
        }
    }
}

/// Why a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EndReason {
    /// Every rank exited 0 (or there was nothing to run).
    Succeeded,
    /// A rank of the run failed; the others were stopped.
    RankFailed,
    /// Setup (or putting files on the nodes) failed; the run never started.
    SetupFailed,
    /// The user (or the controller) cancelled it.
    Cancelled,
    /// The cluster was gone, too small, or had no way to reach its nodes.
    NoCluster,
    /// The process driving it died without recording an end.
    DriverDied,
}

/// How a node that was taken away was found out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LossSeen {
    /// The provider reports it preempted.
    Preempted,
    /// The provider reports it terminated.
    Terminated,
    /// The provider no longer lists it.
    Gone,
}

/// A node the provider took away.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LostNode {
    /// The instance.
    pub(crate) instance_id: String,
    /// Its rank in the run, when it had one.
    pub(crate) rank: Option<u32>,
    /// How it was found out.
    pub(crate) seen: LossSeen,
    /// The provider's own words (a state reason code), for people.
    pub(crate) reason: String,
}

impl std::fmt::Display for LostNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {}", self.instance_id)?;
        if let Some(r) = self.rank {
            write!(f, " (rank {r})")?;
        }
        match self.seen {
            LossSeen::Preempted => write!(f, " was preempted: {}", self.reason),
            LossSeen::Terminated => write!(f, " was terminated"),
            LossSeen::Gone => write!(f, " is gone"),
        }
    }
}

/// How a run ended, recorded by its driver next to the status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunOutcome {
    /// Why it ended.
    pub(crate) reason: EndReason,
    /// How each rank's command of the last phase ended, by rank; `None`
    /// for a rank that never started or whose end was not seen.
    #[serde(default)]
    pub(crate) ranks: Vec<Option<RankEnd>>,
    /// The rank whose failure ended the run.
    #[serde(default)]
    pub(crate) failed_rank: Option<u32>,
    /// A node the provider took away, when the driver found one.
    #[serde(default)]
    pub(crate) lost: Option<LostNode>,
}

impl RunOutcome {
    /// An outcome with no per-rank detail.
    pub(crate) fn of(reason: EndReason) -> RunOutcome {
        RunOutcome {
            reason,
            ranks: Vec::new(),
            failed_rank: None,
            lost: None,
        }
    }

    /// The exit code of the rank that ended the run, when it exited.
    pub(crate) fn failed_code(&self) -> Option<i32> {
        let r = self.failed_rank? as usize;
        self.ranks.get(r).copied().flatten()?.code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failing_ranks_code_is_read_from_the_ranks_not_a_sentence() {
        let o = RunOutcome {
            reason: EndReason::RankFailed,
            ranks: vec![
                Some(RankEnd::Signalled { signal: 15 }),
                Some(RankEnd::Exited { code: 42 }),
            ],
            failed_rank: Some(1),
            lost: None,
        };
        assert_eq!(o.failed_code(), Some(42));
        let text = serde_json::to_string(&o).unwrap();
        assert_eq!(serde_json::from_str::<RunOutcome>(&text).unwrap(), o);
        let killed = RunOutcome {
            failed_rank: Some(0),
            ..o
        };
        assert_eq!(killed.failed_code(), None, "a signal is not an exit code");
        assert_eq!(RunOutcome::of(EndReason::DriverDied).failed_code(), None);
    }

    #[test]
    fn a_lost_node_reads_well() {
        let l = LostNode {
            instance_id: "i-1".into(),
            rank: Some(1),
            seen: LossSeen::Preempted,
            reason: "Server.SpotInstanceTermination".into(),
        };
        assert_eq!(
            l.to_string(),
            "node i-1 (rank 1) was preempted: Server.SpotInstanceTermination"
        );
    }
}
