//! `s3://bucket/prefix` and `gs://bucket/prefix`: parsed and checked
//! before anything is provisioned.

use std::fmt;

/// Which store a bucket lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    /// Amazon S3 (or an S3-compatible store at `GANGWAY_S3_ENDPOINT`).
    S3,
    /// Google Cloud Storage.
    Gcs,
}

impl Scheme {
    /// `s3` or `gs`, as URLs spell it.
    pub fn url_scheme(self) -> &'static str {
        match self {
            Scheme::S3 => "s3",
            Scheme::Gcs => "gs",
        }
    }

    /// The store of a task's `store:` field (`s3`, `gcs`), SkyPilot's names.
    pub fn from_store_name(name: &str) -> Option<Scheme> {
        match name.to_ascii_lowercase().as_str() {
            "s3" | "aws" => Some(Scheme::S3),
            "gcs" | "gs" | "gcp" => Some(Scheme::Gcs),
            _ => None,
        }
    }
}

/// A bucket and a prefix in it (no leading or trailing `/`; may be empty).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BucketUrl {
    /// The store.
    pub scheme: Scheme,
    /// The bucket's name.
    pub bucket: String,
    /// Where under the bucket (`a/b`), empty for the whole bucket.
    pub prefix: String,
}

/// Why a bucket URL is not one gangway can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Not `scheme://bucket[/prefix]`.
    #[error("'{0}' is not a bucket URL (expected s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX])")]
    Malformed(String),
    /// A store gangway does not reach (yet).
    #[error("'{url}': {scheme}:// buckets are not supported; s3:// and gs:// are")]
    Unsupported {
        /// The URL as written.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// A name the store would refuse.
    #[error("'{bucket}' is not a valid {store} bucket name: {why}")]
    BadName {
        /// The name.
        bucket: String,
        /// `S3` or `GCS`.
        store: &'static str,
        /// The rule it breaks.
        why: &'static str,
    },
}

impl BucketUrl {
    /// Parses `s3://bucket`, `s3://bucket/some/prefix/`, `gs://...`.
    pub fn parse(s: &str) -> Result<BucketUrl, UrlError> {
        let Some((scheme, rest)) = s.split_once("://") else {
            return Err(UrlError::Malformed(s.to_string()));
        };
        let scheme = match scheme {
            "s3" => Scheme::S3,
            "gs" => Scheme::Gcs,
            other => {
                return Err(UrlError::Unsupported {
                    url: s.to_string(),
                    scheme: other.to_string(),
                })
            }
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() || prefix.split('/').any(|p| p == "." || p == "..") {
            return Err(UrlError::Malformed(s.to_string()));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.contains("//") {
            return Err(UrlError::Malformed(s.to_string()));
        }
        BucketUrl::new(scheme, bucket, prefix)
    }

    /// A bucket of `scheme` named `bucket`, at `prefix`, its name checked.
    pub fn new(scheme: Scheme, bucket: &str, prefix: &str) -> Result<BucketUrl, UrlError> {
        check_name(scheme, bucket)?;
        Ok(BucketUrl {
            scheme,
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
        })
    }

    /// The same bucket, `more` further down.
    pub fn join(&self, more: &str) -> BucketUrl {
        let more = more.trim_matches('/');
        let prefix = match (self.prefix.is_empty(), more.is_empty()) {
            (_, true) => self.prefix.clone(),
            (true, false) => more.to_string(),
            (false, false) => format!("{}/{more}", self.prefix),
        };
        BucketUrl {
            prefix,
            ..self.clone()
        }
    }

    /// `remote:bucket/prefix`, rclone's spelling.
    pub fn rclone_path(&self, remote: &str) -> String {
        if self.prefix.is_empty() {
            format!("{remote}:{}", self.bucket)
        } else {
            format!("{remote}:{}/{}", self.bucket, self.prefix)
        }
    }
}

impl fmt::Display for BucketUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.url_scheme(), self.bucket)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        Ok(())
    }
}

/// The naming rules both stores publish, checked here so a typo fails
/// before any machine is started.
fn check_name(scheme: Scheme, name: &str) -> Result<(), UrlError> {
    let (store, max) = match scheme {
        // GCS allows up to 222 with dots, each part at most 63.
        Scheme::Gcs => ("GCS", if name.contains('.') { 222 } else { 63 }),
        Scheme::S3 => ("S3", 63),
    };
    let bad = |why| {
        Err(UrlError::BadName {
            bucket: name.to_string(),
            store,
            why,
        })
    };
    if name.len() < 3 || name.len() > max {
        return bad("names are 3 to 63 characters long");
    }
    let allowed = |c: char| {
        c.is_ascii_lowercase()
            || c.is_ascii_digit()
            || c == '-'
            || c == '.'
            || (scheme == Scheme::Gcs && c == '_')
    };
    if !name.chars().all(allowed) {
        return bad(match scheme {
            Scheme::S3 => "only lowercase letters, digits, '-' and '.'",
            Scheme::Gcs => "only lowercase letters, digits, '-', '_' and '.'",
        });
    }
    let ends_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !ends_ok(name.chars().next()) || !ends_ok(name.chars().last()) {
        return bad("it must start and end with a letter or digit");
    }
    if name.contains("..") {
        return bad("no two dots in a row");
    }
    if name.split('.').any(|part| part.len() > 63) {
        return bad("each dot-separated part is at most 63 characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_bucket_and_prefix() {
        let u = BucketUrl::parse("s3://my-data/train/shards/").unwrap();
        assert_eq!(
            (u.scheme, u.bucket.as_str(), u.prefix.as_str()),
            (Scheme::S3, "my-data", "train/shards")
        );
        assert_eq!(u.to_string(), "s3://my-data/train/shards");
        assert_eq!(u.rclone_path("gw"), "gw:my-data/train/shards");
        let g = BucketUrl::parse("gs://gpt2-data_skypilot").unwrap();
        assert_eq!((g.scheme, g.prefix.as_str()), (Scheme::Gcs, ""));
        assert_eq!(
            g.join("ck/run-1").to_string(),
            "gs://gpt2-data_skypilot/ck/run-1"
        );
        assert_eq!(u.join("x").rclone_path("r"), "r:my-data/train/shards/x");
    }

    #[test]
    fn bad_urls_and_names_say_what_is_wrong() {
        for (url, want) in [
            ("my-data", "is not a bucket URL"),
            ("s3://", "is not a bucket URL"),
            ("s3://b-1/a/../b", "is not a bucket URL"),
            ("r2://bucket", "r2:// buckets are not supported"),
            (
                "s3://My_Data",
                "only lowercase letters, digits, '-' and '.'",
            ),
            ("s3://ab", "3 to 63"),
            ("s3://-data", "start and end with a letter or digit"),
            ("gs://a..b", "no two dots"),
        ] {
            let e = BucketUrl::parse(url).unwrap_err().to_string();
            assert!(e.contains(want), "{url}: {e}");
        }
        // Underscores are GCS's, not S3's.
        assert!(BucketUrl::parse("gs://my_data").is_ok());
        assert!(BucketUrl::parse("s3://my_data").is_err());
    }
}
