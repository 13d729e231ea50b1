//! The cost ledger: one row per stretch of time a cluster's nodes were up,
//! with the market and the price the plan gave (USD per hour, the nodes
//! the row bills). A row opens when a cluster's nodes are recorded up and
//! closes when they stop or the cluster is gone; rows outlive their
//! cluster (`down`) and are never rewritten after they close, so costs
//! add up across a managed job's recoveries and across restarts of the
//! controller.
//!
//! A gang whose lost nodes are replaced in place (`core::replace`) has
//! three stretches for one loss, back to back, each written in the same
//! transaction as the node records it follows from:
//!
//! 1. `run`, all N nodes, until the lost nodes are confirmed removed (a
//!    node bills until it is terminated; gangway dates that by the
//!    provider's confirmation of the removal, so a node the cloud took
//!    earlier is counted until then, never less than it billed);
//! 2. `survivors-waiting`, the N - k survivors alone, at their share of
//!    the price, until the replacement is recorded up;
//! 3. `run`, all N nodes again (the new ones in the lost ranks).
//!
//! Each row says which ranks it bills (`ranks`), so the ranks a
//! replacement took over are the first row's less the second's.

use rusqlite::{params, OptionalExtension};
use serde::Serialize;

use super::{now_ms, NodeRow, StateError, Store};

/// A row's stretch: the cluster's nodes up (launched, set up, running).
pub(crate) const RUN: &str = "run";

/// A row's stretch: a gang's survivors alone, up and paid, while the
/// nodes it lost are replaced (`REPLACE_LOST_NODES`).
pub(crate) const SURVIVORS_WAITING: &str = "survivors-waiting";

/// One stretch of a cluster's nodes being up.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct LedgerRow {
    /// Row id.
    pub(crate) id: i64,
    /// Cluster name.
    pub(crate) cluster: String,
    /// The managed job the cluster ran for, if any.
    pub(crate) managed_job: Option<i64>,
    /// Cloud.
    pub(crate) cloud: String,
    /// Region.
    pub(crate) region: Option<String>,
    /// Zone.
    pub(crate) zone: Option<String>,
    /// Instance type.
    pub(crate) instance_type: Option<String>,
    /// `spot` or `on-demand`.
    pub(crate) market: String,
    /// Nodes this row bills.
    pub(crate) num_nodes: u32,
    /// USD per hour, for the `num_nodes` nodes.
    pub(crate) price_per_hour: f64,
    /// Where the price came from: `plan` (the catalog's, as the optimizer
    /// chose) or `provider` (what the provider reported for the nodes it
    /// launched, such as the spot market price in their zone then).
    pub(crate) price_source: String,
    /// When the nodes were recorded up (ms since the epoch).
    pub(crate) started_at: i64,
    /// When they stopped or went; `None` while they are up.
    pub(crate) ended_at: Option<i64>,
    /// What the stretch was: [`RUN`] or [`SURVIVORS_WAITING`].
    pub(crate) phase: String,
    /// The ranks of the nodes it bills; `None` for rows written before
    /// gangway recorded them.
    pub(crate) ranks: Option<Vec<u32>>,
}

impl LedgerRow {
    /// Hours up within `[from, to]` (ms), an open row counting to `to`.
    pub(crate) fn hours_within(&self, from: i64, to: i64) -> f64 {
        let start = self.started_at.max(from);
        let end = self.ended_at.unwrap_or(to).min(to);
        (end - start).max(0) as f64 / 3_600_000.0
    }

    /// USD spent within `[from, to]`.
    pub(crate) fn cost_within(&self, from: i64, to: i64) -> f64 {
        self.price_per_hour * self.hours_within(from, to)
    }

    /// Whether this is a stretch of survivors waiting for replacements.
    pub(crate) fn is_waiting(&self) -> bool {
        self.phase == SURVIVORS_WAITING
    }
}

const COLUMNS: &str = "id, cluster, managed_job, cloud, region, zone, instance_type, market,
    num_nodes, price_per_hour, started_at, ended_at, price_source, phase, ranks";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<LedgerRow> {
    let ranks: Option<String> = r.get(14)?;
    Ok(LedgerRow {
        id: r.get(0)?,
        cluster: r.get(1)?,
        managed_job: r.get(2)?,
        cloud: r.get(3)?,
        region: r.get(4)?,
        zone: r.get(5)?,
        instance_type: r.get(6)?,
        market: r.get(7)?,
        num_nodes: r.get(8)?,
        price_per_hour: r.get(9)?,
        started_at: r.get(10)?,
        ended_at: r.get(11)?,
        price_source: r.get(12)?,
        phase: r.get(13)?,
        ranks: ranks.map(|s| parse_ranks(&s)),
    })
}

/// `0,1,3` as the ranks it lists.
fn parse_ranks(s: &str) -> Vec<u32> {
    s.split(',').filter_map(|r| r.trim().parse().ok()).collect()
}

/// Ranks as a row stores them: `0,1,3`.
fn ranks_text(nodes: &[NodeRow]) -> String {
    let mut ranks: Vec<u32> = nodes.iter().map(|n| n.rank).collect();
    ranks.sort_unstable();
    ranks
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// What an open row says of the stretch it is.
struct Open {
    num_nodes: u32,
    price_per_hour: f64,
    price_source: String,
    phase: String,
}

/// The open row of `cluster`.
fn open_row(conn: &rusqlite::Connection, cluster: &str) -> rusqlite::Result<Option<Open>> {
    conn.query_row(
        "SELECT num_nodes, price_per_hour, price_source, phase FROM ledger
         WHERE cluster = ?1 AND ended_at IS NULL ORDER BY id DESC LIMIT 1",
        [cluster],
        |r| {
            Ok(Open {
                num_nodes: r.get(0)?,
                price_per_hour: r.get(1)?,
                price_source: r.get(2)?,
                phase: r.get(3)?,
            })
        },
    )
    .optional()
}

/// Inserts an open row for `cluster`'s `nodes` from `at`, in `phase`, at
/// `price` (USD per hour for these nodes, from `source`) or else the
/// plan's price for the whole cluster.
fn insert(
    conn: &rusqlite::Connection,
    cluster: &str,
    phase: &str,
    nodes: &[NodeRow],
    price: Option<(f64, &str)>,
    at: i64,
) -> rusqlite::Result<()> {
    // The managed job whose cluster this is: the newest that names it.
    let job: Option<i64> = conn
        .query_row(
            "SELECT id FROM managed_jobs WHERE cluster = ?1 ORDER BY id DESC LIMIT 1",
            [cluster],
            |r| r.get(0),
        )
        .optional()?;
    let (price, source) = match price {
        Some((p, s)) => (Some(p), Some(s)),
        None => (None, None),
    };
    conn.execute(
        "INSERT INTO ledger(cluster, managed_job, cloud, region, zone, instance_type, market,
            num_nodes, price_per_hour, started_at, price_source, phase, ranks)
         SELECT name, ?2, cloud, region, zone, instance_type,
            CASE use_spot WHEN 1 THEN 'spot' ELSE 'on-demand' END, ?3,
            COALESCE(?5, price_per_hour, 0), ?4, COALESCE(?6, 'plan'), ?7, ?8
         FROM clusters WHERE name = ?1 AND cloud IS NOT NULL",
        params![
            cluster,
            job,
            nodes.len() as i64,
            at,
            price,
            source,
            phase,
            ranks_text(nodes)
        ],
    )?;
    Ok(())
}

/// Opens a [`RUN`] row for `cluster`'s `nodes` (just recorded up, in the
/// caller's transaction), at the price their provider reported
/// (`reported`, all of them) or else the plan's. An open run row of as
/// many nodes is kept (the same stretch); any other open row (survivors
/// waiting, or fewer nodes) closes now and the new one starts at the same
/// instant.
pub(super) fn open(
    conn: &rusqlite::Connection,
    cluster: &str,
    nodes: &[NodeRow],
    reported: Option<f64>,
) -> rusqlite::Result<()> {
    let now = now_ms();
    if let Some(o) = open_row(conn, cluster)? {
        if o.phase == RUN && o.num_nodes as usize == nodes.len() {
            return Ok(());
        }
        close_at(conn, cluster, now)?;
    }
    insert(
        conn,
        cluster,
        RUN,
        nodes,
        reported.map(|p| (p, "provider")),
        now,
    )
}

/// The lost nodes of `cluster` are confirmed removed and `survivors` stay
/// up while replacements are sought: the open row closes now and a
/// [`SURVIVORS_WAITING`] row of the survivors alone opens at the same
/// instant, priced at what their provider reported for them, else at the
/// closing row's price per node (the gang's nodes are alike), else at the
/// plan's per node. Kept as it is when the open row already is that (a
/// replacement tried again after a restart of the controller).
pub(super) fn survivors_waiting(
    conn: &rusqlite::Connection,
    cluster: &str,
    survivors: &[NodeRow],
    reported: Option<f64>,
) -> rusqlite::Result<()> {
    let now = now_ms();
    let open = open_row(conn, cluster)?;
    if let Some(o) = &open {
        if o.phase == SURVIVORS_WAITING && o.num_nodes as usize == survivors.len() {
            return Ok(());
        }
    }
    let price = match (reported, &open) {
        (Some(p), _) => Some((p, "provider".to_string())),
        (None, Some(o)) if o.num_nodes > 0 => Some((
            o.price_per_hour / f64::from(o.num_nodes) * survivors.len() as f64,
            o.price_source.clone(),
        )),
        (None, _) => conn
            .query_row(
                "SELECT price_per_hour * ?2 / num_nodes FROM clusters
                 WHERE name = ?1 AND num_nodes > 0 AND price_per_hour IS NOT NULL",
                params![cluster, survivors.len() as i64],
                |r| r.get::<_, f64>(0),
            )
            .optional()?
            .map(|p| (p, "plan".to_string())),
    };
    close_at(conn, cluster, now)?;
    insert(
        conn,
        cluster,
        SURVIVORS_WAITING,
        survivors,
        price.as_ref().map(|(p, s)| (*p, s.as_str())),
        now,
    )
}

/// Closes `cluster`'s open row, if any: its nodes stopped or went.
pub(super) fn close(conn: &rusqlite::Connection, cluster: &str) -> rusqlite::Result<()> {
    close_at(conn, cluster, now_ms())
}

fn close_at(conn: &rusqlite::Connection, cluster: &str, at: i64) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE ledger SET ended_at = ?2 WHERE cluster = ?1 AND ended_at IS NULL",
        params![cluster, at],
    )?;
    Ok(())
}

impl Store {
    /// Every ledger row that overlaps `[from, to]`, oldest first.
    pub(crate) fn ledger(&self, from: i64, to: i64) -> Result<Vec<LedgerRow>, StateError> {
        self.query_all(
            &format!(
                "SELECT {COLUMNS} FROM ledger
                 WHERE started_at <= ?2 AND (ended_at IS NULL OR ended_at >= ?1) ORDER BY id"
            ),
            params![from, to],
            row,
        )
    }

    /// A managed job's ledger rows, oldest first.
    pub(crate) fn ledger_of_job(&self, job: i64) -> Result<Vec<LedgerRow>, StateError> {
        self.query_all(
            &format!("SELECT {COLUMNS} FROM ledger WHERE managed_job = ?1 ORDER BY id"),
            [job],
            row,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ClusterStatus, NewCluster, Placement, MIGRATIONS};
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        (dir, s)
    }

    fn node(rank: u32, id: &str, price: Option<f64>) -> NodeRow {
        NodeRow {
            rank,
            instance_id: id.into(),
            private_ip: format!("127.0.10.{}", rank + 1),
            public_ip: None,
            zone: "local-a".into(),
            topology: "s1/l1".into(),
            state: "running".into(),
            extra: price
                .map(|p| (gangway_provider::PRICE_FACT.to_string(), p.to_string()))
                .into_iter()
                .collect(),
        }
    }

    /// A 4-node spot cluster `a` at $8/hour (the plan's), up.
    fn gang(s: &Store, price: Option<f64>) -> Vec<NodeRow> {
        s.reserve_cluster(&NewCluster {
            name: "a",
            num_nodes: 4,
            client_token: "tok",
            provider_config: None,
        })
        .unwrap();
        s.set_placement(
            "a",
            &Placement {
                cloud: "local",
                region: "local",
                zone: "local-a",
                instance_type: "gpu",
                use_spot: true,
                accelerator: Some("A100"),
                accelerator_count: 1.0,
                price_per_hour: 8.0,
            },
        )
        .unwrap();
        let nodes: Vec<NodeRow> = (0..4).map(|r| node(r, &format!("i-{r}"), price)).collect();
        s.set_nodes("a", ClusterStatus::Up, &nodes).unwrap();
        nodes
    }

    fn rows(s: &Store) -> Vec<LedgerRow> {
        s.ledger(0, i64::MAX).unwrap()
    }

    fn pause() {
        std::thread::sleep(std::time::Duration::from_millis(15));
    }

    #[test]
    fn a_replacement_is_a_run_then_the_survivors_alone_then_a_run_back_to_back() {
        let (_d, s) = store();
        let mut nodes = gang(&s, None);
        pause();
        let kept = s.lost_nodes_removed("a", &[2]).unwrap();
        assert_eq!(
            kept.iter().map(|n| n.rank).collect::<Vec<_>>(),
            [0, 1, 3],
            "the survivors"
        );
        assert_eq!(s.nodes("a").unwrap()[2].state, "gone");
        let first = rows(&s)[0].clone();
        // Asked again (a controller restarted mid-replacement): the same
        // waiting stretch, not a second one.
        pause();
        s.lost_nodes_removed("a", &[2]).unwrap();
        assert_eq!(rows(&s).len(), 2);
        pause();
        nodes[2] = node(2, "i-new", None);
        s.set_nodes("a", ClusterStatus::Up, &nodes).unwrap();
        pause();
        s.remove_cluster("a").unwrap();
        let got = rows(&s);
        assert_eq!(got.len(), 3, "{got:#?}");
        assert_eq!(got[0], first, "a closed row is never rewritten");
        let phases: Vec<&str> = got.iter().map(|r| r.phase.as_str()).collect();
        assert_eq!(phases, [RUN, SURVIVORS_WAITING, RUN]);
        assert_eq!(
            got.iter().map(|r| r.num_nodes).collect::<Vec<_>>(),
            [4, 3, 4]
        );
        assert_eq!(got[0].ranks.as_deref(), Some(&[0, 1, 2, 3][..]));
        assert_eq!(got[1].ranks.as_deref(), Some(&[0, 1, 3][..]));
        // The survivors pay their share of the plan's price, no more.
        assert_eq!(got[0].price_per_hour, 8.0);
        assert_eq!(got[1].price_per_hour, 6.0);
        assert_eq!(got[2].price_per_hour, 8.0);
        assert!(got.iter().all(|r| r.price_source == "plan"));
        // Back to back, nothing counted twice, nothing left out.
        for w in got.windows(2) {
            assert_eq!(w[0].ended_at, Some(w[1].started_at), "{got:#?}");
        }
        assert!(got[1].ended_at.unwrap() > got[1].started_at);
        let (from, to) = (got[0].started_at, got[2].ended_at.unwrap());
        let node_ms: i64 = got
            .iter()
            .map(|r| (r.ended_at.unwrap() - r.started_at) * i64::from(r.num_nodes))
            .sum();
        let waited = got[1].ended_at.unwrap() - got[1].started_at;
        assert_eq!(
            node_ms,
            4 * (to - from) - waited,
            "one node less while waiting"
        );
        let cost: f64 = got.iter().map(|r| r.cost_within(from, to)).sum();
        let expect = (8.0 * (to - from - waited) as f64 + 6.0 * waited as f64) / 3_600_000.0;
        assert!((cost - expect).abs() < 1e-12, "{cost} vs {expect}");
        assert!(got[1].is_waiting() && !got[0].is_waiting());
    }

    #[test]
    fn the_survivors_are_priced_at_what_their_provider_reported() {
        let (_d, s) = store();
        gang(&s, Some(1.5));
        s.lost_nodes_removed("a", &[0, 3]).unwrap();
        let got = rows(&s);
        assert_eq!(got[0].price_per_hour, 6.0);
        assert_eq!(got[0].price_source, "provider");
        assert_eq!(got[1].num_nodes, 2);
        assert_eq!(got[1].price_per_hour, 3.0);
        assert_eq!(got[1].price_source, "provider");
        assert_eq!(got[1].ended_at, None, "open while they wait");
    }

    #[test]
    fn recording_the_same_nodes_up_again_keeps_the_open_run() {
        let (_d, s) = store();
        let nodes = gang(&s, None);
        s.set_nodes("a", ClusterStatus::Up, &nodes).unwrap();
        assert_eq!(rows(&s).len(), 1);
        // A stop closes it; starting again opens the next.
        s.set_status("a", ClusterStatus::Stopped, None).unwrap();
        s.set_nodes("a", ClusterStatus::Up, &nodes).unwrap();
        let got = rows(&s);
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|r| r.phase == RUN));
    }

    #[test]
    fn migration_10_marks_every_older_row_a_run_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = rusqlite::Connection::open(dir.path().join("state.db")).unwrap();
            for sql in &MIGRATIONS[..9] {
                conn.execute_batch(sql).unwrap();
            }
            conn.pragma_update(None, "user_version", 9).unwrap();
            conn.execute(
                "INSERT INTO ledger(cluster, cloud, market, num_nodes, price_per_hour,
                    started_at, ended_at, price_source)
                 VALUES ('old', 'aws', 'spot', 4, 2.5, 1000, 3601000, 'provider')",
                [],
            )
            .unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        let got = rows(&s);
        assert_eq!(got.len(), 1);
        let r = &got[0];
        assert_eq!((r.phase.as_str(), r.ranks.as_ref()), (RUN, None));
        assert_eq!((r.num_nodes, r.price_per_hour), (4, 2.5));
        assert_eq!((r.started_at, r.ended_at), (1000, Some(3_601_000)));
        assert_eq!(r.price_source, "provider");
        assert!((r.cost_within(0, i64::MAX) - 2.5).abs() < 1e-12);
        let v: i64 = s
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, 10);
    }
}
