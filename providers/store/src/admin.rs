//! Creating and removing whole buckets: one request each, which
//! `object_store` (an object API) does not make. S3's is signed with
//! `object_store`'s own SigV4 signer, GCS's carries its OAuth token, both
//! sent through `object_store`'s HTTP client, so no second SDK is built.

#[cfg(any(feature = "s3", feature = "gcs"))]
use object_store::client::{HttpClient, HttpConnector, HttpRequest, ReqwestConnector};

#[cfg(feature = "gcs")]
use crate::json_error_message;
#[cfg(feature = "s3")]
use crate::xml_field;
use crate::{Bucket, BucketUrl, Creds, StoreError};

/// How [`Bucket::create`] went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Created {
    /// The bucket was made by this call.
    New,
    /// It was there already, and these credentials own it.
    Existed,
}

impl Bucket {
    /// Creates the bucket (in `region` for S3, or the endpoint's region; in
    /// `project` for GCS, which needs one). A bucket these credentials
    /// already own is [`Created::Existed`]; a name someone else holds is an
    /// error saying so.
    pub async fn create(
        &self,
        region: Option<&str>,
        project: Option<&str>,
    ) -> Result<Created, StoreError> {
        let _ = (region, project);
        match &self.creds {
            #[cfg(feature = "s3")]
            Creds::S3(p) => s3_create(self, p, region).await,
            #[cfg(feature = "gcs")]
            Creds::Gcs(p) => gcs_create(self, p, project).await,
            #[cfg(not(any(feature = "s3", feature = "gcs")))]
            Creds::Never(n) => match *n {},
        }
    }

    /// Where S3 says the bucket is, when that is not the region requests
    /// are signed for (`AWS_REGION`): one HEAD of the bucket, whose answer
    /// names its region even when it refuses. `None` for GCS (a bucket's
    /// location does not change how it is reached), or when S3 does not
    /// say or agrees.
    pub(crate) async fn region_elsewhere(&self) -> Option<(String, String)> {
        match &self.creds {
            #[cfg(feature = "s3")]
            Creds::S3(p) => {
                let signed = self.endpoints.s3_region.as_deref().unwrap_or("us-east-1");
                let a = s3_signed(self, p, http::Method::HEAD, signed, String::new())
                    .await
                    .ok()?;
                a.region
                    .filter(|r| !r.is_empty() && r != signed)
                    .map(|r| (r, signed.to_string()))
            }
            #[cfg(feature = "gcs")]
            Creds::Gcs(_) => None,
            #[cfg(not(any(feature = "s3", feature = "gcs")))]
            Creds::Never(n) => match *n {},
        }
    }

    /// Deletes every object in the bucket, then the bucket. A bucket that
    /// is already gone is fine.
    pub async fn remove(&self) -> Result<(), StoreError> {
        let whole = Bucket::open_whole(self)?;
        let keys: Vec<String> = match whole.list("").await {
            Ok(objects) => objects.into_iter().map(|o| o.key).collect(),
            Err(e) if e.is_no_such_bucket() => return Ok(()),
            Err(e) => return Err(e),
        };
        whole.delete(&keys).await?;
        match &self.creds {
            #[cfg(feature = "s3")]
            Creds::S3(p) => s3_remove(self, p).await,
            #[cfg(feature = "gcs")]
            Creds::Gcs(p) => gcs_remove(self, p).await,
            #[cfg(not(any(feature = "s3", feature = "gcs")))]
            Creds::Never(n) => match *n {},
        }
    }

    /// The same bucket without a prefix, same client.
    fn open_whole(b: &Bucket) -> Result<Bucket, StoreError> {
        Ok(Bucket {
            url: BucketUrl {
                prefix: String::new(),
                ..b.url.clone()
            },
            store: std::sync::Arc::clone(&b.store),
            creds: b.creds.clone(),
            endpoints: b.endpoints.clone(),
        })
    }
}

#[cfg(any(feature = "s3", feature = "gcs"))]
fn client(url: &BucketUrl, endpoint: Option<&str>) -> Result<HttpClient, StoreError> {
    let options = object_store::ClientOptions::new()
        .with_allow_http(endpoint.is_some_and(|e| e.starts_with("http://")));
    ReqwestConnector::default()
        .connect(&options)
        .map_err(|e| StoreError::Store {
            url: url.clone(),
            reason: e.to_string(),
        })
}

/// Sends `req` and returns the status and body.
#[cfg(any(feature = "s3", feature = "gcs"))]
async fn send(
    url: &BucketUrl,
    client: &HttpClient,
    req: HttpRequest,
) -> Result<Answer, StoreError> {
    let fail = |reason: String| StoreError::Store {
        url: url.clone(),
        reason,
    };
    let resp = client.execute(req).await.map_err(|e| fail(e.to_string()))?;
    let status = resp.status().as_u16();
    let region = resp
        .headers()
        .get("x-amz-bucket-region")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp
        .into_body()
        .bytes()
        .await
        .map_err(|e| fail(e.to_string()))?;
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        region,
    })
}

/// A store's answer to one request.
#[cfg(any(feature = "s3", feature = "gcs"))]
struct Answer {
    status: u16,
    body: String,
    /// S3's `x-amz-bucket-region`: where the bucket is, sent even with a
    /// refusal.
    #[cfg_attr(not(feature = "s3"), allow(dead_code))]
    region: Option<String>,
}

/// S3's answer as a [`StoreError`].
#[cfg(feature = "s3")]
fn s3_error(url: &BucketUrl, status: u16, body: &str) -> StoreError {
    let code = xml_field(body, "Code").unwrap_or("");
    let message = xml_field(body, "Message").unwrap_or(body.trim());
    let reason = format!("{code} (HTTP {status}): {message}");
    match (status, code) {
        (404, _) | (_, "NoSuchBucket") => StoreError::NoSuchBucket { url: url.clone() },
        (403, _) | (_, "AccessDenied") => StoreError::AccessDenied {
            url: url.clone(),
            reason,
        },
        _ => StoreError::Store {
            url: url.clone(),
            reason,
        },
    }
}

#[cfg(feature = "s3")]
fn s3_bucket_uri(b: &Bucket, region: &str) -> String {
    match &b.endpoints.s3 {
        Some(ep) => format!("{}/{}", ep.trim_end_matches('/'), b.url.bucket),
        None => format!("https://{}.s3.{region}.amazonaws.com/", b.url.bucket),
    }
}

#[cfg(feature = "s3")]
async fn s3_signed(
    b: &Bucket,
    provider: &object_store::aws::AwsCredentialProvider,
    method: http::Method,
    region: &str,
    body: String,
) -> Result<Answer, StoreError> {
    let cred = provider
        .get_credential()
        .await
        .map_err(|e| StoreError::NoCredentials {
            url: b.url.clone(),
            reason: e.to_string(),
        })?;
    let fail = |reason: String| StoreError::Store {
        url: b.url.clone(),
        reason,
    };
    let mut req: HttpRequest = http::Request::builder()
        .method(method)
        .uri(s3_bucket_uri(b, region))
        .body(body.into())
        .map_err(|e| fail(e.to_string()))?;
    object_store::aws::AwsAuthorizer::new(&cred, "s3", region)
        .try_authorize(&mut req, None)
        .map_err(|e| fail(e.to_string()))?;
    send(&b.url, &client(&b.url, b.endpoints.s3.as_deref())?, req).await
}

#[cfg(feature = "s3")]
async fn s3_create(
    b: &Bucket,
    provider: &object_store::aws::AwsCredentialProvider,
    region: Option<&str>,
) -> Result<Created, StoreError> {
    let region = region
        .or(b.endpoints.s3_region.as_deref())
        .unwrap_or("us-east-1");
    // us-east-1 is the one region named by leaving the location out.
    let body = if region == "us-east-1" {
        String::new()
    } else {
        format!(
            "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <LocationConstraint>{region}</LocationConstraint></CreateBucketConfiguration>"
        )
    };
    let Answer {
        status, body: text, ..
    } = s3_signed(b, provider, http::Method::PUT, region, body).await?;
    match (status, xml_field(&text, "Code")) {
        (200..=299, _) => Ok(Created::New),
        (_, Some("BucketAlreadyOwnedByYou")) => Ok(Created::Existed),
        (_, Some("BucketAlreadyExists")) => Err(StoreError::Store {
            url: b.url.clone(),
            reason:
                "the name is taken by another account (bucket names are global); choose another"
                    .into(),
        }),
        _ => Err(s3_error(&b.url, status, &text)),
    }
}

#[cfg(feature = "s3")]
async fn s3_remove(
    b: &Bucket,
    provider: &object_store::aws::AwsCredentialProvider,
) -> Result<(), StoreError> {
    let region = b.endpoints.s3_region.as_deref().unwrap_or("us-east-1");
    let Answer {
        status, body: text, ..
    } = s3_signed(b, provider, http::Method::DELETE, region, String::new()).await?;
    match status {
        200..=299 | 404 => Ok(()),
        _ => Err(s3_error(&b.url, status, &text)),
    }
}

#[cfg(feature = "gcs")]
fn gcs_base(b: &Bucket) -> String {
    b.endpoints
        .gcs
        .as_deref()
        .unwrap_or("https://storage.googleapis.com")
        .trim_end_matches('/')
        .to_string()
}

/// GCS's JSON error body as a [`StoreError`].
#[cfg(feature = "gcs")]
fn gcs_error(url: &BucketUrl, status: u16, body: &str) -> StoreError {
    let message = json_error_message(body).unwrap_or_else(|| body.trim().to_string());
    let reason = format!("HTTP {status}: {message}");
    match status {
        404 => StoreError::NoSuchBucket { url: url.clone() },
        401 | 403 => StoreError::AccessDenied {
            url: url.clone(),
            reason,
        },
        _ => StoreError::Store {
            url: url.clone(),
            reason,
        },
    }
}

#[cfg(feature = "gcs")]
async fn gcs_request(
    b: &Bucket,
    provider: &object_store::gcp::GcpCredentialProvider,
    method: http::Method,
    uri: String,
    body: String,
) -> Result<(u16, String), StoreError> {
    let cred = provider
        .get_credential()
        .await
        .map_err(|e| StoreError::NoCredentials {
            url: b.url.clone(),
            reason: e.to_string(),
        })?;
    let mut builder = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    if !cred.bearer.is_empty() {
        builder = builder.header("authorization", format!("Bearer {}", cred.bearer));
    }
    let req: HttpRequest = builder.body(body.into()).map_err(|e| StoreError::Store {
        url: b.url.clone(),
        reason: e.to_string(),
    })?;
    let a = send(&b.url, &client(&b.url, b.endpoints.gcs.as_deref())?, req).await?;
    Ok((a.status, a.body))
}

#[cfg(feature = "gcs")]
async fn gcs_create(
    b: &Bucket,
    provider: &object_store::gcp::GcpCredentialProvider,
    project: Option<&str>,
) -> Result<Created, StoreError> {
    let Some(project) = project else {
        return Err(StoreError::Store {
            url: b.url.clone(),
            reason: "creating a GCS bucket needs a project: set GOOGLE_CLOUD_PROJECT".into(),
        });
    };
    let uri = format!("{}/storage/v1/b?project={project}", gcs_base(b));
    let body = serde_json::json!({
        "name": b.url.bucket,
        "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": true}},
    })
    .to_string();
    let (status, text) = gcs_request(b, provider, http::Method::POST, uri, body).await?;
    match status {
        200..=299 => Ok(Created::New),
        // 409: the name is held; by us when we can list it.
        409 => match b.check().await {
            Ok(()) => Ok(Created::Existed),
            Err(_) => Err(StoreError::Store {
                url: b.url.clone(),
                reason:
                    "the name is taken by another project (bucket names are global); choose another"
                        .into(),
            }),
        },
        _ => Err(gcs_error(&b.url, status, &text)),
    }
}

#[cfg(feature = "gcs")]
async fn gcs_remove(
    b: &Bucket,
    provider: &object_store::gcp::GcpCredentialProvider,
) -> Result<(), StoreError> {
    let uri = format!("{}/storage/v1/b/{}", gcs_base(b), b.url.bucket);
    let (status, text) = gcs_request(b, provider, http::Method::DELETE, uri, String::new()).await?;
    match status {
        200..=299 | 404 => Ok(()),
        _ => Err(gcs_error(&b.url, status, &text)),
    }
}
