//! GCE's errors, onto the failover loop's kinds.

use gangway_provider::ErrorKind;
use google_cloud_gax::error::rpc::StatusDetails;

/// The kind of an operation that ended with these `error.errors[].code`s
/// (and, where GCE gives one, its HTTP status).
pub fn classify_codes(codes: &[String], http: Option<i32>) -> ErrorKind {
    let has = |p: &str| codes.iter().any(|c| c.contains(p));
    if has("RESOURCE_POOL_EXHAUSTED") || has("STOCKOUT") || has("RESOURCE_AVAILABILITY") {
        ErrorKind::Capacity
    } else if has("QUOTA_EXCEEDED") || has("QUOTA") {
        ErrorKind::Quota
    } else if has("RATE_EXCEEDED") || has("RATE_LIMIT") || has("INTERNAL_ERROR") {
        ErrorKind::Transient
    } else if has("UNSUPPORTED") || has("INVALID") || has("NOT_FOUND") {
        ErrorKind::InvalidRequest
    } else if let Some(h) = http {
        classify_http(h as u16, &[])
    } else {
        ErrorKind::Fatal
    }
}

/// The kind of a call that failed with HTTP `status` and these reasons.
pub fn classify_http(status: u16, reasons: &[String]) -> ErrorKind {
    let has = |p: &str| reasons.iter().any(|r| r.eq_ignore_ascii_case(p));
    match status {
        401 | 403 if has("quotaExceeded") || has("QUOTA_EXCEEDED") => ErrorKind::Quota,
        401 | 403 if has("rateLimitExceeded") || has("RATE_LIMIT_EXCEEDED") => ErrorKind::Transient,
        401 | 403 => ErrorKind::Auth,
        429 => ErrorKind::Transient,
        s if s >= 500 => ErrorKind::Transient,
        400 | 404 | 409 | 412 => ErrorKind::InvalidRequest,
        _ => ErrorKind::Fatal,
    }
}

/// A failed call's kind and words (status, reasons, message).
pub fn describe(e: &google_cloud_gax::error::Error) -> (ErrorKind, String) {
    // The retry loop may wrap the last error: look through it.
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut inner = e;
    while let Some(x) = cur {
        if let Some(g) = x.downcast_ref::<google_cloud_gax::error::Error>() {
            if g.http_status_code().is_some() || g.status().is_some() {
                inner = g;
                break;
            }
        }
        cur = x.source();
    }
    let reasons: Vec<String> = inner
        .status()
        .map(|s| {
            s.details
                .iter()
                .filter_map(|d| match d {
                    StatusDetails::ErrorInfo(i) => Some(i.reason.clone()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let message = inner
        .status()
        .map(|s| s.message.clone())
        .unwrap_or_else(|| e.to_string());
    let kind = if let Some(code) = inner.http_status_code() {
        classify_http(code, &reasons)
    } else if e.is_authentication() {
        ErrorKind::Auth
    } else if e.is_connect() || e.is_timeout() || e.is_io() || e.is_exhausted() {
        ErrorKind::Transient
    } else {
        ErrorKind::Fatal
    };
    let status = inner
        .http_status_code()
        .map(|c| format!("HTTP {c}"))
        .unwrap_or_default();
    let reasons = if reasons.is_empty() {
        String::new()
    } else {
        format!(" ({})", reasons.join(", "))
    };
    (
        kind,
        format!("{status}{reasons} {message}").trim().to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(c: &[&str]) -> Vec<String> {
        c.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_codes_the_failover_loop_acts_on() {
        assert_eq!(
            classify_codes(&v(&["ZONE_RESOURCE_POOL_EXHAUSTED"]), Some(503)),
            ErrorKind::Capacity
        );
        assert_eq!(
            classify_codes(&v(&["ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"]), None),
            ErrorKind::Capacity
        );
        assert_eq!(
            classify_codes(&v(&["QUOTA_EXCEEDED"]), Some(403)),
            ErrorKind::Quota
        );
        assert_eq!(
            classify_codes(&v(&["RESOURCE_OPERATION_RATE_EXCEEDED"]), None),
            ErrorKind::Transient
        );
        assert_eq!(classify_http(429, &[]), ErrorKind::Transient);
        assert_eq!(classify_http(503, &[]), ErrorKind::Transient);
        assert_eq!(classify_http(401, &[]), ErrorKind::Auth);
        assert_eq!(classify_http(403, &v(&["quotaExceeded"])), ErrorKind::Quota);
        assert_eq!(classify_http(400, &[]), ErrorKind::InvalidRequest);
    }
}

/// What went wrong outside a Compute Engine call: reading the credentials
/// file `gangway check` describes, and reading prices from the Cloud
/// Billing catalog. Never holds a secret (an API key travels in URLs,
/// which these messages leave out).
#[derive(Debug, thiserror::Error)]
pub enum GcpError {
    /// The credentials file cannot be read.
    #[error("{whence} cannot be read: {source}")]
    CredentialsUnreadable {
        /// Which file, and how it was found.
        whence: String,
        /// Why.
        source: std::io::Error,
    },
    /// The credentials file is not JSON.
    #[error("{whence} is not a credentials JSON file: {source}")]
    CredentialsNotJson {
        /// Which file.
        whence: String,
        /// Why.
        source: serde_json::Error,
    },
    /// The credentials file has no `type`.
    #[error("{whence} has no \"type\": not a credentials file")]
    CredentialsWithoutType {
        /// Which file.
        whence: String,
    },
    /// A service-account key without its account.
    #[error("{whence}: a service-account key without client_email")]
    KeyWithoutEmail {
        /// Which file.
        whence: String,
    },
    /// Credentials of a type gangway does not know.
    #[error("{whence}: credentials of type {kind:?} are not known")]
    UnknownCredentials {
        /// Which file.
        whence: String,
        /// Its `type`.
        kind: String,
    },
    /// No credentials for the Cloud Billing API could be made.
    #[error("no credentials for the Cloud Billing API ({0}); set GANGWAY_GCP_BILLING_API_KEY or run `gcloud auth application-default login`")]
    BillingNoCredentials(String),
    /// The credentials did not give a token.
    #[error("the Cloud Billing API needs credentials: {0}")]
    BillingCredentials(String),
    /// No HTTP client.
    #[error("cannot make an HTTP client: {0}")]
    HttpClient(String),
    /// A request to the Cloud Billing API failed.
    #[error("the Cloud Billing API at {base}: {why}")]
    Billing {
        /// Its endpoint.
        base: String,
        /// Why (without the URL).
        why: String,
    },
    /// It answered something that is not JSON.
    #[error("the Cloud Billing API at {base} answered {status} with no JSON")]
    BillingNotJson {
        /// Its endpoint.
        base: String,
        /// The HTTP status.
        status: http::StatusCode,
    },
    /// It refused the request.
    #[error("the Cloud Billing API refused ({status} {code}): {message}")]
    BillingRefused {
        /// The HTTP status.
        status: u16,
        /// Google's status name (`PERMISSION_DENIED`), or empty.
        code: String,
        /// Its message.
        message: String,
    },
    /// It did not stop paging.
    #[error("the Cloud Billing API kept paging past 200 pages")]
    TooManyPages,
}
