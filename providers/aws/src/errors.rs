//! EC2's error codes, sorted into what the failover loop does with them.

use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use gangway_provider::{ErrorKind, ProviderError};

/// What the failover loop should do with an EC2 error code.
pub fn classify(code: &str) -> ErrorKind {
    match code {
        // No room here for this type: try another zone, type or cloud. A spot
        // bid below the market and a type this zone does not sell are the
        // same to the loop.
        "InsufficientInstanceCapacity"
        | "InsufficientCapacityOnHost"
        | "InsufficientHostCapacity"
        | "InsufficientReservedInstanceCapacity"
        | "InsufficientFreeAddressesInSubnet"
        | "SpotMaxPriceTooLow"
        | "Unsupported"
        | "InstanceCreditSpecification.NotSupported" => ErrorKind::Capacity,
        // Account limits hold for the whole region.
        "MaxSpotInstanceCountExceeded"
        | "InstanceLimitExceeded"
        | "VcpuLimitExceeded"
        | "PendingVerification"
        | "OptInRequired"
        | "MaxIOPSLimitExceeded"
        | "VolumeLimitExceeded"
        | "SecurityGroupLimitExceeded"
        | "RulesPerSecurityGroupLimitExceeded"
        | "PlacementGroupLimitExceeded"
        | "KeyPairLimitExceeded"
        | "AddressLimitExceeded" => ErrorKind::Quota,
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "ServiceUnavailable"
        | "Unavailable"
        | "InternalError"
        | "InternalFailure"
        | "RequestExpired"
        | "IdempotentInstanceTerminated" => ErrorKind::Transient,
        "UnauthorizedOperation"
        | "AuthFailure"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "ExpiredToken"
        | "ExpiredTokenException"
        | "Blocked"
        | "AccessDenied"
        | "AccessDeniedException" => ErrorKind::Auth,
        c if c.starts_with("InvalidAMIID")
            || c.starts_with("InvalidParameter")
            || c.starts_with("InvalidKeyPair")
            || c.starts_with("InvalidGroup")
            || c.starts_with("InvalidSubnet")
            || c.starts_with("InvalidVpc")
            || c == "MissingParameter"
            || c == "IdempotentParameterMismatch"
            || c == "UnsupportedOperation"
            || c == "InvalidInstanceType" =>
        {
            ErrorKind::InvalidRequest
        }
        _ => ErrorKind::Fatal,
    }
}

/// One place for the hint a user needs after an auth failure.
const AUTH_HINT: &str = "check the credentials the AWS SDK found \
     (AWS_PROFILE / AWS_ACCESS_KEY_ID, `aws sso login`) and that they allow EC2; \
     `gangway check` shows which identity is in use";

/// Turns an SDK error into gangway's, naming the region/zone and EC2's own
/// words. Credentials never appear: EC2's messages do not carry them and
/// the request is not included.
pub fn from_sdk<E, R>(err: SdkError<E, R>, location: &str, call: &str) -> ProviderError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    let (kind, message) = match &err {
        SdkError::ServiceError(se) => {
            let e = se.err();
            let code = e.code().unwrap_or("Unknown");
            let words = e.message().unwrap_or("no message");
            let kind = classify(code);
            let mut message = format!("{call}: {code}: {words}");
            if kind == ErrorKind::Auth {
                message.push_str(&format!(" ({AUTH_HINT})"));
            }
            (kind, message)
        }
        SdkError::TimeoutError(_) => (ErrorKind::Transient, format!("{call}: timed out")),
        SdkError::DispatchFailure(d) => {
            let chain = gangway_provider::error_chain(&err);
            if chain.contains("loading credentials") || chain.contains("no credentials") {
                // Every source in the chain failed: no retry will help.
                (
                    ErrorKind::Auth,
                    format!("{call}: no usable AWS credentials ({chain}) ({AUTH_HINT})"),
                )
            } else {
                let why = if d.is_timeout() {
                    "timed out".to_string()
                } else if d.is_io() {
                    format!("cannot reach the EC2 endpoint ({chain})")
                } else {
                    chain
                };
                (ErrorKind::Transient, format!("{call}: {why}"))
            }
        }
        SdkError::ConstructionFailure(_) => {
            let chain = gangway_provider::error_chain(&err);
            // The SDK refuses to build a request without credentials: that is
            // the most common first-run failure.
            let kind = if chain.contains("credential") {
                ErrorKind::Auth
            } else {
                ErrorKind::InvalidRequest
            };
            let mut message = format!("{call}: {chain}");
            if kind == ErrorKind::Auth {
                message.push_str(&format!(" ({AUTH_HINT})"));
            }
            (kind, message)
        }
        _ => (
            ErrorKind::Fatal,
            format!("{call}: {}", gangway_provider::error_chain(&err)),
        ),
    };
    ProviderError::new(kind, "aws", location, message)
}

/// The EC2 error code of an SDK error, if the service answered with one.
pub fn code_of<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> Option<&str> {
    match err {
        SdkError::ServiceError(se) => se.err().code(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_the_failover_loop_acts_on() {
        for (code, kind) in [
            ("InsufficientInstanceCapacity", ErrorKind::Capacity),
            ("InsufficientCapacityOnHost", ErrorKind::Capacity),
            ("SpotMaxPriceTooLow", ErrorKind::Capacity),
            ("Unsupported", ErrorKind::Capacity),
            ("MaxSpotInstanceCountExceeded", ErrorKind::Quota),
            ("InstanceLimitExceeded", ErrorKind::Quota),
            ("VcpuLimitExceeded", ErrorKind::Quota),
            ("RequestLimitExceeded", ErrorKind::Transient),
            ("Throttling", ErrorKind::Transient),
            ("UnauthorizedOperation", ErrorKind::Auth),
            ("AuthFailure", ErrorKind::Auth),
            ("InvalidAMIID.NotFound", ErrorKind::InvalidRequest),
            ("InvalidParameterValue", ErrorKind::InvalidRequest),
            ("SomethingNew", ErrorKind::Fatal),
        ] {
            assert_eq!(classify(code), kind, "{code}");
        }
    }
}
