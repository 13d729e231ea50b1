//! Azure Resource Manager's error codes, sorted into what the failover loop
//! does with them.

use gangway_provider::ErrorKind;

/// What the failover loop should do with an ARM error: its `code`, its
/// `message` (a quota is sometimes only said in words) and the HTTP status
/// it came with (0 for an error of a long-running operation).
pub fn classify(code: &str, message: &str, status: u16) -> ErrorKind {
    let lower = message.to_ascii_lowercase();
    match code {
        // No room for this size here: another zone, size or cloud.
        "SkuNotAvailable"
        | "AllocationFailed"
        | "ZonalAllocationFailed"
        | "OverconstrainedAllocationRequest"
        | "OverconstrainedZonalAllocationRequest"
        | "SpotMaxPriceTooLow"
        | "VMSizeNotSupported" => ErrorKind::Capacity,
        // Subscription limits hold for the whole region.
        "QuotaExceeded" | "SpotQuotaExceeded" | "LowPriorityQuotaExceeded" => ErrorKind::Quota,
        // Compute says a quota in words under a general code.
        "OperationNotAllowed" if lower.contains("quota") => ErrorKind::Quota,
        "OperationNotAllowed" if lower.contains("toomanyrequests") => ErrorKind::Transient,
        "AuthenticationFailed"
        | "InvalidAuthenticationToken"
        | "InvalidAuthenticationTokenTenant"
        | "ExpiredAuthenticationToken"
        | "AuthorizationFailed"
        | "LinkedAuthorizationFailed"
        | "SubscriptionNotFound"
        | "InvalidSubscriptionId"
        | "SubscriptionNotRegistered"
        | "MissingSubscriptionRegistration"
        | "DisallowedByAzure"
        | "RequestDisallowedByPolicy" => ErrorKind::Auth,
        "TooManyRequests"
        | "RetryableError"
        | "InternalServerError"
        | "InternalExecutionError"
        | "ServiceUnavailable"
        | "GatewayTimeout"
        | "Conflict"
        | "AnotherOperationInProgress"
        | "RetryableErrorDueToAnotherOperation"
        | "NicInUse"
        | "PublicIPAddressCannotBeDeleted"
        | "InUseNetworkSecurityGroupCannotBeDeleted"
        | "InUseSubnetCannotBeDeleted" => ErrorKind::Transient,
        "InvalidParameter"
        | "InvalidRequestContent"
        | "InvalidRequestFormat"
        | "LocationRequired"
        | "LocationNotAvailableForResourceType"
        | "InvalidResourceReference"
        | "InvalidResourceGroupLocation"
        | "MissingApiVersionParameter"
        | "NoRegisteredProviderFound"
        | "InvalidApiVersionParameter"
        | "InvalidResourceType"
        | "ImageNotFound"
        | "PlatformImageNotFound"
        | "VMSizeIsNotPermittedToEnableAcceleratedNetworking"
        | "BadRequest" => ErrorKind::InvalidRequest,
        _ => match status {
            401 | 403 => ErrorKind::Auth,
            429 | 500 | 502 | 503 | 504 => ErrorKind::Transient,
            400 | 404 => ErrorKind::InvalidRequest,
            _ => ErrorKind::Fatal,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_room_is_capacity_and_fails_over() {
        for code in [
            "SkuNotAvailable",
            "AllocationFailed",
            "ZonalAllocationFailed",
            "OverconstrainedAllocationRequest",
            "OverconstrainedZonalAllocationRequest",
        ] {
            assert_eq!(classify(code, "", 409), ErrorKind::Capacity, "{code}");
            assert_eq!(classify(code, "", 0), ErrorKind::Capacity, "{code}");
        }
    }

    #[test]
    fn quotas_are_quota_whether_coded_or_worded() {
        assert_eq!(classify("QuotaExceeded", "", 409), ErrorKind::Quota);
        let worded = "Operation could not be completed as it results in exceeding approved \
                      Low Priority Cores quota. Location: eastus";
        assert_eq!(
            classify("OperationNotAllowed", worded, 409),
            ErrorKind::Quota
        );
        // The same code about something else is not a quota.
        assert_eq!(
            classify("OperationNotAllowed", "disk is attached", 409),
            ErrorKind::Fatal
        );
    }

    #[test]
    fn refused_credentials_stop_and_throttling_retries() {
        for code in [
            "AuthenticationFailed",
            "InvalidAuthenticationToken",
            "ExpiredAuthenticationToken",
            "AuthorizationFailed",
        ] {
            assert_eq!(classify(code, "", 401), ErrorKind::Auth, "{code}");
        }
        assert_eq!(classify("Whatever", "", 403), ErrorKind::Auth);
        assert_eq!(classify("TooManyRequests", "", 429), ErrorKind::Transient);
        assert_eq!(
            classify("OperationNotAllowed", "details: TooManyRequests", 409),
            ErrorKind::Transient
        );
        assert_eq!(classify("Unknown", "", 503), ErrorKind::Transient);
        assert_eq!(
            classify("InvalidRequestContent", "", 400),
            ErrorKind::InvalidRequest
        );
    }
}
