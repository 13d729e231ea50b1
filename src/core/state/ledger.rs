//! The cost ledger: one row per stretch of time a cluster's nodes were up,
//! with the market and the price the plan gave (USD per hour, the whole
//! cluster). A row opens when a cluster's nodes are recorded up and
//! closes when they stop or the cluster is gone; rows outlive their
//! cluster (`down`) and are never rewritten after they close, so costs
//! add up across a managed job's recoveries and across restarts of the
//! controller.

use rusqlite::{params, OptionalExtension};
use serde::Serialize;

use super::{now_ms, StateError, Store};

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
    /// Nodes.
    pub(crate) num_nodes: u32,
    /// USD per hour, whole cluster.
    pub(crate) price_per_hour: f64,
    /// Where the price came from: `plan` (the catalog's, as the optimizer
    /// chose) or `provider` (what the provider reported for the nodes it
    /// launched, such as the spot market price in their zone then).
    pub(crate) price_source: String,
    /// When the nodes were recorded up (ms since the epoch).
    pub(crate) started_at: i64,
    /// When they stopped or went; `None` while they are up.
    pub(crate) ended_at: Option<i64>,
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
}

const COLUMNS: &str = "id, cluster, managed_job, cloud, region, zone, instance_type, market,
    num_nodes, price_per_hour, started_at, ended_at, price_source";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<LedgerRow> {
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
    })
}

/// Opens a row for `cluster` from its placement, unless one is open: in
/// the caller's transaction, with the nodes just recorded, at the price
/// their provider reported (`reported`, whole cluster) or else the plan's.
pub(super) fn open(
    conn: &rusqlite::Connection,
    cluster: &str,
    nodes: usize,
    reported: Option<f64>,
) -> rusqlite::Result<()> {
    let open: Option<i64> = conn
        .query_row(
            "SELECT id FROM ledger WHERE cluster = ?1 AND ended_at IS NULL",
            [cluster],
            |r| r.get(0),
        )
        .optional()?;
    if open.is_some() {
        return Ok(());
    }
    // The managed job whose cluster this is: the newest that names it.
    let job: Option<i64> = conn
        .query_row(
            "SELECT id FROM managed_jobs WHERE cluster = ?1 ORDER BY id DESC LIMIT 1",
            [cluster],
            |r| r.get(0),
        )
        .optional()?;
    conn.execute(
        "INSERT INTO ledger(cluster, managed_job, cloud, region, zone, instance_type, market,
            num_nodes, price_per_hour, started_at, price_source)
         SELECT name, ?2, cloud, region, zone, instance_type,
            CASE use_spot WHEN 1 THEN 'spot' ELSE 'on-demand' END, ?3,
            COALESCE(?5, price_per_hour, 0), ?4,
            CASE WHEN ?5 IS NULL THEN 'plan' ELSE 'provider' END
         FROM clusters WHERE name = ?1 AND cloud IS NOT NULL",
        params![cluster, job, nodes as i64, now_ms(), reported],
    )?;
    Ok(())
}

/// Closes `cluster`'s open row, if any: its nodes stopped or went.
pub(super) fn close(conn: &rusqlite::Connection, cluster: &str) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE ledger SET ended_at = ?2 WHERE cluster = ?1 AND ended_at IS NULL",
        params![cluster, now_ms()],
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
