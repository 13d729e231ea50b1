//! A GCS token for nodes, narrowed to one bucket and prefix: the user's
//! token is exchanged at Google's Security Token Service for one that
//! carries a Credential Access Boundary, so a node (or whoever reads its
//! environment) can reach the task's objects and nothing else the user can.
//! What S3 nodes get from a federation session's policy, for GCS.

use crate::BucketUrl;

/// Google's Security Token Service, unless `GANGWAY_GCS_STS_ENDPOINT`
/// names another (an emulator's).
const GOOGLE_STS: &str = "https://sts.googleapis.com";

/// The role a node's token keeps on its objects: read, write and delete
/// them (checkpoints are rewritten and pruned; mounts write back). No
/// bucket permission at all.
const ROLE: &str = "inRole:roles/storage.objectAdmin";

/// The access boundary of `url`: its bucket's objects under its prefix
/// (`P/...`) and listings of that prefix, or the whole bucket's objects
/// when there is no prefix, or when the prefix holds a character the
/// condition language would need escaped (`'`, `\`, a control character:
/// then the bucket, as S3's too-long policy falls back to).
pub(crate) fn access_boundary(url: &BucketUrl) -> serde_json::Value {
    let bucket = &url.bucket;
    let mut rule = serde_json::json!({
        "availableResource": format!("//storage.googleapis.com/projects/_/buckets/{bucket}"),
        "availablePermissions": [ROLE],
    });
    let prefix = url.prefix.trim_matches('/');
    let plain = |s: &str| !s.chars().any(|c| c == '\'' || c == '\\' || c.is_control());
    if !prefix.is_empty() && plain(prefix) && plain(bucket) {
        rule["availabilityCondition"] = serde_json::json!({
            "title": "gangway node",
            "expression": format!(
                "resource.name.startsWith('projects/_/buckets/{bucket}/objects/{prefix}/') || \
                 api.getAttribute('storage.googleapis.com/objectListPrefix', '').startsWith('{prefix}/')"
            ),
        });
    }
    serde_json::json!({ "accessBoundary": { "accessBoundaryRules": [rule] } })
}

/// `application/x-www-form-urlencoded` of `pairs`.
fn form(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// `bearer` exchanged for a token bounded to `url` ([`access_boundary`]):
/// the new token and, when STS said, its lifetime in seconds (a token made
/// from a user's own is told no lifetime: it ends with the one it came
/// from). `Err` is STS's reason, never a token.
pub(crate) async fn downscope(
    bearer: &str,
    url: &BucketUrl,
) -> Result<(String, Option<u64>), String> {
    let sts = std::env::var("GANGWAY_GCS_STS_ENDPOINT")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| GOOGLE_STS.to_string());
    let endpoint = format!("{}/v1/token", sts.trim_end_matches('/'));
    let options = access_boundary(url).to_string();
    let body = form(&[
        (
            "grant_type",
            "urn:ietf:params:oauth:grant-type:token-exchange",
        ),
        (
            "subject_token_type",
            "urn:ietf:params:oauth:token-type:access_token",
        ),
        (
            "requested_token_type",
            "urn:ietf:params:oauth:token-type:access_token",
        ),
        ("subject_token", bearer),
        ("options", &options),
    ]);
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let answer = http
        .post(&endpoint)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .map_err(|e| format!("{endpoint}: {}", without_url(&e)))?;
    let status = answer.status();
    let bytes = answer
        .bytes()
        .await
        .map_err(|e| format!("{endpoint}: {}", without_url(&e)))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    if !status.is_success() {
        let said = match (v["error"].as_str(), v["error_description"].as_str()) {
            (Some(e), Some(d)) => format!("{e}: {d}"),
            (Some(e), None) => e.to_string(),
            _ => String::from_utf8_lossy(&bytes).chars().take(300).collect(),
        };
        return Err(format!(
            "{endpoint} answered HTTP {}: {said}",
            status.as_u16()
        ));
    }
    let token = v["access_token"]
        .as_str()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| format!("{endpoint} answered without an access_token"))?;
    Ok((token.to_string(), v["expires_in"].as_u64()))
}

/// A request error's words without the URL's query (never a token: the
/// token is in the body, but keep it that way whatever reqwest prints).
fn without_url(e: &reqwest::Error) -> String {
    let s = e.to_string();
    match e.url() {
        Some(u) => s.replace(u.as_str(), "STS"),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> BucketUrl {
        BucketUrl::parse(s).unwrap()
    }

    #[test]
    fn the_boundary_is_the_bucket_and_prefix_and_nothing_else() {
        let b = access_boundary(&url("gs://ckpt/jobs/7"));
        let rules = b["accessBoundary"]["accessBoundaryRules"]
            .as_array()
            .unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0]["availableResource"],
            "//storage.googleapis.com/projects/_/buckets/ckpt"
        );
        assert_eq!(rules[0]["availablePermissions"][0], ROLE);
        let e = rules[0]["availabilityCondition"]["expression"]
            .as_str()
            .unwrap();
        assert!(
            e.contains("startsWith('projects/_/buckets/ckpt/objects/jobs/7/')")
                && e.contains("objectListPrefix', '').startsWith('jobs/7/')"),
            "{e}"
        );
        // No prefix: the bucket's objects.
        let b = access_boundary(&url("gs://ckpt"));
        assert!(b["accessBoundary"]["accessBoundaryRules"][0]
            .get("availabilityCondition")
            .is_none());
        // A prefix the expression could not quote safely: the bucket, not
        // an expression a quote breaks out of.
        let b = access_boundary(&BucketUrl {
            scheme: crate::Scheme::Gcs,
            bucket: "ckpt".into(),
            prefix: "a')||true||('".into(),
        });
        assert!(
            b["accessBoundary"]["accessBoundaryRules"][0]
                .get("availabilityCondition")
                .is_none(),
            "{b}"
        );
    }

    #[test]
    fn the_form_is_percent_encoded() {
        assert_eq!(
            form(&[("a", "x y&z=1"), ("options", "{\"k\":[1]}")]),
            "a=x%20y%26z%3D1&options=%7B%22k%22%3A%5B1%5D%7D"
        );
    }
}
