//! Buckets gangway created for a task's storage mounts, and who owns them:
//! a cluster (`down` deletes the non-persistent ones) or a managed job (its
//! end does). Buckets that existed before are never recorded, so never
//! deleted.

use rusqlite::params;

use super::{now_ms, StateError, Store};

/// A bucket gangway made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CreatedBucket {
    /// `s3://name` or `gs://name`.
    pub(crate) url: String,
    /// `cluster:NAME` or `job:ID`.
    pub(crate) owner: String,
    /// Kept when its owner goes.
    pub(crate) persistent: bool,
}

/// A `buckets` row of `SELECT url, owner, persistent`.
fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<CreatedBucket> {
    Ok(CreatedBucket {
        url: r.get(0)?,
        owner: r.get(1)?,
        persistent: r.get(2)?,
    })
}

impl Store {
    /// Records `url` as about to be created for `owner`, before it is.
    /// Returns whether it is `owner`'s: a row of another owner (a
    /// concurrent launch making the same bucket) is left as it is, and the
    /// bucket is not this owner's to delete.
    pub(crate) fn add_bucket(
        &self,
        url: &str,
        owner: &str,
        persistent: bool,
    ) -> Result<bool, StateError> {
        let inserted = self
            .conn
            .execute(
                "INSERT INTO buckets(url, owner, persistent, created_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(url) DO NOTHING",
                params![url, owner, persistent, now_ms()],
            )
            .map_err(|e| self.db(e))?;
        if inserted == 1 {
            return Ok(true);
        }
        // A retried launch of the same owner keeps its row.
        let ours = self
            .conn
            .execute(
                "UPDATE buckets SET persistent = ?3 WHERE url = ?1 AND owner = ?2",
                params![url, owner, persistent],
            )
            .map_err(|e| self.db(e))?;
        Ok(ours == 1)
    }

    /// The buckets `owner` created.
    pub(crate) fn buckets_of(&self, owner: &str) -> Result<Vec<CreatedBucket>, StateError> {
        self.query_all(
            "SELECT url, owner, persistent FROM buckets WHERE owner = ?1 ORDER BY url",
            [owner],
            row,
        )
    }

    /// One recorded bucket.
    #[cfg(test)]
    pub(crate) fn bucket(&self, url: &str) -> Result<Option<CreatedBucket>, StateError> {
        Ok(self
            .query_all(
                "SELECT url, owner, persistent FROM buckets WHERE url = ?1",
                [url],
                row,
            )?
            .pop())
    }

    /// Hands every bucket of `from` to `to`.
    pub(crate) fn move_buckets(&self, from: &str, to: &str) -> Result<(), StateError> {
        self.conn
            .execute(
                "UPDATE buckets SET owner = ?2 WHERE owner = ?1",
                params![from, to],
            )
            .map_err(|e| self.db(e))?;
        Ok(())
    }

    /// Forgets `url` (deleted, or kept as persistent).
    pub(crate) fn forget_bucket(&self, url: &str) -> Result<(), StateError> {
        self.conn
            .execute("DELETE FROM buckets WHERE url = ?1", [url])
            .map_err(|e| self.db(e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_recorded_moved_and_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.add_bucket("s3://a", "cluster:c1", false).unwrap();
        s.add_bucket("gs://b", "job:pending-x", true).unwrap();
        assert_eq!(s.buckets_of("cluster:c1").unwrap().len(), 1);
        s.move_buckets("job:pending-x", "job:7").unwrap();
        let j = s.buckets_of("job:7").unwrap();
        assert_eq!(j.len(), 1);
        assert!(j[0].persistent);
        assert!(s.buckets_of("job:pending-x").unwrap().is_empty());
        // Another owner's bucket is never taken over (a concurrent launch
        // that found it missing too must not delete it at its down).
        assert!(!s.add_bucket("s3://a", "cluster:c2", false).unwrap());
        assert_eq!(s.bucket("s3://a").unwrap().unwrap().owner, "cluster:c1");
        assert!(s.add_bucket("s3://a", "cluster:c1", true).unwrap());
        s.forget_bucket("s3://a").unwrap();
        assert!(s.bucket("s3://a").unwrap().is_none());
        assert!(s.bucket("gs://b").unwrap().is_some());
    }
}
