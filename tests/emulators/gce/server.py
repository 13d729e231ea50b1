#!/usr/bin/env python3
"""Fake Google Compute Engine (Compute v1 REST/JSON) for gangway's GCP tests.

A standard-library HTTP server that speaks the part of the Compute Engine
API the GCP provider uses, checked against Google's own discovery document
(compute.v1.json from google-api-python-client, see setup.sh):

* every request is routed by the document's path templates and its path and
  query parameters and JSON body are checked against the method's schema
  (unknown fields, types, enums, int64-as-string, patterns, required fields);
  violations get Google's JSON error (HTTP 400) naming the JSON path;
* instances (insert, bulkInsert, get, list, aggregatedList, delete, stop,
  start), zone/region/global operations (get, list, wait, delete), machine
  and accelerator types (get, list, aggregatedList), zones, regions,
  projects.get, resource policies and firewalls;
* operations run PENDING -> RUNNING -> DONE over successive GETs (or after a
  few seconds), and fail the way GCE's do: DONE with `error.errors[]`;
* control endpoints under /_gangway/ for fault injection, spot preemption,
  capacity limits and settings; a GCE metadata server (instance/preempted
  with wait_for_change long polls) per instance;
* instances.getGuestAttributes with the `hostkeys/` namespace the guest
  agent writes: the host keys of the test's sshd (the `host_keys` setting,
  or one instance's own), for instances whose metadata enables guest
  attributes, so a client can pin the host key from the API;
* kill points for gangway's fault sweep: SIGKILL the client's processes as
  the fake's N-th API request arrives or returns (/_gangway/kill);
* Compute Engine's part of the Cloud Billing Catalog (GET /v1/services/
  6F81-5844-456A/skus): fixed, documented prices per region, for catalog
  refresh tests, with an injectable failure (/_gangway/billing).

Usage:

    python server.py --host 127.0.0.1 --port 0 [--watch-stdin] [--verbose]

Prints exactly one line `READY http://HOST:PORT` on stdout once the server
answers, then serves until SIGTERM or SIGINT, or, with --watch-stdin, until
its standard input reaches end of file. README.md next to this file has the
details.
"""

import argparse
import base64
import copy
import hashlib
import http.server
import json
import logging
import os
import re
import signal
import socketserver
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from datetime import datetime, timezone
from decimal import ROUND_HALF_EVEN, Decimal

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # no __pycache__ next to the sources

import gce_filter  # noqa: E402
import gce_schema  # noqa: E402

# The machine series GCE places with a compact placement policy, from the
# file the GCP provider reads too (one series per line, # comments): a
# COLLOCATED policy on any other series is refused, as GCE refuses it.
COMPACT_SERIES_FILE = os.path.join(HERE, "..", "..", "..", "providers", "gcp",
                                   "compact_placement_series.txt")


def load_compact_series(path=COMPACT_SERIES_FILE):
    with open(path, encoding="utf-8") as f:
        return frozenset(line.strip().lower() for line in f
                         if line.strip() and not line.lstrip().startswith("#"))


COMPACT_SERIES = load_compact_series()


def machine_series(machine_type):
    """A machine type's series: its name up to the first '-'."""
    return machine_type.split("-", 1)[0]

ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
DEFAULT_VENV = os.path.join(ROOT, "target", "gce-venv")
API_PREFIX = "/compute/v1/"
# Links in resources look like the real ones; nothing follows them.
SELF_LINK_BASE = "https://www.googleapis.com/compute/v1/"
USER = "gangway-emulator@example.iam.gserviceaccount.com"

log = logging.getLogger("gangway-gce-emulator")

# ----- the world ---------------------------------------------------------------

REGIONS = {
    "us-central1": ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"],
    "us-east1": ["us-east1-b", "us-east1-c", "us-east1-d"],
    "europe-west4": ["europe-west4-a", "europe-west4-b"],
    "asia-northeast1": ["asia-northeast1-a"],
}
ZONE_REGION = {zone: region for region, zones in REGIONS.items() for zone in zones}

# name -> (description, maximumCardsPerInstance)
ACCELERATOR_TYPES = {
    "nvidia-tesla-a100": ("NVIDIA A100 40GB", 16),
    "nvidia-a100-80gb": ("NVIDIA A100 80GB", 8),
    "nvidia-h100-80gb": ("NVIDIA H100 80GB", 8),
    "nvidia-l4": ("NVIDIA L4", 8),
    "nvidia-tesla-t4": ("NVIDIA T4", 4),
    "nvidia-tesla-v100": ("NVIDIA V100", 8),
    "nvidia-h100-mega-80gb": ("NVIDIA H100 80GB MEGA", 8),
}
A100, A100_80, H100, L4, T4, V100 = ("nvidia-tesla-a100", "nvidia-a100-80gb",
                                     "nvidia-h100-80gb", "nvidia-l4",
                                     "nvidia-tesla-t4", "nvidia-tesla-v100")
H100_MEGA = "nvidia-h100-mega-80gb"
# Which accelerators each zone has: roughly like GCE, small on purpose.
ZONE_ACCELERATORS = {
    "us-central1-a": {A100, A100_80, H100, H100_MEGA, L4, T4, V100},
    "us-central1-b": {A100, H100, L4, T4, V100},
    "us-central1-c": {A100, A100_80, H100, L4, T4, V100},
    "us-central1-f": {A100, T4, V100},
    "us-east1-b": {L4, T4},
    "us-east1-c": {A100, L4, T4, V100},
    "us-east1-d": {H100, L4, T4},
    "europe-west4-a": {A100, A100_80, H100, H100_MEGA, L4, T4, V100},
    "europe-west4-b": {A100, H100, L4, T4, V100},
    "asia-northeast1-a": {A100, T4},
}
# name -> (guestCpus, memoryMb, bundled accelerator or None, its count).
# A machine type with a bundled accelerator exists only in zones that have it.
MACHINE_TYPES = {
    "a2-highgpu-1g": (12, 87040, A100, 1),
    "a2-highgpu-2g": (24, 174080, A100, 2),
    "a2-highgpu-4g": (48, 348160, A100, 4),
    "a2-highgpu-8g": (96, 696320, A100, 8),
    "a2-ultragpu-1g": (12, 174080, A100_80, 1),
    "a2-ultragpu-8g": (96, 1392640, A100_80, 8),
    "a3-highgpu-8g": (208, 1916928, H100, 8),
    "a3-megagpu-8g": (208, 1916928, H100_MEGA, 8),
    "g2-standard-4": (4, 16384, L4, 1),
    "g2-standard-8": (8, 32768, L4, 1),
    "g2-standard-12": (12, 49152, L4, 1),
    "g2-standard-16": (16, 65536, L4, 1),
    "g2-standard-24": (24, 98304, L4, 2),
    "g2-standard-32": (32, 131072, L4, 1),
    "g2-standard-48": (48, 196608, L4, 4),
    "g2-standard-96": (96, 393216, L4, 8),
    "n1-standard-4": (4, 15360, None, 0),
    "n1-standard-8": (8, 30720, None, 0),
    "n1-standard-16": (16, 61440, None, 0),
    "n1-standard-32": (32, 122880, None, 0),
    "n1-standard-64": (64, 245760, None, 0),
    "n2-standard-8": (8, 32768, None, 0),
    "c3-standard-8": (8, 32768, None, 0),
    "e2-standard-2": (2, 8192, None, 0),
}
CPU_PLATFORMS = {"a2": "Intel Cascade Lake", "a3": "Intel Sapphire Rapids",
                 "g2": "Intel Cascade Lake", "n1": "Intel Broadwell", "e2": "Intel Broadwell",
                 "n2": "Intel Cascade Lake", "c3": "Intel Sapphire Rapids"}
# Quota metric per accelerator (regions.get shows limit and usage). The
# H100s have none: compute.v1.json's Quota.metric enum has no NVIDIA_H100_GPUS
# (only PREEMPTIBLE_ and COMMITTED_ ones), so regions.get could not show it.
GPU_QUOTA = {A100: "NVIDIA_A100_GPUS", A100_80: "NVIDIA_A100_80GB_GPUS",
             L4: "NVIDIA_L4_GPUS", T4: "NVIDIA_T4_GPUS", V100: "NVIDIA_V100_GPUS"}

# ----- the Cloud Billing Catalog (prices) ---------------------------------------
#
# GET /v1/services/6F81-5844-456A/skus on the same port answers Compute
# Engine's SKUs for every region above, built from these tables. Prices are
# USD per hour (per vCPU, per GiB of RAM, per GPU) in us-* regions; a region's
# price is the us one times its BILLING_REGION_FACTOR, to 9 decimals
# (Money's nanos). README.md lists the descriptions.

BILLING_SERVICE_ID = "6F81-5844-456A"          # Compute Engine's service id
BILLING_SERVICE = f"services/{BILLING_SERVICE_ID}"
# The geography word of "... running in <Where>" per region.
BILLING_WHERE = {"us-central1": "Americas", "us-east1": "Americas",
                 "europe-west4": "EMEA", "asia-northeast1": "Japan"}
# Regions cost differently, so a parser that mixes them up gets caught.
BILLING_REGION_FACTOR = {"us-central1": 1.0, "us-east1": 1.0,
                         "europe-west4": 1.1, "asia-northeast1": 1.25}
# SKU family (the word in "<F> Instance Core running in ...") ->
# (vCPU, GiB RAM, Spot vCPU, Spot GiB RAM). N1's SKUs say "N1 Predefined".
# Machine families: n1 N1, a2 A2, a3-highgpu A3, a3-megagpu A3Mega, g2 G2,
# c3 C3, n2 N2, e2 E2. Spot is about 40% of on-demand.
INSTANCE_PRICES = {
    "N1": (0.031611, 0.004237, 0.012644, 0.001695),
    "A2": (0.031611, 0.004237, 0.012644, 0.001695),
    "A3Mega": (0.03237, 0.004339, 0.012948, 0.001736),
    "A3": (0.0295, 0.00395, 0.0118, 0.00158),
    "G2": (0.024988, 0.002927, 0.009995, 0.001171),
    "C3": (0.03398, 0.00456, 0.013592, 0.001824),
    "N2": (0.031611, 0.004237, 0.012644, 0.001695),
    "E2": (0.021811, 0.002923, 0.008724, 0.001169),
}
# Accelerator type -> (SKU stem of "<stem> GPU running in ...", on-demand,
# Spot) per GPU hour. Spot is 30-40% of on-demand.
GPU_PRICES = {
    T4: ("Nvidia Tesla T4", 0.35, 0.14),
    V100: ("Nvidia Tesla V100", 2.48, 0.992),
    A100: ("Nvidia Tesla A100", 2.933908, 1.173563),
    A100_80: ("Nvidia A100 80GB", 3.92808, 1.571232),
    L4: ("Nvidia L4", 0.560211, 0.224084),
    H100: ("Nvidia H100 80GB", 9.79655, 2.93897),
    H100_MEGA: ("Nvidia H100 80GB Mega", 10.5, 3.675),
}
# SKUs a price parser must skip, per region: (description with {where},
# resourceFamily, resourceGroup, usageType, usage unit, USD per unit).
BILLING_DISTRACTORS = [
    ("Commitment v1: N1 Predefined Instance Core in {where} for 1 Year",
     "Compute", "CPU", "Commit1Yr", "h", 0.019915),
    ("N1 Custom Instance Core running in {where}", "Compute", "CPU", "OnDemand", "h", 0.033174),
    ("N1 Sole Tenancy Instance Core running in {where}", "Compute", "CPU", "OnDemand", "h", 0.034773),
    ("Licensing Fee for Windows Server 2022 Datacenter Edition (CPU cost)",
     "License", "PremiumImage", "OnDemand", "h", 0.046),
    ("Network Internet Egress from {where} to {where}",     # tiered: from 0, 1 TiB, 10 TiB
     "Network", "PremiumInternetEgress", "OnDemand", "GiBy", [(0, 0.12), (1024, 0.11), (10240, 0.08)]),
    ("Storage PD Capacity", "Storage", "PDStandard", "OnDemand", "GiBy.mo", 0.04),
]
# usageUnit -> (usageUnitDescription, baseUnit, baseUnitDescription,
# baseUnitConversionFactor), as the real catalog has them.
BILLING_UNITS = {
    "h": ("hour", "s", "second", 3600),
    "GiBy.h": ("gibibyte hour", "By.s", "byte second", 3865470566400),
    "GiBy.mo": ("gibibyte month", "By.s", "byte second", 2875910101401600),
    "GiBy": ("gibibyte", "By", "byte", 1073741824),
}
BILLING_EFFECTIVE_TIME = "2026-11-01T07:00:00.000Z"   # fixed: answers stay comparable
BILLING_PAGE_SIZE = 5000                              # the API's default and maximum
BILLING_DISABLED_MESSAGE = (
    "Cloud Billing API has not been used in project gangway-test before or it is disabled. "
    "Enable it by visiting https://console.developers.google.com/apis/api/"
    "cloudbilling.googleapis.com/overview then retry.")
# The Cloud Billing API's query parameters: the method's and the document's
# global ones (cloudbilling.v1.json), `$` forms included.
BILLING_QUERY_PARAMETERS = {
    "currencyCode", "pageSize", "pageToken", "startTime", "endTime",
    "$.xgafv", "access_token", "alt", "callback", "fields", "key", "oauth_token",
    "prettyPrint", "quotaUser", "uploadType", "upload_protocol", "$apiVersion",
}

NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
NAME_REGEX_TEXT = "(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)"
LABEL_KEY_RE = re.compile(r"[a-z\u00c0-\uffff][a-z0-9_\-\u00c0-\uffff]{0,62}")
LABEL_VALUE_RE = re.compile(r"[a-z0-9_\-\u00c0-\uffff]{0,63}")

# HTTP status -> (Google's status name, default reason).
HTTP_STATUS = {
    400: ("INVALID_ARGUMENT", "invalid"),
    401: ("UNAUTHENTICATED", "authError"),
    403: ("PERMISSION_DENIED", "forbidden"),
    404: ("NOT_FOUND", "notFound"),
    409: ("ALREADY_EXISTS", "alreadyExists"),
    412: ("FAILED_PRECONDITION", "conditionNotMet"),
    429: ("RESOURCE_EXHAUSTED", "rateLimitExceeded"),
    500: ("INTERNAL", "backendError"),
    501: ("UNIMPLEMENTED", "notImplemented"),
    503: ("UNAVAILABLE", "backendError"),
    504: ("DEADLINE_EXCEEDED", "deadlineExceeded"),
}
HTTP_REASON_PHRASE = {400: "BAD REQUEST", 403: "FORBIDDEN", 404: "NOT FOUND",
                      409: "CONFLICT", 429: "TOO MANY REQUESTS", 500: "INTERNAL SERVER ERROR",
                      503: "SERVICE UNAVAILABLE"}
# Failed-operation error codes: default message and the operation's
# httpErrorStatusCode. {project}, {zone}, {region} are filled in.
OPERATION_ERRORS = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": (
        "The zone 'projects/{project}/zones/{zone}' does not have enough resources "
        "available to fulfill the request.  Try a different zone, or try again later.", 503),
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": (
        "The zone 'projects/{project}/zones/{zone}' does not have enough resources "
        "available to fulfill the request.  '(resource type:compute)'.", 503),
    "QUOTA_EXCEEDED": ("Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.", 403),
    "RESOURCE_NOT_FOUND": ("The resource was not found.", 404),
    "RESOURCE_OPERATION_RATE_EXCEEDED": (
        "Operation rate exceeded for resource in zone {zone}. Too frequent operations "
        "from the source resource.", 429),
    "INTERNAL_ERROR": ("Internal error. Please try again or contact Google Support.", 500),
    "UNSUPPORTED_OPERATION": ("The requested operation is not supported.", 400),
}

DEFAULT_SETTINGS = {
    # GETs of an operation until it is DONE: 2 means PENDING (the answer to
    # the call), RUNNING (first GET), DONE (second GET). 0: DONE at once.
    "op_polls": 2,
    # An operation is also DONE this many seconds after it was created,
    # polled or not (negative: never by time).
    "op_auto_done_s": 3.0,
    # natIP of new instances that ask for an access config: this prefix plus
    # a free last octet (or the last two, for a two-octet prefix).
    "nat_ip_prefix": "203.0.113.",
    # Longest wait of a metadata wait_for_change request without timeout_sec.
    "metadata_timeout_s": 60.0,
    # Service accounts (emails) that exist and the caller may act as,
    # besides the project's default compute one (NUMBER-compute@...).
    "service_accounts": [],
    # OpenSSH public key lines of the sshd behind the instances' natIPs:
    # what a RUNNING instance's guest agent has written to its guest
    # attributes (namespace hostkeys). /_gangway/host-keys sets one
    # instance's instead.
    "host_keys": [],
}

# The host key types the guest agent writes to guest attributes (one key
# each, the type as the key, the base64 blob as the value).
HOST_KEY_TYPES = ("ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                  "ssh-ed25519", "ssh-rsa")


def parse_host_keys(lines, field="host_keys"):
    """[(type, base64 blob)] of a list of OpenSSH public key lines (`TYPE
    BASE64 [comment]`); ApiError 400 saying which line is wrong and why.
    The blob must decode and name its own type first, as a real key's
    does (RFC 4253 section 6.6)."""
    if not isinstance(lines, list):
        raise ApiError(400, f'"{field}" is a list of OpenSSH public key lines ("ssh-ed25519 AAAA... comment")')
    keys = []
    for line in lines:
        parts = line.split() if isinstance(line, str) else []
        if len(parts) < 2:
            raise ApiError(400, f"{field}: {line!r} is not an OpenSSH public key line `TYPE BASE64 [comment]`")
        key_type, text = parts[0], parts[1]
        if key_type not in HOST_KEY_TYPES:
            raise ApiError(400, f"{field}: {line!r}: unknown key type {key_type!r}; known: "
                                + ", ".join(HOST_KEY_TYPES))
        try:
            blob = base64.b64decode(text, validate=True)
        except ValueError:
            raise ApiError(400, f"{field}: {line!r}: {text!r} is not base64") from None
        size = int.from_bytes(blob[:4], "big") if len(blob) >= 4 else -1
        if blob[4:4 + size] != key_type.encode():
            raise ApiError(400, f"{field}: {line!r}: the blob is not a {key_type} key")
        if any(t == key_type for t, _ in keys):
            raise ApiError(400, f"{field}: two {key_type} keys; the guest agent writes one per type")
        keys.append((key_type, text))
    return keys


class ApiError(Exception):
    """A synchronous Google JSON error."""

    def __init__(self, code, message, reason=None, status=None, problems=None):
        super().__init__(message)
        self.code = code
        self.message = message
        name, default_reason = HTTP_STATUS.get(code, ("UNKNOWN", "unknown"))
        self.reason = reason or default_reason
        self.status = status or name
        # [(location, message)] for schema problems: one errors[] entry each.
        self.problems = problems

    def body(self):
        if self.problems:
            errors = [{"message": msg, "domain": "global", "reason": self.reason,
                       "location": loc, "locationType": "other"}
                      for loc, msg in self.problems]
        else:
            errors = [{"message": self.message, "domain": "global", "reason": self.reason}]
        return {"error": {"code": self.code, "message": self.message,
                          "errors": errors, "status": self.status}}


class OpFailure(Exception):
    """Raised by an operation's work: the operation ends DONE with this error
    and nothing is changed."""

    def __init__(self, code, message, http_status=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.http_status = http_status


def not_found(what):
    return ApiError(404, f"The resource '{what}' was not found")


def invalid(field, value, why):
    return ApiError(400, f"Invalid value for field '{field}': '{value}'. {why}")


def now_text():
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def link(*parts):
    return SELF_LINK_BASE + "/".join(parts)


def short(name_or_url):
    """Last segment of a URL or partial URL; a bare name as it is."""
    return name_or_url.rstrip("/").rsplit("/", 1)[-1]


def fingerprint(*parts):
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return base64.urlsafe_b64encode(digest[:8]).decode()


def hexhash(length, *parts):
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:length]


def project_number(project):
    return str(100000000000 + int(hexhash(12, "project", project), 16) % 900000000000)


def valid_request_id(value):
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return False
    return parsed.int != 0


# ----- Cloud Billing Catalog SKUs ----------------------------------------------------

class RpcError(ApiError):
    """An error of the Cloud Billing API. Newer Google APIs answer
    google.rpc.Status as JSON: `code`, `message`, `status` and typed
    `details`, without the `errors` list of Compute's older format."""

    def __init__(self, code, message, details=None, status=None):
        super().__init__(code, message, status=status)
        self.details = details

    def body(self):
        error = {"code": self.code, "message": self.message, "status": self.status}
        if self.details:
            error["details"] = self.details
        return {"error": error}


def bad_request(field, message):
    """A 400 naming the offending field the way google.rpc.BadRequest does."""
    return RpcError(400, message, [{"@type": "type.googleapis.com/google.rpc.BadRequest",
                                    "fieldViolations": [{"field": field, "description": message}]}])


def billing_disabled_error(message=None):
    """The 403 of a project that has not enabled the Cloud Billing API."""
    url = "https://console.developers.google.com/apis/api/cloudbilling.googleapis.com/overview"
    if message:
        return RpcError(403, message)
    return RpcError(403, BILLING_DISABLED_MESSAGE, [
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "SERVICE_DISABLED",
         "domain": "googleapis.com",
         "metadata": {"service": "cloudbilling.googleapis.com", "serviceTitle": "Cloud Billing API",
                      "consumer": "projects/gangway-test", "containerInfo": "gangway-test",
                      "activationUrl": url}},
        {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US",
         "message": BILLING_DISABLED_MESSAGE},
        {"@type": "type.googleapis.com/google.rpc.Help",
         "links": [{"description": "Google developers console API activation", "url": url}]},
    ])


def region_price(usd, factor):
    """A us price times a region's factor, exactly, to Money's 9 decimals."""
    return (Decimal(repr(usd)) * Decimal(repr(factor))).quantize(Decimal("1e-9"), ROUND_HALF_EVEN)


def money(price):
    """google.type.Money of a Decimal: whole units as an int64 string, and
    nanos (so 2.48 is units "2", nanos 480000000)."""
    total = int(price * 1_000_000_000)
    return {"currencyCode": "USD", "units": str(total // 1_000_000_000), "nanos": total % 1_000_000_000}


def sku_id(region, description):
    digits = hexhash(12, "sku", region, description).upper()
    return f"{digits[:4]}-{digits[4:8]}-{digits[8:]}"


def render_sku(region, description, family, group, usage_type, unit, tiers):
    """One SKU as the catalog answers it; `tiers` are (startUsageAmount, price)."""
    unit_description, base_unit, base_description, conversion = BILLING_UNITS[unit]
    ident = sku_id(region, description)
    return {
        "name": f"{BILLING_SERVICE}/skus/{ident}",
        "skuId": ident,
        "description": description,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": family,
                     "resourceGroup": group, "usageType": usage_type},
        "serviceRegions": [region],
        "pricingInfo": [{
            "effectiveTime": BILLING_EFFECTIVE_TIME,
            "summary": "",
            "pricingExpression": {
                "usageUnit": unit,
                "usageUnitDescription": unit_description,
                "baseUnit": base_unit,
                "baseUnitDescription": base_description,
                "baseUnitConversionFactor": conversion,
                "displayQuantity": 1,
                "tieredRates": [{"startUsageAmount": start, "unitPrice": money(price)}
                                for start, price in tiers],
            },
            "currencyConversionRate": 1,
        }],
        "serviceProviderName": "Google",
        "geoTaxonomy": {"type": "REGIONAL", "regions": [region]},
    }


def region_skus(region, factor):
    """A region's SKUs: instance cores and RAM, GPUs, and the distractors."""
    where = BILLING_WHERE[region]
    out = []

    def add(description, family, group, usage_type, unit, usd):
        # A list of (start, usd) is a tiered price (egress); a number, one tier.
        tiers = usd if isinstance(usd, list) else [(0, usd)]
        out.append(render_sku(region, description, family, group, usage_type, unit,
                              [(start, region_price(price, factor)) for start, price in tiers]))

    for family, (core, ram, spot_core, spot_ram) in INSTANCE_PRICES.items():
        stem = "N1 Predefined" if family == "N1" else family
        core_group, ram_group = ("N1Standard", "N1Standard") if family == "N1" else ("CPU", "RAM")
        add(f"{stem} Instance Core running in {where}", "Compute", core_group, "OnDemand", "h", core)
        add(f"{stem} Instance Ram running in {where}", "Compute", ram_group, "OnDemand", "GiBy.h", ram)
        add(f"Spot Preemptible {stem} Instance Core running in {where}", "Compute", core_group,
            "Preemptible", "h", spot_core)
        add(f"Spot Preemptible {stem} Instance Ram running in {where}", "Compute", ram_group,
            "Preemptible", "GiBy.h", spot_ram)
    for stem, on_demand, spot in GPU_PRICES.values():
        add(f"{stem} GPU running in {where}", "Compute", "GPU", "OnDemand", "h", on_demand)
        add(f"{stem} GPU attached to Spot Preemptible VMs running in {where}", "Compute", "GPU",
            "Preemptible", "h", spot)
    for template, family, group, usage_type, unit, usd in BILLING_DISTRACTORS:
        add(template.format(where=where), family, group, usage_type, unit, usd)
    return out


def billing_skus(factors):
    """The whole catalog, ordered by skuId: the real order looks arbitrary
    too, and this one mixes regions and kinds on every page."""
    skus = []
    for region in sorted(REGIONS):
        skus += region_skus(region, factors[region])
    return sorted(skus, key=lambda sku: sku["skuId"])


def page_token(offset):
    return base64.urlsafe_b64encode(str(offset).encode()).decode()


def page_offset(token):
    """The offset a page token stands for; ValueError if it is none of ours."""
    offset = int(base64.urlsafe_b64decode(token.encode()).decode())
    if offset < 0:
        raise ValueError(token)
    return offset


# ----- fault rules ----------------------------------------------------------------

class FaultRules:
    """Ordered fault rules, matched first to last; thread safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rules = []
        self._fired = []
        self._next_id = 1

    def add(self, spec):
        if not isinstance(spec, dict):
            raise ValueError("a fault rule is a JSON object")
        method = spec.get("method")
        if not isinstance(method, str) or not method:
            raise ValueError('"method" (e.g. "instances.bulkInsert") is required')
        method = method[len("compute."):] if method.startswith("compute.") else method
        contains = spec.get("contains", [])
        if isinstance(contains, str):
            contains = [contains]
        if not isinstance(contains, list) or not all(isinstance(c, str) for c in contains):
            raise ValueError('"contains" is a string or a list of strings')
        times = spec.get("times", 1)
        if not isinstance(times, int) or isinstance(times, bool) or times == 0 or times < -1:
            raise ValueError('"times" is a positive count, or -1 for always')
        for key in ("zone", "region", "project"):
            if spec.get(key) is not None and not isinstance(spec[key], str):
                raise ValueError(f'"{key}" is a string')
        rule = {"id": None, "method": method, "contains": contains, "times": times,
                "remaining": times, "fired": 0, "zone": spec.get("zone"),
                "region": spec.get("region"), "project": spec.get("project")}
        if spec.get("operation_error"):
            code = spec["operation_error"]
            if not isinstance(code, str):
                raise ValueError('"operation_error" is an error code like ZONE_RESOURCE_POOL_EXHAUSTED')
            default_message, default_status = OPERATION_ERRORS.get(code, (code, 400))
            rule.update(kind="operation", code=code,
                        message=spec.get("message") or default_message,
                        http_status=int(spec.get("http_status") or default_status))
        else:
            status = spec.get("http_status", 503)
            if not isinstance(status, int) or not 400 <= status <= 599:
                raise ValueError('"http_status" is an HTTP error status (400-599)')
            name, reason = HTTP_STATUS.get(status, ("UNKNOWN", "unknown"))
            rule.update(kind="http", http_status=status,
                        reason=spec.get("reason") or reason,
                        status=spec.get("status") or name,
                        message=spec.get("message") or f"Injected error ({status}) from gangway's GCE emulator.")
        with self._lock:
            rule["id"] = self._next_id
            self._next_id += 1
            self._rules.append(rule)
            return dict(rule)

    def take(self, method, params, haystack, returns_operation):
        """The first live rule for this call, counted as fired. Rules of kind
        "operation" only match methods that answer an Operation."""
        short_method = method[len("compute."):]
        with self._lock:
            for rule in self._rules:
                if rule["remaining"] == 0 or rule["method"] != short_method:
                    continue
                if rule["kind"] == "operation" and not returns_operation:
                    continue
                if any(rule[k] and params.get(k) != rule[k] for k in ("zone", "region", "project")):
                    continue
                if not all(c in haystack for c in rule["contains"]):
                    continue
                if rule["remaining"] > 0:
                    rule["remaining"] -= 1
                rule["fired"] += 1
                self._fired.append({
                    "rule": rule["id"], "method": short_method, "kind": rule["kind"],
                    "code": rule.get("code") or rule.get("reason"),
                    "http_status": rule["http_status"], "params": dict(params), "time": now_text()})
                return dict(rule)
        return None

    def list(self):
        with self._lock:
            return [dict(rule) for rule in self._rules]

    def fired(self):
        with self._lock:
            return [dict(event) for event in self._fired]

    def clear(self, rule_id=None):
        with self._lock:
            before = len(self._rules)
            if rule_id is None:
                self._rules = []
                self._fired = []
            else:
                self._rules = [r for r in self._rules if r["id"] != rule_id]
            return before - len(self._rules)


# ----- operations and instances ------------------------------------------------------

class Operation:
    """A GCE operation. Its status moves PENDING -> RUNNING -> DONE as it is
    polled (or when its deadline passes); `on_status(status)` lets the work
    it stands for follow (instance statuses), and runs for DONE exactly once."""

    def __init__(self, emu, project, scope, scope_name, op_type, target_link, target_id,
                 request_id=None, on_status=None, failure=None, metadata=None, done=False):
        self.emu = emu
        self.project = project
        self.scope = scope                    # "zones" | "regions" | "global"
        self.scope_name = scope_name
        self.id = emu.new_id()
        millis = int(time.time() * 1000)
        self.name = f"operation-{millis}-{uuid.uuid4().hex[:13]}-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:8]}"
        self.op_type = op_type
        self.target_link = target_link
        self.target_id = target_id
        self.request_id = request_id
        self.on_status = on_status
        self.failure = failure
        self.metadata = metadata
        self.status_message = None
        self.insert_time = now_text()
        self.start_time = None
        self.end_time = None
        self.status = "PENDING"
        self.polls = 0
        self.created = time.monotonic()
        auto = float(emu.settings["op_auto_done_s"])
        self.deadline = self.created + auto if auto >= 0 else None
        if done:
            self.finish()

    @property
    def key(self):
        return (self.project, self.scope, self.scope_name, self.name)

    def _set(self, status):
        if status == self.status:
            return
        self.status = status
        if status in ("RUNNING", "DONE") and self.start_time is None:
            self.start_time = now_text()
        if status == "DONE":
            self.end_time = now_text()
        if self.on_status:
            self.on_status(self, status)

    def poll(self):
        """One GET: a step towards DONE."""
        if self.status == "DONE":
            return
        self.polls += 1
        if self.polls >= int(self.emu.settings["op_polls"]):
            self.finish()
        else:
            self._set("RUNNING")

    def finish(self):
        if self.status != "DONE":
            self._set("DONE")

    def render(self):
        scope_link = link("projects", self.project) if self.scope == "global" else \
            link("projects", self.project, self.scope, self.scope_name)
        op = {
            "kind": "compute#operation",
            "id": self.id,
            "name": self.name,
            "operationType": self.op_type,
            "targetLink": self.target_link,
            "status": self.status,
            "user": USER,
            "progress": {"PENDING": 0, "RUNNING": 50, "DONE": 100}[self.status],
            "insertTime": self.insert_time,
            "creationTimestamp": self.insert_time,
            "selfLink": f"{scope_link}/operations/{self.name}" if self.scope != "global"
            else link("projects", self.project, "global", "operations", self.name),
        }
        if self.target_id:
            op["targetId"] = self.target_id
        if self.scope == "zones":
            op["zone"] = scope_link
        elif self.scope == "regions":
            op["region"] = scope_link
        if self.request_id:
            op["clientOperationId"] = self.request_id
        if self.status_message:
            op["statusMessage"] = self.status_message
        if self.start_time:
            op["startTime"] = self.start_time
        if self.status == "DONE":
            op["endTime"] = self.end_time
            if self.failure:
                status = self.failure.http_status or OPERATION_ERRORS.get(
                    self.failure.code, ("", 400))[1]
                op["error"] = {"errors": [{"code": self.failure.code,
                                           "message": self.failure.message}]}
                op["httpErrorStatusCode"] = status
                op["httpErrorMessage"] = HTTP_REASON_PHRASE.get(status, "ERROR")
        if self.metadata:
            op.update(self.metadata(self) if callable(self.metadata) else self.metadata)
        return op


class Instance:
    """An instance: its resource JSON (`body`) less what changes with time."""

    def __init__(self, project, zone, name, body, machine_type, placement=None):
        self.project = project
        self.zone = zone
        self.name = name
        self.body = body
        self.machine_type = machine_type
        self.status = "PROVISIONING"
        self.transition = None      # the operation whose progress drives status
        self.placement = placement  # (policy key, position) for COLLOCATED policies
        self.deleted = False
        self.preempted = False
        self.host_keys = None       # its own host key lines; None: the host_keys setting

    @property
    def key(self):
        return (self.project, self.zone, self.name)

    @property
    def spot(self):
        scheduling = self.body.get("scheduling", {})
        return scheduling.get("provisioningModel") == "SPOT" or scheduling.get("preemptible")

    def set_status(self, status):
        if status == self.status:
            return
        self.status = status
        if status == "RUNNING":
            self.body["lastStartTimestamp"] = now_text()
        elif status == "TERMINATED":
            self.body["lastStopTimestamp"] = now_text()

    def render(self):
        out = copy.deepcopy(self.body)
        out["status"] = self.status
        if self.status == "RUNNING" and self.placement:
            (project, region, policy), position = self.placement
            # All of a policy's VMs in one cluster; blocks of 8; sub-blocks
            # (and so /BLOCK/SUBBLOCK/ prefixes) shared by consecutive pairs.
            block = hexhash(13, "block", project, region, policy, position // 8)
            subblock = hexhash(12, "subblock", project, region, policy, position // 2)
            host = hexhash(8, "host", project, self.zone, self.name, position)
            out["resourceStatus"] = {
                "physicalHost": f"/{block}/{subblock}/{host}",
                "physicalHostTopology": {
                    "cluster": f"{self.zone}-cluster-{hexhash(6, 'cluster', self.zone)}",
                    "block": block, "subblock": subblock, "host": host},
            }
        return out


# ----- the emulator ---------------------------------------------------------------

class Emulator:
    def __init__(self, schema, settings=None):
        self.schema = schema
        self.lock = threading.RLock()
        # Metadata long polls wait on this; every state change notifies it.
        self.changed = threading.Condition(self.lock)
        self.settings = dict(DEFAULT_SETTINGS)
        self.settings.update(settings or {})
        self.faults = FaultRules()
        self.metadata_servers = {}
        self.handlers = self._handlers()
        self.reset()

    def reset(self):
        with self.lock:
            self.instances = {}        # (project, zone, name) -> Instance
            self.gone = {}             # deleted instances, for the metadata server
            self.operations = {}       # (project, scope, scope name, op name) -> Operation
            self.request_ids = {}      # (project, requestId) -> Operation
            self.firewalls = {}        # (project, name) -> dict
            self.policies = {}         # (project, region, name) -> dict
            self.policy_positions = {}  # policy key -> next position
            self.capacity = {}         # (zone, machine type) -> VMs that may exist
            self.timers = []           # (monotonic deadline, callable)
            self.nat_ips = set()
            self.internal_ips = 0
            self._id = 5000000000000000000
            self.default_metadata_instance = None
            # The fake Cloud Billing Catalog: an injected failure (HTTP
            # status, message, calls left: -1 forever), price factors, and
            # how many SKU lists were asked for (a test can see caching).
            self.billing = {"fail": None, "message": None, "times": -1,
                            "region_factor": dict(BILLING_REGION_FACTOR), "calls": 0}
            self.faults.clear()
            self.changed.notify_all()
        for server in list(self.metadata_servers.values()):
            server.shutdown()
            server.server_close()
        self.metadata_servers = {}

    def new_id(self):
        with self.lock:
            self._id += 1
            return str(self._id)

    # ----- time --------------------------------------------------------------

    def tick(self):
        """Finish operations past their deadline and run due timers."""
        with self.lock:
            now = time.monotonic()
            for op in list(self.operations.values()):
                if op.status != "DONE" and op.deadline is not None and now >= op.deadline:
                    op.finish()
            due = [t for t in self.timers if t[0] <= now]
            self.timers = [t for t in self.timers if t[0] > now]
            for _, action in due:
                action()
            if due:
                self.changed.notify_all()

    # ----- lookups -----------------------------------------------------------

    def require_zone(self, project, zone):
        if zone not in ZONE_REGION:
            raise not_found(f"projects/{project}/zones/{zone}")
        return ZONE_REGION[zone]

    def require_region(self, project, region):
        if region not in REGIONS:
            raise not_found(f"projects/{project}/regions/{region}")

    def get_instance(self, project, zone, name):
        inst = self.instances.get((project, zone, name))
        if inst is None:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return inst

    def find_instance(self, name, zone=None, project=None, include_gone=False):
        """An instance by name (zone and project narrow it down)."""
        pools = [self.instances] + ([self.gone] if include_gone else [])
        for pool in pools:
            found = [i for (p, z, n), i in pool.items()
                     if n == name and zone in (None, z) and project in (None, p)]
            if len(found) > 1:
                raise ApiError(400, f"instance name {name!r} is ambiguous: give zone and project")
            if found:
                return found[0]
        return None

    # ----- operations ----------------------------------------------------------

    def start_operation(self, ctx, scope, scope_name, op_type, target_link, work,
                        target_id=None, metadata=None):
        """The common path of every method that answers an Operation.

        A repeated requestId answers the first call's operation (whatever it
        was) and does nothing. Else an "operation" fault makes a failed
        operation, and otherwise `work(op)` runs: it may raise ApiError
        (answered as is, nothing remembered), raise OpFailure (a failed
        operation, nothing changed) or set the operation's on_status."""
        project = ctx.params["project"]
        request_id = ctx.query.get("requestId")
        if request_id is not None:
            if not valid_request_id(request_id):
                raise invalid("requestId", request_id,
                              "The request ID must be a valid UUID other than the zero UUID.")
            earlier = self.request_ids.get((project, request_id))
            if earlier is not None:
                return earlier.render()
        op = Operation(self, project, scope, scope_name, op_type, target_link, target_id,
                       request_id=request_id, metadata=metadata, done=False)
        # Operations start PENDING: `work` sets up what follows the status.
        failure = None
        if ctx.fault is not None:
            failure = OpFailure(ctx.fault["code"], self._fill(ctx.fault["message"], ctx.params),
                                ctx.fault["http_status"])
        else:
            try:
                work(op)
            except OpFailure as err:
                failure = err
        if failure is not None:
            op.failure = failure
            op.on_status = None
        self.operations[op.key] = op
        if request_id is not None:
            self.request_ids[(project, request_id)] = op
        if int(self.settings["op_polls"]) <= 0:
            op.finish()
        self.changed.notify_all()
        return op.render()

    @staticmethod
    def _fill(message, params):
        values = dict(params)
        if "zone" in values and "region" not in values:
            values["region"] = ZONE_REGION.get(values["zone"], "")
        return re.sub(r"\{(project|zone|region)\}", lambda m: values.get(m.group(1), m.group(0)), message)

    def find_operation(self, project, scope, scope_name, name):
        op = self.operations.get((project, scope, scope_name, name))
        if op is None:
            where = f"projects/{project}/global" if scope == "global" else \
                f"projects/{project}/{scope}/{scope_name}"
            raise not_found(f"{where}/operations/{name}")
        return op

    # ----- addresses ------------------------------------------------------------

    def allocate_nat_ip(self):
        prefix = self.settings["nat_ip_prefix"]
        free_octets = 4 - prefix.rstrip(".").count(".") - 1
        if not prefix.endswith(".") or free_octets not in (1, 2):
            raise ApiError(500, f"nat_ip_prefix {prefix!r} must end with '.' and leave one or two octets")
        limit = 254 if free_octets == 1 else 254 * 254
        for n in range(limit):
            suffix = str(n + 1) if free_octets == 1 else f"{n // 254 + 1}.{n % 254 + 1}"
            address = prefix + suffix
            if address not in self.nat_ips:
                self.nat_ips.add(address)
                return address
        raise OpFailure("IP_SPACE_EXHAUSTED", f"No free address left under {prefix}", 503)

    def allocate_internal_ip(self, region):
        self.internal_ips += 1
        n = self.internal_ips
        return f"10.{128 + sorted(REGIONS).index(region)}.{n // 250}.{n % 250 + 2}"

    # ----- instance building ------------------------------------------------------

    def machine_type_in(self, project, zone, name, field):
        if name not in MACHINE_TYPES:
            raise invalid(field, name, f"Machine type with name '{name}' does not exist in zone '{zone}'.")
        accelerator = MACHINE_TYPES[name][2]
        if accelerator and accelerator not in ZONE_ACCELERATORS[zone]:
            raise invalid(field, name, f"Machine type with name '{name}' does not exist in zone '{zone}'.")
        return name

    def build_instance(self, project, zone, name, props, field):
        """The resource JSON of a new instance from Instance or
        InstanceProperties fields, checked the way GCE checks them.
        `field` is the request field that holds the properties (for errors)."""
        region = ZONE_REGION[zone]
        body = copy.deepcopy(props)
        for output_only in ("id", "kind", "selfLink", "status", "statusMessage", "zone",
                            "creationTimestamp", "cpuPlatform", "resourceStatus",
                            "lastStartTimestamp", "lastStopTimestamp", "lastSuspendedTimestamp",
                            "startRestricted", "satisfiesPzi", "satisfiesPzs", "fingerprint",
                            "labelFingerprint"):
            body.pop(output_only, None)
        if "resourceManagerTags" in body:   # InstanceProperties puts them at the top
            body.setdefault("params", {})["resourceManagerTags"] = body.pop("resourceManagerTags")

        machine_type = self._machine_type_name(zone, body.get("machineType"), field)
        cpus, memory, bundled, bundled_count = MACHINE_TYPES[machine_type]

        labels = body.get("labels") or {}
        for key, value in labels.items():
            if not LABEL_KEY_RE.fullmatch(key):
                raise invalid(f"{field}.labels", "", f"Label key '{key}' violates format constraints. "
                              "The key must start with a lowercase character, can only contain lowercase "
                              "letters, numeric characters, underscores and dashes. The key can be at most "
                              "63 characters long. International characters are allowed.")
            if not LABEL_VALUE_RE.fullmatch(value):
                raise invalid(f"{field}.labels", "", f"Label value '{value}' violates format constraints. "
                              "The value can only contain lowercase letters, numeric characters, underscores "
                              "and dashes. The value can be at most 63 characters long. International "
                              "characters are allowed.")

        accelerators = []
        for i, acc in enumerate(body.get("guestAccelerators") or []):
            acc_name = short(acc.get("acceleratorType", ""))
            where = f"{field}.guestAccelerators[{i}].acceleratorType"
            if acc_name not in ZONE_ACCELERATORS[zone]:
                raise invalid(where, acc.get("acceleratorType", ""),
                              f"Accelerator type '{acc_name}' does not exist in zone '{zone}'.")
            count = acc.get("acceleratorCount", 1)
            if not 1 <= count <= ACCELERATOR_TYPES[acc_name][1]:
                raise invalid(f"{field}.guestAccelerators[{i}].acceleratorCount", count,
                              "Accelerator count is out of range for this accelerator type.")
            accelerators.append((acc_name, count))
        if bundled:
            if accelerators and accelerators != [(bundled, bundled_count)]:
                raise invalid(f"{field}.guestAccelerators", "", f"Machine type '{machine_type}' comes with "
                              f"{bundled_count} x {bundled}; other accelerators cannot be attached.")
            accelerators = [(bundled, bundled_count)]
        elif accelerators and not machine_type.startswith("n1-"):
            raise invalid(f"{field}.guestAccelerators", "",
                          f"Accelerators cannot be attached to machine type '{machine_type}'.")
        if accelerators:
            body["guestAccelerators"] = [
                {"acceleratorType": link("projects", project, "zones", zone, "acceleratorTypes", a),
                 "acceleratorCount": n} for a, n in accelerators]

        scheduling = dict(body.get("scheduling") or {})
        spot = scheduling.get("provisioningModel") == "SPOT" or scheduling.get("preemptible")
        if spot and scheduling.get("automaticRestart") is True:
            raise invalid(f"{field}.scheduling.automaticRestart", "true",
                          "Preemptible and Spot instances cannot be automatically restarted.")
        if accelerators and scheduling.get("onHostMaintenance") == "MIGRATE":
            raise invalid(f"{field}.scheduling.onHostMaintenance", "MIGRATE",
                          "Instances with guest accelerators do not support live migration.")
        accounts = body.get("serviceAccounts") or []
        if len(accounts) > 1:
            raise invalid(f"{field}.serviceAccounts", "",
                          "At most one service account can be attached to an instance.")
        for i, account in enumerate(accounts):
            default = f"{project_number(project)}-compute@developer.gserviceaccount.com"
            email = account.get("email") or "default"
            if email == "default":
                account["email"] = default
            elif email != default and email not in self.settings["service_accounts"]:
                # What GCE answers for an account that does not exist or
                # that the caller may not act as (it does not say which).
                raise invalid(f"{field}.serviceAccounts[{i}].email", email,
                              f"The user does not have access to service account '{email}'.  "
                              f"User: 'gangway-test@{project}.iam.gserviceaccount.com'.  Ask a project "
                              "owner to grant you the iam.serviceAccountUser role on the service account")
            account.setdefault("scopes", [])
        scheduling.setdefault("provisioningModel", "STANDARD")
        scheduling.setdefault("automaticRestart", not spot)
        scheduling.setdefault("onHostMaintenance", "TERMINATE" if spot or accelerators else "MIGRATE")
        scheduling.setdefault("preemptible", bool(spot))
        if spot:
            scheduling.setdefault("instanceTerminationAction", "STOP")
        body["scheduling"] = scheduling

        disks = body.get("disks") or []
        if not disks:
            raise invalid(f"{field}.disks", "", "At least one disk, the boot disk, must be given.")
        out_disks = []
        for i, disk in enumerate(disks):
            init = disk.get("initializeParams") or {}
            disk_name = init.get("diskName") or (name if i == 0 else f"{name}-{i}")
            out = {k: v for k, v in disk.items() if k not in ("initializeParams", "diskEncryptionKey")}
            out.update({
                "kind": "compute#attachedDisk",
                "type": disk.get("type", "PERSISTENT"),
                "mode": disk.get("mode", "READ_WRITE"),
                "source": disk.get("source") or link("projects", project, "zones", zone, "disks", disk_name),
                "deviceName": disk.get("deviceName") or f"persistent-disk-{i}",
                "index": i,
                "boot": bool(disk.get("boot", i == 0)),
                "autoDelete": bool(disk.get("autoDelete", bool(init))),
                "interface": disk.get("interface", "SCSI"),
                "diskSizeGb": init.get("diskSizeGb") or disk.get("diskSizeGb") or "10",
            })
            out_disks.append(out)
        body["disks"] = out_disks

        policies, placement_policy = [], None
        for i, ref in enumerate(body.get("resourcePolicies") or []):
            policy_name = short(ref)
            key = (project, region, policy_name)
            policy = self.policies.get(key)
            if policy is None:
                raise not_found(f"projects/{project}/regions/{region}/resourcePolicies/{policy_name}")
            policies.append(link("projects", project, "regions", region, "resourcePolicies", policy_name))
            if (policy.get("groupPlacementPolicy") or {}).get("collocation") == "COLLOCATED":
                if machine_series(machine_type) not in COMPACT_SERIES:
                    # GCE's words as reported for an N1 gang (dstack issue
                    # 2591), in the shape of its invalid-usage errors.
                    raise ApiError(400, "Invalid resource usage: 'Placement policy is not "
                                        f"applicable to machine type {machine_type}.'")
                placement_policy = key
        if policies:
            body["resourcePolicies"] = policies

        # Addresses last: nothing below can fail after they are taken.
        nics = body.get("networkInterfaces") or [{}]
        out_nics = []
        for i, nic in enumerate(nics):
            network = short(nic.get("network") or "default")
            subnetwork = short(nic.get("subnetwork") or network)
            out = dict(nic)
            out.update({
                "kind": "compute#networkInterface",
                "name": f"nic{i}",
                "network": link("projects", project, "global", "networks", network),
                "subnetwork": link("projects", project, "regions", region, "subnetworks", subnetwork),
                "networkIP": nic.get("networkIP") or self.allocate_internal_ip(region),
                "stackType": nic.get("stackType", "IPV4_ONLY"),
                "fingerprint": fingerprint("nic", project, zone, name, i),
            })
            configs = []
            for config in nic.get("accessConfigs") or []:
                if config.get("natIP"):
                    nat_ip = config["natIP"]
                    self.nat_ips.add(nat_ip)
                else:
                    try:
                        nat_ip = self.allocate_nat_ip()
                    except OpFailure:
                        self.release_ips({"networkInterfaces": out_nics + [{"accessConfigs": configs}]})
                        raise
                configs.append(dict(config, kind="compute#accessConfig",
                                    type=config.get("type", "ONE_TO_ONE_NAT"),
                                    name=config.get("name", "External NAT"),
                                    natIP=nat_ip, networkTier=config.get("networkTier", "PREMIUM")))
            if configs:
                out["accessConfigs"] = configs
            out_nics.append(out)
        body["networkInterfaces"] = out_nics

        metadata = body.get("metadata") or {}
        body["metadata"] = {"kind": "compute#metadata",
                            "fingerprint": fingerprint("metadata", project, zone, name),
                            "items": metadata.get("items", [])}
        if not body["metadata"]["items"]:
            del body["metadata"]["items"]
        if "tags" in body:
            body["tags"] = {"items": (body["tags"] or {}).get("items", []),
                            "fingerprint": fingerprint("tags", project, zone, name)}

        instance_id = self.new_id()
        body.update({
            "kind": "compute#instance",
            "id": instance_id,
            "creationTimestamp": now_text(),
            "name": name,
            "zone": link("projects", project, "zones", zone),
            "machineType": link("projects", project, "zones", zone, "machineTypes", machine_type),
            "cpuPlatform": CPU_PLATFORMS.get(machine_type.split("-")[0], "Intel Broadwell"),
            "selfLink": link("projects", project, "zones", zone, "instances", name),
            "labels": labels,
            "labelFingerprint": fingerprint("labels", sorted(labels.items())),
            "fingerprint": fingerprint("instance", project, zone, name, instance_id),
            "canIpForward": bool(body.get("canIpForward", False)),
            "deletionProtection": bool(body.get("deletionProtection", False)),
            "startRestricted": False,
        })
        if not labels:
            del body["labels"]
        return body, machine_type, placement_policy

    def _machine_type_name(self, zone, value, field):
        """The machine type's name from a request (bare name for
        bulkInsert's instanceProperties, URL for insert)."""
        if not value:
            raise invalid(f"{field}.machineType", "", "The machine type must be specified.")
        if field == "resource":
            match = re.fullmatch(r"(?:(?:https://www\.googleapis\.com/compute/v1/)?projects/[^/]+/)?"
                                 r"zones/([^/]+)/machineTypes/([^/]+)", value)
            if not match:
                raise invalid("resource.machineType", value,
                              "Must be a URL to a valid Compute resource of the correct type.")
            if match.group(1) != zone:
                raise invalid("resource.machineType", value,
                              f"Machine type zone '{match.group(1)}' does not match instance zone '{zone}'.")
            return self.machine_type_in(None, zone, match.group(2), "resource.machineType")
        if "/" in value:
            # The API documents that a URL here ends in INTERNAL_ERROR.
            raise OpFailure("INTERNAL_ERROR", "Internal error. instanceProperties.machineType takes a "
                            f"machine type name, not a URL: {value}", 500)
        return self.machine_type_in(None, zone, value, f"{field}.machineType")

    def capacity_left(self, zone, machine_type):
        limit = self.capacity.get((zone, machine_type))
        if limit is None:
            return None
        used = sum(1 for i in self.instances.values()
                   if i.zone == zone and i.machine_type == machine_type and i.status != "TERMINATED")
        return max(0, limit - used)

    def add_instance(self, project, zone, name, body, machine_type, placement_policy, op):
        placement = None
        if placement_policy:
            position = self.policy_positions.get(placement_policy, 0)
            self.policy_positions[placement_policy] = position + 1
            placement = (placement_policy, position)
        inst = Instance(project, zone, name, body, machine_type, placement)
        inst.transition = op
        self.instances[inst.key] = inst
        self.gone.pop(inst.key, None)
        return inst

    def follow(self, instances, statuses, after_done=None):
        """An on_status callback: instances take statuses[op status] while
        this operation is the one driving them; after_done runs at DONE."""
        def on_status(op, status):
            for inst in instances:
                if inst.transition is not op:
                    continue
                if status in statuses:
                    inst.set_status(statuses[status])
                if status == "DONE":
                    inst.transition = None
                    if after_done:
                        after_done(inst)
            self.changed.notify_all()
        return on_status

    def release_ips(self, body):
        for nic in body.get("networkInterfaces", []):
            for config in nic.get("accessConfigs", []):
                self.nat_ips.discard(config.get("natIP"))

    def remove_instance(self, inst):
        if self.instances.get(inst.key) is inst:
            del self.instances[inst.key]
        inst.deleted = True
        self.gone[inst.key] = inst
        self.release_ips(inst.body)
        self.changed.notify_all()

    # ----- handlers: instances ------------------------------------------------------

    def _handlers(self):
        return {
            "compute.instances.insert": self.instances_insert,
            "compute.instances.bulkInsert": self.instances_bulk_insert,
            "compute.instances.get": self.instances_get,
            "compute.instances.list": self.instances_list,
            "compute.instances.aggregatedList": self.instances_aggregated_list,
            "compute.instances.delete": self.instances_delete,
            "compute.instances.stop": self.instances_stop,
            "compute.instances.start": self.instances_start,
            "compute.instances.getGuestAttributes": self.instances_get_guest_attributes,
            "compute.zoneOperations.get": self.operations_get,
            "compute.zoneOperations.wait": self.operations_wait,
            "compute.zoneOperations.list": self.operations_list,
            "compute.zoneOperations.delete": self.operations_delete,
            "compute.regionOperations.get": self.operations_get,
            "compute.regionOperations.wait": self.operations_wait,
            "compute.regionOperations.list": self.operations_list,
            "compute.regionOperations.delete": self.operations_delete,
            "compute.globalOperations.get": self.operations_get,
            "compute.globalOperations.wait": self.operations_wait,
            "compute.globalOperations.list": self.operations_list,
            "compute.globalOperations.delete": self.operations_delete,
            "compute.machineTypes.get": self.machine_types_get,
            "compute.machineTypes.list": self.machine_types_list,
            "compute.machineTypes.aggregatedList": self.machine_types_aggregated_list,
            "compute.acceleratorTypes.get": self.accelerator_types_get,
            "compute.acceleratorTypes.list": self.accelerator_types_list,
            "compute.acceleratorTypes.aggregatedList": self.accelerator_types_aggregated_list,
            "compute.zones.get": self.zones_get,
            "compute.zones.list": self.zones_list,
            "compute.regions.get": self.regions_get,
            "compute.regions.list": self.regions_list,
            "compute.projects.get": self.projects_get,
            "compute.resourcePolicies.insert": self.policies_insert,
            "compute.resourcePolicies.get": self.policies_get,
            "compute.resourcePolicies.list": self.policies_list,
            "compute.resourcePolicies.aggregatedList": self.policies_aggregated_list,
            "compute.resourcePolicies.delete": self.policies_delete,
            "compute.firewalls.insert": self.firewalls_insert,
            "compute.firewalls.get": self.firewalls_get,
            "compute.firewalls.list": self.firewalls_list,
            "compute.firewalls.delete": self.firewalls_delete,
        }

    INSERT_STATUSES = {"PENDING": "PROVISIONING", "RUNNING": "STAGING", "DONE": "RUNNING"}

    def instances_insert(self, ctx):
        project, zone = ctx.params["project"], ctx.params["zone"]
        self.require_zone(project, zone)
        body = ctx.body
        name = body["name"]
        if ctx.query.get("sourceInstanceTemplate") or ctx.query.get("sourceMachineImage"):
            source = ctx.query.get("sourceInstanceTemplate") or ctx.query.get("sourceMachineImage")
            raise not_found(source)   # no templates or machine images here

        def work(op):
            if (project, zone, name) in self.instances:
                raise ApiError(409, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                                    "already exists")
            machine_type = self._machine_type_name(zone, body.get("machineType"), "resource")
            left = self.capacity_left(zone, machine_type)
            if left is not None and left < 1:
                raise OpFailure("ZONE_RESOURCE_POOL_EXHAUSTED",
                                self._fill(OPERATION_ERRORS["ZONE_RESOURCE_POOL_EXHAUSTED"][0], ctx.params))
            built, machine_type, placement = self.build_instance(project, zone, name, body, "resource")
            inst = self.add_instance(project, zone, name, built, machine_type, placement, op)
            op.target_id = built["id"]
            op.on_status = self.follow([inst], self.INSERT_STATUSES)

        return self.start_operation(ctx, "zones", zone, "insert",
                                    link("projects", project, "zones", zone, "instances", name), work)

    def instances_bulk_insert(self, ctx):
        project, zone = ctx.params["project"], ctx.params["zone"]
        self.require_zone(project, zone)
        body = ctx.body
        if body.get("sourceInstanceTemplate"):
            raise not_found(body["sourceInstanceTemplate"])   # no templates here
        props = body.get("instanceProperties")
        if not props:
            raise invalid("resource.instanceProperties", "",
                          "Either instanceProperties or sourceInstanceTemplate must be given.")
        per_instance = body.get("perInstanceProperties") or {}
        pattern = body.get("namePattern")
        count = int(body["count"]) if body.get("count") is not None else len(per_instance)
        min_count = int(body["minCount"]) if body.get("minCount") is not None else count
        if count < 1:
            raise invalid("resource.count", count, "Must be at least 1.")
        if not 1 <= min_count <= count:
            raise invalid("resource.minCount", min_count, "Must be between 1 and count.")
        if len(per_instance) > count:
            raise invalid("resource.perInstanceProperties", "",
                          "More perInstanceProperties entries than count.")
        if pattern is not None:
            runs = re.findall(r"#+", pattern)
            if len(runs) != 1 or len(runs[0]) > 18:
                raise invalid("resource.namePattern", pattern,
                              "The pattern must contain one continuous sequence of up to 18 '#' characters.")
        elif len(per_instance) < count:
            raise invalid("resource.namePattern", "",
                          "Either namePattern or perInstanceProperties for every instance must be given.")
        for instance_name in per_instance:
            if not NAME_RE.fullmatch(instance_name):
                raise invalid(f"resource.perInstanceProperties.{instance_name}", instance_name,
                              f"Must be a match of regex '{NAME_REGEX_TEXT}'")

        def work(op):
            names = list(per_instance)
            for instance_name in names:
                if (project, zone, instance_name) in self.instances:
                    raise ApiError(409, f"The resource 'projects/{project}/zones/{zone}/instances/"
                                        f"{instance_name}' already exists")
            if len(names) < count:
                names += self._pattern_names(project, zone, pattern, count - len(names), set(names))
            # Capacity first (all or, with minCount, as many as fit), then
            # build: building takes addresses.
            field = "resource.instanceProperties"
            machine_type = self._machine_type_name(zone, props.get("machineType"), field)
            left = self.capacity_left(zone, machine_type)
            if left is not None and left < count:
                if left < min_count:
                    raise OpFailure("ZONE_RESOURCE_POOL_EXHAUSTED",
                                    self._fill(OPERATION_ERRORS["ZONE_RESOURCE_POOL_EXHAUSTED"][0],
                                               ctx.params))
                names = names[:left]   # names given per instance come first
            built = []
            try:
                for instance_name in names:
                    props_for = copy.deepcopy(props)
                    hostname = (per_instance.get(instance_name) or {}).get("hostname")
                    if hostname:
                        props_for["hostname"] = hostname
                    built.append(self.build_instance(project, zone, instance_name, props_for, field))
            except (ApiError, OpFailure):
                for body_built, _, _ in built:
                    self.release_ips(body_built)
                raise
            created = [self.add_instance(project, zone, n, b, mt, pp, op)
                       for n, (b, mt, pp) in zip(names, built)]
            op.on_status = self.follow(created, self.INSERT_STATUSES)

            def metadata(op_now):
                state = {"PENDING": "CREATING", "RUNNING": "CREATING", "DONE": "DONE"}[op_now.status]
                created_count = len(created) if op_now.status == "DONE" else 0
                return {"instancesBulkInsertOperationMetadata": {"perLocationStatus": {
                    f"zones/{zone}": {"status": state, "targetVmCount": count,
                                      "createdVmCount": created_count,
                                      "failedToCreateVmCount": 0, "deletedVmCount": 0}}}}
            op.metadata = metadata

        return self.start_operation(ctx, "zones", zone, "bulkInsert",
                                    link("projects", project, "zones", zone, "instances"), work)

    def _pattern_names(self, project, zone, pattern, wanted, taken):
        """Names from a namePattern: numbers after the largest one in use."""
        run = re.search(r"#+", pattern)
        width = len(run.group(0))
        prefix, suffix = pattern[:run.start()], pattern[run.end():]
        matcher = re.compile(re.escape(prefix) + r"(\d{%d,})" % width + re.escape(suffix))
        biggest = 0
        for (p, z, n) in self.instances:
            match = matcher.fullmatch(n) if (p, z) == (project, zone) else None
            if match:
                biggest = max(biggest, int(match.group(1)))
        names, number = [], biggest
        while len(names) < wanted:
            number += 1
            candidate = f"{prefix}{number:0{width}d}{suffix}"
            if candidate not in taken:
                if not NAME_RE.fullmatch(candidate):
                    raise invalid("resource.namePattern", pattern,
                                  f"Generated name '{candidate}' must be a match of regex '{NAME_REGEX_TEXT}'")
                names.append(candidate)
        return names

    def instances_get(self, ctx):
        p = ctx.params
        self.require_zone(p["project"], p["zone"])
        return self.get_instance(p["project"], p["zone"], p["instance"]).render()

    def instances_list(self, ctx):
        p = ctx.params
        self.require_zone(p["project"], p["zone"])
        items = [i.render() for (proj, zone, _), i in self.instances.items()
                 if proj == p["project"] and zone == p["zone"]]
        return self.list_response(ctx, "compute#instanceList", "Instance", items,
                                  link("projects", p["project"], "zones", p["zone"], "instances"),
                                  f"projects/{p['project']}/zones/{p['zone']}/instances")

    def instances_aggregated_list(self, ctx):
        project = ctx.params["project"]
        return self.aggregated_response(
            ctx, "compute#instanceAggregatedList", "Instance", "instances",
            lambda zone: [i.render() for (p, z, _), i in self.instances.items() if (p, z) == (project, zone)],
            "instances")

    def instances_delete(self, ctx):
        p = ctx.params
        self.require_zone(p["project"], p["zone"])
        inst = self.get_instance(p["project"], p["zone"], p["instance"])

        def work(op):
            if inst.body.get("deletionProtection"):
                raise ApiError(400, "Invalid resource usage: 'Resource cannot be deleted if it's "
                                    "protected against deletion.'.", reason="resourceInUseByAnotherResource")
            inst.transition = op
            if inst.status != "TERMINATED":
                inst.set_status("STOPPING")
            op.on_status = self.follow([inst], {}, after_done=self.remove_instance)

        return self.start_operation(ctx, "zones", p["zone"], "delete", inst.body["selfLink"], work,
                                    target_id=inst.body["id"])

    def instances_stop(self, ctx):
        p = ctx.params
        self.require_zone(p["project"], p["zone"])
        inst = self.get_instance(p["project"], p["zone"], p["instance"])

        def work(op):
            if inst.status == "TERMINATED":
                return   # stopping a stopped instance succeeds and changes nothing
            inst.transition = op
            inst.set_status("STOPPING")
            op.on_status = self.follow([inst], {"DONE": "TERMINATED"})

        return self.start_operation(ctx, "zones", p["zone"], "stop", inst.body["selfLink"], work,
                                    target_id=inst.body["id"])

    def instances_start(self, ctx):
        p = ctx.params
        self.require_zone(p["project"], p["zone"])
        inst = self.get_instance(p["project"], p["zone"], p["instance"])

        def work(op):
            if inst.status != "TERMINATED":
                return   # starting a running instance succeeds and changes nothing
            left = self.capacity_left(p["zone"], inst.machine_type)
            if left is not None and left < 1:
                raise OpFailure("ZONE_RESOURCE_POOL_EXHAUSTED",
                                self._fill(OPERATION_ERRORS["ZONE_RESOURCE_POOL_EXHAUSTED"][0], p))
            inst.transition = op
            inst.preempted = False
            inst.set_status("PROVISIONING")
            op.on_status = self.follow([inst], self.INSERT_STATUSES)

        return self.start_operation(ctx, "zones", p["zone"], "start", inst.body["selfLink"], work,
                                    target_id=inst.body["id"])

    def guest_attributes_enabled(self, inst):
        """Whether the instance's metadata has enable-guest-attributes TRUE
        (the fake has no project-wide metadata to inherit it from)."""
        items = inst.body.get("metadata", {}).get("items") or []
        return any(item.get("key") == "enable-guest-attributes"
                   and str(item.get("value", "")).strip().lower() == "true" for item in items)

    def guest_attributes(self, inst):
        """[(namespace, key, value)] the guest has written: its host keys
        (namespace hostkeys, the key type as the key, the base64 blob as
        the value, as the guest agent writes them at boot) once RUNNING,
        nothing before and nothing while it is not running."""
        if inst.status != "RUNNING":
            return []
        lines = inst.host_keys if inst.host_keys is not None else self.settings["host_keys"]
        return [("hostkeys", key_type, blob) for key_type, blob in parse_host_keys(lines)]

    def instances_get_guest_attributes(self, ctx):
        """instances.getGuestAttributes: `variableKey=NS/KEY` answers that
        one value (variableKey, variableValue); else `queryPath` ('' or
        absent: everything, `NS/` or `NS`: a namespace, `NS/KEY`: one key)
        answers the matching entries in queryValue.items. Nothing there is
        404 "The resource 'PATH' of type 'Guest Attribute' was not found."
        (the words gcloud matches for host keys not written yet).
        Without enable-guest-attributes TRUE in the instance's metadata:
        403 (the guest's metadata server refuses writes with 403 "Guest
        attributes endpoint access is disabled."; the API's answer for such
        an instance is a guess)."""
        p = ctx.params
        self.require_zone(p["project"], p["zone"])
        inst = self.get_instance(p["project"], p["zone"], p["instance"])
        if not self.guest_attributes_enabled(inst):
            raise ApiError(403, f"Guest attributes are disabled for instance 'projects/{p['project']}/zones/"
                                f"{p['zone']}/instances/{p['instance']}': set the metadata key "
                                "enable-guest-attributes to TRUE to enable them.")
        entries = self.guest_attributes(inst)

        def missing(path):
            return ApiError(404, f"The resource '{path}' of type 'Guest Attribute' was not found.")

        variable_key = ctx.query.get("variableKey")
        if variable_key:
            for namespace, key, value in entries:
                if f"{namespace}/{key}" == variable_key:
                    return {"kind": "compute#guestAttributes", "variableKey": variable_key,
                            "variableValue": value}
            raise missing(variable_key)
        query_path = ctx.query.get("queryPath")
        wanted = (query_path or "").strip("/")
        if not wanted:
            found = entries
        elif "/" in wanted:
            found = [e for e in entries if f"{e[0]}/{e[1]}" == wanted]
        else:
            found = [e for e in entries if e[0] == wanted]
        if not found:
            raise missing(query_path or "")
        answer = {"kind": "compute#guestAttributes",
                  "queryValue": {"items": [{"namespace": n, "key": k, "value": v} for n, k, v in found]}}
        if query_path is not None:
            answer["queryPath"] = query_path
        return answer

    # ----- handlers: operations ------------------------------------------------------

    @staticmethod
    def op_scope(params):
        if "zone" in params:
            return "zones", params["zone"]
        if "region" in params:
            return "regions", params["region"]
        return "global", ""

    def _check_scope(self, params):
        scope, name = self.op_scope(params)
        if scope == "zones":
            self.require_zone(params["project"], name)
        elif scope == "regions":
            self.require_region(params["project"], name)
        return scope, name

    def operations_get(self, ctx):
        scope, name = self._check_scope(ctx.params)
        op = self.find_operation(ctx.params["project"], scope, name, ctx.params["operation"])
        op.poll()
        return op.render()

    def operations_wait(self, ctx):
        scope, name = self._check_scope(ctx.params)
        op = self.find_operation(ctx.params["project"], scope, name, ctx.params["operation"])
        op.finish()
        return op.render()

    def operations_delete(self, ctx):
        scope, name = self._check_scope(ctx.params)
        op = self.find_operation(ctx.params["project"], scope, name, ctx.params["operation"])
        del self.operations[op.key]
        return None

    def operations_list(self, ctx):
        scope, name = self._check_scope(ctx.params)
        project = ctx.params["project"]
        items = [op.render() for (p, s, n, _), op in self.operations.items()
                 if (p, s, n) == (project, scope, name)]
        where = ["projects", project] + (["global"] if scope == "global" else [scope, name])
        return self.list_response(ctx, "compute#operationList", "Operation", items,
                                  link(*where, "operations"), "/".join(where) + "/operations",
                                  default_order="creationTimestamp")

    # ----- handlers: catalog ------------------------------------------------------------

    def render_machine_type(self, project, zone, name):
        cpus, memory, accelerator, count = MACHINE_TYPES[name]
        mt = {
            "kind": "compute#machineType",
            "id": str(800000000000000 + sorted(MACHINE_TYPES).index(name)),
            "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
            "name": name,
            "description": f"{cpus} vCPUs, {memory / 1024:g} GB RAM"
                           + (f", {count} {ACCELERATOR_TYPES[accelerator][0]} GPU" if accelerator else ""),
            "guestCpus": cpus,
            "memoryMb": memory,
            "maximumPersistentDisks": 128,
            "maximumPersistentDisksSizeGb": "263168",
            "zone": zone,
            "selfLink": link("projects", project, "zones", zone, "machineTypes", name),
            "isSharedCpu": False,
            "architecture": "X86_64",
        }
        if accelerator:
            mt["accelerators"] = [{"guestAcceleratorType": accelerator, "guestAcceleratorCount": count}]
        return mt

    def machine_types_in(self, zone):
        return [n for n, spec in sorted(MACHINE_TYPES.items())
                if spec[2] is None or spec[2] in ZONE_ACCELERATORS[zone]]

    def machine_types_get(self, ctx):
        p = ctx.params
        self.require_zone(p["project"], p["zone"])
        if p["machineType"] not in self.machine_types_in(p["zone"]):
            raise not_found(f"projects/{p['project']}/zones/{p['zone']}/machineTypes/{p['machineType']}")
        return self.render_machine_type(p["project"], p["zone"], p["machineType"])

    def machine_types_list(self, ctx):
        p = ctx.params
        self.require_zone(p["project"], p["zone"])
        items = [self.render_machine_type(p["project"], p["zone"], n) for n in self.machine_types_in(p["zone"])]
        return self.list_response(ctx, "compute#machineTypeList", "MachineType", items,
                                  link("projects", p["project"], "zones", p["zone"], "machineTypes"),
                                  f"projects/{p['project']}/zones/{p['zone']}/machineTypes")

    def machine_types_aggregated_list(self, ctx):
        project = ctx.params["project"]
        return self.aggregated_response(
            ctx, "compute#machineTypeAggregatedList", "MachineType", "machineTypes",
            lambda zone: [self.render_machine_type(project, zone, n) for n in self.machine_types_in(zone)],
            "machineTypes")

    def render_accelerator_type(self, project, zone, name):
        description, max_cards = ACCELERATOR_TYPES[name]
        return {
            "kind": "compute#acceleratorType",
            "id": str(10000 + sorted(ACCELERATOR_TYPES).index(name)),
            "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
            "name": name,
            "description": description,
            "zone": link("projects", project, "zones", zone),
            "selfLink": link("projects", project, "zones", zone, "acceleratorTypes", name),
            "maximumCardsPerInstance": max_cards,
        }

    def accelerator_types_get(self, ctx):
        p = ctx.params
        self.require_zone(p["project"], p["zone"])
        if p["acceleratorType"] not in ZONE_ACCELERATORS[p["zone"]]:
            raise not_found(f"projects/{p['project']}/zones/{p['zone']}/acceleratorTypes/{p['acceleratorType']}")
        return self.render_accelerator_type(p["project"], p["zone"], p["acceleratorType"])

    def accelerator_types_list(self, ctx):
        p = ctx.params
        self.require_zone(p["project"], p["zone"])
        items = [self.render_accelerator_type(p["project"], p["zone"], n)
                 for n in sorted(ZONE_ACCELERATORS[p["zone"]])]
        return self.list_response(ctx, "compute#acceleratorTypeList", "AcceleratorType", items,
                                  link("projects", p["project"], "zones", p["zone"], "acceleratorTypes"),
                                  f"projects/{p['project']}/zones/{p['zone']}/acceleratorTypes")

    def accelerator_types_aggregated_list(self, ctx):
        project = ctx.params["project"]
        return self.aggregated_response(
            ctx, "compute#acceleratorTypeAggregatedList", "AcceleratorType", "acceleratorTypes",
            lambda zone: [self.render_accelerator_type(project, zone, n) for n in ZONE_ACCELERATORS[zone]],
            "acceleratorTypes")

    def render_zone(self, project, zone):
        region = ZONE_REGION[zone]
        return {
            "kind": "compute#zone",
            "id": str(2000 + sorted(ZONE_REGION).index(zone)),
            "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
            "name": zone,
            "description": zone,
            "status": "UP",
            "region": link("projects", project, "regions", region),
            "selfLink": link("projects", project, "zones", zone),
            "availableCpuPlatforms": sorted(set(CPU_PLATFORMS.values())),
            "supportsPzs": False,
        }

    def zones_get(self, ctx):
        self.require_zone(ctx.params["project"], ctx.params["zone"])
        return self.render_zone(ctx.params["project"], ctx.params["zone"])

    def zones_list(self, ctx):
        project = ctx.params["project"]
        items = [self.render_zone(project, z) for z in sorted(ZONE_REGION)]
        return self.list_response(ctx, "compute#zoneList", "Zone", items,
                                  link("projects", project, "zones"), f"projects/{project}/zones")

    def quotas(self, project, region):
        """A region's quotas: generous limits, usage from live instances."""
        usage = {"CPUS": 0, "INSTANCES": 0, "PREEMPTIBLE_CPUS": 0}
        for inst in self.instances.values():
            if inst.project != project or ZONE_REGION[inst.zone] != region or inst.status == "TERMINATED":
                continue
            cpus, _, accelerator, count = MACHINE_TYPES[inst.machine_type]
            usage["INSTANCES"] += 1
            usage["PREEMPTIBLE_CPUS" if inst.spot else "CPUS"] += cpus
            for acc in inst.body.get("guestAccelerators", []):
                metric = GPU_QUOTA.get(short(acc["acceleratorType"]))
                if metric:
                    if inst.spot:
                        metric = "PREEMPTIBLE_" + metric
                    usage[metric] = usage.get(metric, 0) + acc["acceleratorCount"]
        limits = {"CPUS": 2400, "INSTANCES": 1000, "PREEMPTIBLE_CPUS": 2400}
        for metric in GPU_QUOTA.values():
            limits[metric] = 64
            limits["PREEMPTIBLE_" + metric] = 64
        return [{"metric": m, "limit": float(limits[m]), "usage": float(usage.get(m, 0))}
                for m in sorted(limits)]

    def render_region(self, project, region):
        return {
            "kind": "compute#region",
            "id": str(1000 + sorted(REGIONS).index(region)),
            "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
            "name": region,
            "description": region,
            "status": "UP",
            "zones": [link("projects", project, "zones", z) for z in REGIONS[region]],
            "quotas": self.quotas(project, region),
            "selfLink": link("projects", project, "regions", region),
            "supportsPzs": False,
        }

    def regions_get(self, ctx):
        self.require_region(ctx.params["project"], ctx.params["region"])
        return self.render_region(ctx.params["project"], ctx.params["region"])

    def regions_list(self, ctx):
        project = ctx.params["project"]
        items = [self.render_region(project, r) for r in sorted(REGIONS)]
        return self.list_response(ctx, "compute#regionList", "Region", items,
                                  link("projects", project, "regions"), f"projects/{project}/regions")

    def projects_get(self, ctx):
        project = ctx.params["project"]
        number = project_number(project)
        return {
            "kind": "compute#project",
            "id": number,
            "name": project,
            "creationTimestamp": "2020-01-01T00:00:00.000-08:00",
            "commonInstanceMetadata": {"kind": "compute#metadata",
                                       "fingerprint": fingerprint("project-metadata", project)},
            "defaultServiceAccount": f"{number}-compute@developer.gserviceaccount.com",
            "defaultNetworkTier": "PREMIUM",
            "xpnProjectStatus": "UNSPECIFIED_XPN_PROJECT_STATUS",
            "quotas": [{"metric": "FIREWALLS", "limit": 200.0,
                        "usage": float(sum(1 for (p, _) in self.firewalls if p == project))},
                       {"metric": "GPUS_ALL_REGIONS", "limit": 64.0, "usage": 0.0}],
            "selfLink": link("projects", project),
        }

    # ----- handlers: resource policies ---------------------------------------------------

    def policies_insert(self, ctx):
        project, region = ctx.params["project"], ctx.params["region"]
        self.require_region(project, region)
        body = ctx.body
        name = body.get("name") or ""
        if not NAME_RE.fullmatch(name):
            raise invalid("resource.name", name, f"Must be a match of regex '{NAME_REGEX_TEXT}'")

        def work(op):
            if (project, region, name) in self.policies:
                raise ApiError(409, f"The resource 'projects/{project}/regions/{region}/resourcePolicies/"
                                    f"{name}' already exists")
            policy = copy.deepcopy(body)
            for output_only in ("id", "kind", "selfLink", "creationTimestamp", "region", "status",
                                "resourceStatus"):
                policy.pop(output_only, None)
            policy.update({
                "kind": "compute#resourcePolicy",
                "id": self.new_id(),
                "creationTimestamp": now_text(),
                "region": link("projects", project, "regions", region),
                "selfLink": link("projects", project, "regions", region, "resourcePolicies", name),
                "status": "READY",
            })
            self.policies[(project, region, name)] = policy
            op.target_id = policy["id"]

        return self.start_operation(ctx, "regions", region, "insert",
                                    link("projects", project, "regions", region, "resourcePolicies", name), work)

    def get_policy(self, params):
        project, region, name = params["project"], params["region"], params["resourcePolicy"]
        self.require_region(project, region)
        policy = self.policies.get((project, region, name))
        if policy is None:
            raise not_found(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        return policy

    def policies_get(self, ctx):
        return copy.deepcopy(self.get_policy(ctx.params))

    def policies_list(self, ctx):
        project, region = ctx.params["project"], ctx.params["region"]
        self.require_region(project, region)
        items = [copy.deepcopy(v) for (p, r, _), v in self.policies.items() if (p, r) == (project, region)]
        return self.list_response(ctx, "compute#resourcePolicyList", "ResourcePolicy", items,
                                  link("projects", project, "regions", region, "resourcePolicies"),
                                  f"projects/{project}/regions/{region}/resourcePolicies")

    def policies_aggregated_list(self, ctx):
        project = ctx.params["project"]
        return self.aggregated_response(
            ctx, "compute#resourcePolicyAggregatedList", "ResourcePolicy", "resourcePolicies",
            lambda region: [copy.deepcopy(v) for (p, r, _), v in self.policies.items()
                            if (p, r) == (project, region)],
            "resourcePolicies", scope="regions")

    def policies_delete(self, ctx):
        policy = self.get_policy(ctx.params)
        project, region, name = ctx.params["project"], ctx.params["region"], ctx.params["resourcePolicy"]
        users = [i for i in self.instances.values() if policy["selfLink"] in i.body.get("resourcePolicies", [])]
        if users:
            raise ApiError(400, f"The resource_policy resource '{policy['selfLink']}' is already being used "
                                f"by '{users[0].body['selfLink']}'", reason="resourceInUseByAnotherResource")

        def work(op):
            op.on_status = lambda op_now, status: (
                self.policies.pop((project, region, name), None) if status == "DONE" else None)

        return self.start_operation(ctx, "regions", region, "delete", policy["selfLink"], work,
                                    target_id=policy["id"])

    # ----- handlers: firewalls --------------------------------------------------------------

    def firewalls_insert(self, ctx):
        project = ctx.params["project"]
        body = ctx.body
        name = body["name"]

        def work(op):
            if (project, name) in self.firewalls:
                raise ApiError(409, f"The resource 'projects/{project}/global/firewalls/{name}' already exists")
            if not body.get("allowed") and not body.get("denied"):
                raise invalid("resource.allowed", "", "At least one of allowed or denied must be given.")
            for i, rule in enumerate((body.get("allowed") or []) + (body.get("denied") or [])):
                if not rule.get("IPProtocol"):
                    raise invalid(f"resource.allowed[{i}].IPProtocol", "", "The protocol must be given.")
            firewall = copy.deepcopy(body)
            for output_only in ("id", "kind", "selfLink", "creationTimestamp"):
                firewall.pop(output_only, None)
            direction = firewall.setdefault("direction", "INGRESS")
            if direction == "INGRESS" and not (firewall.get("sourceRanges") or firewall.get("sourceTags")
                                               or firewall.get("sourceServiceAccounts")):
                firewall["sourceRanges"] = ["0.0.0.0/0"]
            if direction == "EGRESS" and not firewall.get("destinationRanges"):
                firewall["destinationRanges"] = ["0.0.0.0/0"]
            firewall.update({
                "kind": "compute#firewall",
                "id": self.new_id(),
                "creationTimestamp": now_text(),
                "network": link("projects", project, "global", "networks",
                                short(firewall.get("network") or "default")),
                "priority": firewall.get("priority", 1000),
                "disabled": bool(firewall.get("disabled", False)),
                "selfLink": link("projects", project, "global", "firewalls", name),
            })
            op.target_id = firewall["id"]

            def on_status(op_now, status):
                if status == "DONE":
                    self.firewalls[(project, name)] = firewall
            op.on_status = on_status

        return self.start_operation(ctx, "global", "", "insert",
                                    link("projects", project, "global", "firewalls", name), work)

    def get_firewall(self, params):
        firewall = self.firewalls.get((params["project"], params["firewall"]))
        if firewall is None:
            raise not_found(f"projects/{params['project']}/global/firewalls/{params['firewall']}")
        return firewall

    def firewalls_get(self, ctx):
        return copy.deepcopy(self.get_firewall(ctx.params))

    def firewalls_list(self, ctx):
        project = ctx.params["project"]
        items = [copy.deepcopy(v) for (p, _), v in self.firewalls.items() if p == project]
        return self.list_response(ctx, "compute#firewallList", "Firewall", items,
                                  link("projects", project, "global", "firewalls"),
                                  f"projects/{project}/global/firewalls")

    def firewalls_delete(self, ctx):
        firewall = self.get_firewall(ctx.params)
        key = (ctx.params["project"], ctx.params["firewall"])

        def work(op):
            op.on_status = lambda op_now, status: (
                self.firewalls.pop(key, None) if status == "DONE" else None)

        return self.start_operation(ctx, "global", "", "delete", firewall["selfLink"], work,
                                    target_id=firewall["id"])

    # ----- lists ---------------------------------------------------------------------------

    def compile_filter(self, ctx, item_ref):
        try:
            return gce_filter.compile_filter(
                ctx.query.get("filter"), lambda parts: self.schema.field_exists(item_ref, parts))
        except gce_filter.FilterError as err:
            raise ApiError(400, str(err))

    def list_response(self, ctx, kind, item_ref, items, self_link, list_id, default_order="name"):
        """A list page: filter, order (name, or `creationTimestamp desc`),
        maxResults (1-500; 0 means 500) and pageToken."""
        predicate = self.compile_filter(ctx, item_ref)
        items = [item for item in items if predicate(item)]
        order = ctx.query.get("orderBy")
        if order in (None, ""):
            items.sort(key=lambda r: r.get(default_order) or "")
        elif order == "name":
            items.sort(key=lambda r: r.get("name") or "")
        elif order == "creationTimestamp desc":
            items.sort(key=lambda r: r.get("creationTimestamp") or "", reverse=True)
        else:
            raise invalid("orderBy", order, "Only `name` and `creationTimestamp desc` are supported.")
        start, page_size = self.page_window(ctx)
        page = items[start:start + page_size]
        response = {"kind": kind, "id": list_id, "selfLink": self_link}
        if page:   # like GCE (proto3 JSON), no `items` at all when there are none
            response["items"] = page
        if start + page_size < len(items):
            response["nextPageToken"] = page_token(start + page_size)
        return response

    @staticmethod
    def page_window(ctx):
        """(first item, page size) from maxResults (1-500; 0 means 500) and pageToken."""
        page_size = int(ctx.query.get("maxResults") or 500)
        if page_size > 500:
            raise invalid("maxResults", page_size, "Must be less than or equal to 500")
        start = 0
        if ctx.query.get("pageToken"):
            try:
                start = page_offset(ctx.query["pageToken"])
            except ValueError:
                raise invalid("pageToken", ctx.query["pageToken"], "Invalid page token.")
        return start, page_size

    def aggregated_response(self, ctx, kind, item_ref, key, zone_items, collection, scope="zones"):
        """An aggregatedList page: `items` maps every zone's scope (`zones/Z`;
        `regions/R` for regional resources, `scope="regions"`) to
        {key: [...]} or, with nothing of it on this page, GCE's
        NO_RESULTS_ON_PAGE warning. `zone_items(place)` gives a place's
        resources; the filter applies to each, and maxResults/pageToken page
        over all of them flattened in place order (then by name), as GCE's
        own paging does across scopes."""
        places = sorted(REGIONS) if scope == "regions" else sorted(ZONE_REGION)
        if ctx.query.get("orderBy") not in (None, "", "name"):
            raise invalid("orderBy", ctx.query["orderBy"], "Only `name` is supported in aggregated lists.")
        predicate = self.compile_filter(ctx, item_ref)
        flat = [(zone, item) for zone in places
                for item in sorted(zone_items(zone), key=lambda r: r.get("name") or "") if predicate(item)]
        start, page_size = self.page_window(ctx)
        page = flat[start:start + page_size]
        scopes = {}
        for zone in places:
            name = f"{scope}/{zone}"
            found = [item for z, item in page if z == zone]
            scopes[name] = {key: found} if found else {"warning": {
                "code": "NO_RESULTS_ON_PAGE",
                "message": f"There are no results for scope '{name}' on this page.",
                "data": [{"key": "scope", "value": name}]}}
        project = ctx.params["project"]
        response = {"kind": kind, "id": f"projects/{project}/aggregated/{collection}",
                    "items": scopes, "selfLink": link("projects", project, "aggregated", collection)}
        if start + page_size < len(flat):
            response["nextPageToken"] = page_token(start + page_size)
        return response

    # ----- the Cloud Billing Catalog ------------------------------------------------------

    def billing_services(self):
        """services.list: only Compute Engine."""
        return {"services": [{"name": BILLING_SERVICE, "serviceId": BILLING_SERVICE_ID,
                              "displayName": "Compute Engine",
                              "businessEntityName": "businessEntities/GCP"}],
                "nextPageToken": ""}

    def billing_list_skus(self, service_id, query_pairs):
        """services.skus.list: a page of the catalog, after the injected
        failure (a disabled API answers before looking at the request)."""
        with self.lock:
            self.billing["calls"] += 1
            fail = self.billing["fail"]
            if fail is not None:
                if self.billing["times"] > 0:
                    self.billing["times"] -= 1
                    if self.billing["times"] == 0:
                        self.billing.update(fail=None, message=None, times=-1)
                raise self.billing_failure(fail, self.billing["message"])
            factors = dict(self.billing["region_factor"])
        if service_id != BILLING_SERVICE_ID:
            raise RpcError(404, f"Service 'services/{service_id}' not found (gangway's fake Cloud Billing "
                                f"Catalog has only Compute Engine, {BILLING_SERVICE}).")
        query = self.billing_query(query_pairs)
        currency = query.get("currencyCode") or "USD"
        if currency != "USD":
            raise bad_request("currency_code", f"Currency code '{currency}' is not supported: gangway's "
                                               "fake Cloud Billing Catalog prices in USD only.")
        try:
            page_size = int(query.get("pageSize") or 0)
        except ValueError:
            raise bad_request("page_size", f"Invalid value at 'page_size' (TYPE_INT32), "
                                           f"\"{query['pageSize']}\"")
        if page_size < 0:
            raise bad_request("page_size", "The page size must not be negative.")
        # 0 is the default; more than the maximum is taken as the maximum.
        page_size = min(page_size or BILLING_PAGE_SIZE, BILLING_PAGE_SIZE)
        start = 0
        if query.get("pageToken"):
            try:
                start = page_offset(query["pageToken"])
            except ValueError:
                raise bad_request("page_token", "The page token is invalid.")
        skus = billing_skus(factors)
        page = skus[start:start + page_size]
        # `$alt=json;enum-encoding=int` (what Google's generated REST clients
        # send) turns enums into their numbers: REGIONAL is 2.
        alt = query.get("$alt") or query.get("alt") or "json"
        if "enum-encoding=int" in alt:
            page = [dict(sku, geoTaxonomy=dict(sku["geoTaxonomy"], type=2)) for sku in page]
        more = start + page_size < len(skus)
        return {"skus": page, "nextPageToken": page_token(start + page_size) if more else ""}

    @staticmethod
    def billing_query(query_pairs):
        """The SKU list's query parameters, refused like Google's front end
        refuses them: unknown names, repeats, bad times, non-JSON alt."""
        query = {}
        for name, value in query_pairs:
            if name not in BILLING_QUERY_PARAMETERS and name.lstrip("$") not in BILLING_QUERY_PARAMETERS:
                raise bad_request(name, f'Invalid JSON payload received. Unknown name "{name}": Cannot '
                                        f"bind query parameter. Field '{name}' could not be found in "
                                        "request message.")
            if name in query:
                raise bad_request(name, f"parameter '{name}' given more than once")
            if name in ("startTime", "endTime") and not gce_schema.DATETIME_RE.match(value):
                raise bad_request(name, f"Invalid value at '{name}' (type.googleapis.com/"
                                        f"google.protobuf.Timestamp), Field '{name}', Invalid time "
                                        f"format: {value}")
            if name in ("alt", "$alt") and not value.startswith("json"):
                raise bad_request(name, f"gangway's fake Cloud Billing Catalog answers JSON only, not {value}")
            query[name] = value
        return query

    @staticmethod
    def billing_failure(code, message):
        if code == 403:
            return billing_disabled_error(message)
        defaults = {
            401: "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
                 "cookie or other valid authentication credential.",
            429: "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute' "
                 "of service 'cloudbilling.googleapis.com' for consumer 'project_number:100000000000'.",
            500: "Internal error encountered.",
            503: "The service is currently unavailable.",
        }
        return RpcError(code, message or defaults.get(code, f"Injected error ({code}) from gangway's "
                                                             "fake Cloud Billing API."))

    def billing_control(self, spec):
        """POST /_gangway/billing: {"fail": 403 | null, "message"?, "times"?,
        "region_factor": {region: factor} | null}."""
        unknown = set(spec) - {"fail", "message", "times", "region_factor"}
        if unknown:
            raise ApiError(400, f"unknown billing settings {sorted(unknown)}; known: fail, message, "
                                "times, region_factor")
        with self.lock:
            if "fail" in spec:
                code, times = spec["fail"], spec.get("times", -1)
                if code is not None and (not isinstance(code, int) or isinstance(code, bool)
                                         or not 400 <= code <= 599):
                    raise ApiError(400, '"fail" is an HTTP error status (400-599), or null')
                if not isinstance(times, int) or isinstance(times, bool) or times == 0 or times < -1:
                    raise ApiError(400, '"times" is a positive count, or -1 for until cleared')
                self.billing.update(fail=code, message=spec.get("message") if code else None,
                                    times=times if code else -1)
            if "region_factor" in spec:
                factors = spec["region_factor"]
                if factors is None:
                    self.billing["region_factor"] = dict(BILLING_REGION_FACTOR)
                else:
                    if not isinstance(factors, dict) or not all(
                            r in REGIONS and isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0
                            for r, f in factors.items()):
                        raise ApiError(400, '"region_factor" maps known regions to positive numbers '
                                            f"({sorted(REGIONS)}), or is null for the defaults")
                    self.billing["region_factor"].update(factors)
            return self.billing_state()

    def billing_state(self):
        with self.lock:
            return dict(self.billing, region_factor=dict(self.billing["region_factor"]))

    # ----- control: preemption, metadata ------------------------------------------------

    def preempt(self, spec):
        name = spec.get("instance")
        if not isinstance(name, str) or not name:
            raise ApiError(400, '"instance" (an instance name) is required')
        with self.lock:
            inst = self.find_instance(name, spec.get("zone"), spec.get("project"))
            if inst is None:
                raise ApiError(404, f"no instance named {name!r}")
            if not inst.spot and not spec.get("force"):
                raise ApiError(400, f"{name} is not a Spot (or preemptible) instance; "
                                    'give "force": true to preempt it anyway')
            if inst.status not in ("PROVISIONING", "STAGING", "RUNNING"):
                raise ApiError(409, f"{name} is {inst.status}; only a running instance can be preempted")
            action = inst.body["scheduling"].get("instanceTerminationAction") or "STOP"
            op = Operation(self, inst.project, "zones", inst.zone, "compute.instances.preempted",
                           inst.body["selfLink"], inst.body["id"], done=True)
            op.status_message = "Instance was preempted."
            self.operations[op.key] = op
            inst.preempted = True
            inst.transition = None
            inst.set_status("STOPPING")

            def complete():
                if action == "DELETE":
                    self.remove_instance(inst)
                else:
                    inst.set_status("TERMINATED")
                self.changed.notify_all()

            grace = float(spec.get("grace_s") or 0)
            if grace > 0:
                self.timers.append((time.monotonic() + grace, complete))
            else:
                complete()
            self.changed.notify_all()
            return {"instance": name, "zone": inst.zone, "project": inst.project,
                    "action": action, "operation": op.render()}

    def metadata_value(self, target, path, query):
        """(status, text) of a metadata path for an instance target
        ({"instance", "zone", "project"})."""
        inst = self.find_instance(target["instance"], target.get("zone"), target.get("project"),
                                  include_gone=True)
        if inst is None:
            return 404, f"no instance named {target['instance']!r} (yet)\n"
        number = project_number(inst.project)
        attributes = {item["key"]: item.get("value", "")
                      for item in inst.body.get("metadata", {}).get("items", [])}
        nic = (inst.body.get("networkInterfaces") or [{}])[0]
        access = (nic.get("accessConfigs") or [{}])[0]
        values = {
            "instance/preempted": "TRUE" if inst.preempted else "FALSE",
            "instance/maintenance-event": "NONE",
            "instance/name": inst.name,
            "instance/id": inst.body["id"],
            "instance/hostname": inst.body.get("hostname") or f"{inst.name}.{inst.zone}.c.{inst.project}.internal",
            "instance/zone": f"projects/{number}/zones/{inst.zone}",
            "instance/machine-type": f"projects/{number}/machineTypes/{inst.machine_type}",
            "instance/attributes/": "".join(f"{k}\n" for k in sorted(attributes)),
            "instance/network-interfaces/0/ip": nic.get("networkIP", ""),
            "instance/network-interfaces/0/access-configs/0/external-ip": access.get("natIP", ""),
            "project/project-id": inst.project,
            "project/numeric-project-id": number,
        }
        for key, value in attributes.items():
            values[f"instance/attributes/{key}"] = value
        # The service account it runs as: its email, scopes and an OAuth
        # access token (the instance's own, made up; a GCS emulator takes
        # any), under `default/` and under its email. None without one.
        accounts = inst.body.get("serviceAccounts") or []
        if accounts:
            email = accounts[0]["email"]
            values["instance/service-accounts/"] = f"default/\n{email}/\n"
            token = json.dumps({
                "access_token": "ya29.gw-" + hexhash(40, "token", inst.project, inst.zone, inst.name),
                "expires_in": 3599,
                "token_type": "Bearer",
            })
            for who in ("default", email):
                values[f"instance/service-accounts/{who}/email"] = email
                values[f"instance/service-accounts/{who}/scopes"] = "".join(
                    f"{scope}\n" for scope in accounts[0].get("scopes", []))
                values[f"instance/service-accounts/{who}/token"] = token
        key = path.strip("/") if not path.endswith("/") or path.lstrip("/") not in values \
            else path.lstrip("/")
        if key not in values:
            return 404, "Not Found\n"
        return 200, values[key]

    def metadata_server_for(self, spec, host):
        """A metadata-only HTTP server bound to one instance; reused."""
        name = spec.get("instance")
        if not isinstance(name, str) or not name:
            raise ApiError(400, '"instance" (an instance name) is required')
        target = {"instance": name, "zone": spec.get("zone"), "project": spec.get("project")}
        key = (name, target["zone"], target["project"])
        with self.lock:
            server = self.metadata_servers.get(key)
            if server is None:
                server = EmulatorHTTPServer((host, 0), Handler, self, metadata_target=target)
                threading.Thread(target=server.serve_forever, name=f"metadata-{name}", daemon=True).start()
                self.metadata_servers[key] = server
        port = server.server_address[1]
        return {"host": f"{host}:{port}", "port": port, "url": f"http://{host}:{port}", **target}


# ----- HTTP -------------------------------------------------------------------------

class Call:
    """One API call as the handlers see it."""

    def __init__(self, method, params, query, body, fault):
        self.method = method
        self.params = params
        self.query = query
        self.body = body
        self.fault = fault


class EmulatorHTTPServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: parallel tests (and long
    # polls) overflow it and get connections reset.
    request_queue_size = 256

    def __init__(self, address, handler, emu, metadata_target=None, check_responses=True):
        self.emu = emu
        self.metadata_target = metadata_target
        self.check_responses = check_responses
        super().__init__(address, handler)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gangway-gce-emulator"

    def log_message(self, fmt, *args):
        log.info("%s %s", self.address_string(), fmt % args)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = lambda self: self.dispatch()

    # ----- plumbing ----------------------------------------------------------------

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send(self, status, body, content_type="application/json; charset=UTF-8", headers=None):
        if isinstance(body, (dict, list)):
            data = json.dumps(body, indent=1).encode()
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = body or b""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_error_json(self, err):
        # Emulator bugs always reach stderr; other errors (the client's, or
        # injected) only with --verbose.
        bug = err.message.startswith("gangway GCE emulator bug")
        log.log(logging.ERROR if bug else logging.INFO,
                "%s %s -> %s %s", self.command, self.path, err.code, err.message)
        self.send(err.code, err.body())

    def dispatch(self):
        try:
            url = urllib.parse.urlsplit(self.path)
            raw = self.read_body()
            emu = self.server.emu
            if self.server.metadata_target is not None:
                return self.metadata(self.server.metadata_target, url)
            path = url.path
            if path.startswith("/_gangway/metadata/"):
                rest = path[len("/_gangway/metadata/"):]
                name, _, tail = rest.partition("/")
                query = dict(urllib.parse.parse_qsl(url.query))
                target = {"instance": name, "zone": query.get("zone"), "project": query.get("project")}
                return self.metadata(target, url._replace(path="/" + tail))
            if path.startswith("/_gangway/"):
                return self.control(path[len("/_gangway/"):].strip("/"), url, raw)
            if path.startswith("/v1/"):
                return self.billing(path, url)
            if path.startswith("/computeMetadata/"):
                target = emu.default_metadata_instance
                if target is None:
                    return self.send(404, "no default metadata instance: POST /_gangway/metadata-default\n",
                                     "text/plain")
                return self.metadata(target, url)
            self.api(url, raw)
        except ApiError as err:
            self.send_error_json(err)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # a bug in the emulator: say so loudly
            log.exception("internal error on %s %s", self.command, self.path)
            self.send_error_json(ApiError(500, f"gangway GCE emulator bug: {exc!r}"))

    # ----- the API -------------------------------------------------------------------

    def api(self, url, raw):
        emu = self.server.emu
        schema = emu.schema
        path = url.path
        relative = path[len(API_PREFIX):] if path.startswith(API_PREFIX) else path.lstrip("/")
        method, params = schema.route(self.command, relative)
        if method is None:
            raise ApiError(404, f"The requested URL {path} ({self.command}) was not found on this server.")
        query_pairs = urllib.parse.parse_qsl(url.query, keep_blank_values=True)
        problems = [(loc, msg) for loc, msg in schema.check_parameters(method, params, query_pairs)]
        body = None
        text = raw.decode("utf-8", "replace").strip()
        if text:
            try:
                body = json.loads(text)
            except ValueError as err:
                raise ApiError(400, f"Invalid JSON payload received. {err}", reason="parseError")
        if schema.request_ref(method) and body is None:
            body = {}
        if schema.request_ref(method) and not isinstance(body, dict):
            raise ApiError(400, "Invalid JSON payload received. The body must be a JSON object.",
                           reason="parseError")
        problems += schema.check_request_body(method, body)
        if problems:
            # One line per problem; those that do not name their field
            # themselves get "path: " in front.
            texts = [msg if not loc or loc in msg else f"{loc}: {msg}" for loc, msg in problems]
            raise ApiError(400, "; ".join(texts), problems=problems)
        query = dict(query_pairs)
        handler = emu.handlers.get(method["id"])
        if handler is None:
            raise ApiError(501, f"{method['id']} is not implemented by gangway's GCE emulator.")
        returns_operation = schema.response_ref(method) == "Operation" and \
            not method["id"].split(".")[1].endswith("Operations")
        haystack = self.path + "\n" + text
        with emu.lock:
            emu.tick()
            where = dict(params)
            if "zone" in params:
                where.setdefault("region", ZONE_REGION.get(params["zone"]))
            fault = emu.faults.take(method["id"], where, haystack, returns_operation)
            if fault and fault["kind"] == "http":
                log.info("fault rule %s: %s -> %s", fault["id"], method["id"], fault["http_status"])
                raise ApiError(fault["http_status"], emu._fill(fault["message"], params),
                               reason=fault["reason"], status=fault["status"])
            result = handler(Call(method, params, query, body, fault))
        if result is None:
            return self.send(204 if self.command == "DELETE" else 200, b"", "application/json")
        if self.server.check_responses:
            violations = schema.check_response_body(method, result)
            if violations:
                log.error("response of %s breaks the schema: %s", method["id"], violations)
                raise ApiError(500, "gangway GCE emulator bug: its response breaks the "
                                    f"{schema.response_ref(method)} schema: {violations}")
        self.send(200, result)

    # ----- the Cloud Billing Catalog ----------------------------------------------------

    def billing(self, path, url):
        """cloudbilling.googleapis.com's catalog on the API port:
        GET /v1/services and GET /v1/services/ID/skus."""
        emu = self.server.emu
        match = re.fullmatch(r"/v1/services(?:/([^/]+)/skus)?", path)
        if self.command != "GET" or not match:
            raise RpcError(404, f"Method not found: {self.command} {path} (gangway's fake Cloud Billing "
                                "Catalog has GET /v1/services and GET /v1/services/ID/skus).")
        if match.group(1) is None:
            return self.send(200, emu.billing_services())
        query_pairs = urllib.parse.parse_qsl(url.query, keep_blank_values=True)
        self.send(200, emu.billing_list_skus(urllib.parse.unquote(match.group(1)), query_pairs))

    # ----- the metadata server ----------------------------------------------------------

    def metadata(self, target, url):
        """GCE's metadata server for one instance: /computeMetadata/v1/...,
        `Metadata-Flavor: Google` required, wait_for_change long polls."""
        emu = self.server.emu
        if self.headers.get("Metadata-Flavor") != "Google":
            return self.send(403, "Missing required header: Metadata-Flavor: Google\n", "text/plain",
                             {"Metadata-Flavor": "Google"})
        prefix = "/computeMetadata/v1/"
        if not url.path.startswith(prefix):
            return self.send(404, "Not Found\n", "text/plain", {"Metadata-Flavor": "Google"})
        path = url.path[len(prefix):]
        query = dict(urllib.parse.parse_qsl(url.query))
        wait = query.get("wait_for_change", "").lower() == "true"
        timeout = float(query.get("timeout_sec") or emu.settings["metadata_timeout_s"])
        etag_of = lambda text: hexhash(16, "etag", text)   # noqa: E731
        with emu.lock:
            status, text = emu.metadata_value(target, path, query)
            if wait and status == 200:
                baseline = query.get("last_etag") or etag_of(text)
                deadline = time.monotonic() + timeout
                while etag_of(text) == baseline and status == 200:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    emu.changed.wait(min(left, 0.5))
                    emu.tick()
                    status, text = emu.metadata_value(target, path, query)
        headers = {"Metadata-Flavor": "Google"}
        if status == 200:
            headers["ETag"] = etag_of(text)
        self.send(status, text, "application/text", headers)

    # ----- control --------------------------------------------------------------------

    def control(self, what, url, raw):
        emu = self.server.emu
        query = dict(urllib.parse.parse_qsl(url.query))
        try:
            spec = json.loads(raw) if raw.strip() else {}
        except ValueError as err:
            raise ApiError(400, f"control body is not JSON: {err}")
        method = self.command
        if what == "health":
            return self.send(200, "ok", "text/plain")
        if what in ("fault", "faults"):
            if method == "POST":
                try:
                    return self.send(201, emu.faults.add(spec))
                except ValueError as err:
                    raise ApiError(400, str(err))
            if method == "GET":
                return self.send(200, {"rules": emu.faults.list()})
            if method == "DELETE":
                rule_id = int(query["id"]) if "id" in query else None
                return self.send(200, {"removed": emu.faults.clear(rule_id)})
        if what == "fired" and method == "GET":
            fired = emu.faults.fired()
            if "method" in query:
                wanted = query["method"].removeprefix("compute.")
                fired = [f for f in fired if f["method"] == wanted]
            return self.send(200, {"fired": fired})
        if what == "preempt" and method == "POST":
            return self.send(200, emu.preempt(spec))
        if what == "reset" and method == "POST":
            emu.reset()
            return self.send(200, {"reset": True})
        if what == "settings":
            if method == "POST":
                unknown = set(spec) - set(DEFAULT_SETTINGS)
                if unknown:
                    raise ApiError(400, f"unknown settings {sorted(unknown)}; known: {sorted(DEFAULT_SETTINGS)}")
                if "host_keys" in spec:
                    parse_host_keys(spec["host_keys"])
                    spec["host_keys"] = [line.strip() for line in spec["host_keys"]]
                with emu.lock:
                    emu.settings.update(spec)
            return self.send(200, dict(emu.settings))
        if what == "capacity":
            if method == "POST":
                zone, machine_type = spec.get("zone"), spec.get("machineType")
                if zone not in ZONE_REGION or machine_type not in MACHINE_TYPES:
                    raise ApiError(400, '"zone" and "machineType" must name a known zone and machine type')
                with emu.lock:
                    if spec.get("available") is None:
                        emu.capacity.pop((zone, machine_type), None)
                    else:
                        emu.capacity[(zone, machine_type)] = int(spec["available"])
            with emu.lock:
                rules = [{"zone": z, "machineType": m, "available": n,
                          "left": emu.capacity_left(z, m)} for (z, m), n in sorted(emu.capacity.items())]
            return self.send(200, {"capacity": rules})
        if what == "metadata-server" and method == "POST":
            return self.send(200, emu.metadata_server_for(spec, self.server.server_address[0]))
        if what == "metadata-default" and method == "POST":
            with emu.lock:
                emu.default_metadata_instance = (
                    {"instance": spec["instance"], "zone": spec.get("zone"), "project": spec.get("project")}
                    if spec.get("instance") else None)
            return self.send(200, {"default": emu.default_metadata_instance})
        if what == "host-keys" and method == "POST":
            # One instance's own host keys (a VM that came up on another
            # sshd, or a key replaced); "host_keys": null goes back to the
            # host_keys setting.
            lines = spec.get("host_keys")
            if lines is not None:
                parse_host_keys(lines)
                lines = [line.strip() for line in lines]
            with emu.lock:
                inst = emu.find_instance(spec.get("instance", ""), spec.get("zone"), spec.get("project"))
                if inst is None:
                    raise ApiError(404, f"no instance named {spec.get('instance')!r}")
                inst.host_keys = lines
                effective = lines if lines is not None else list(emu.settings["host_keys"])
                return self.send(200, {"instance": inst.name, "zone": inst.zone, "project": inst.project,
                                       "host_keys": effective, "own": lines is not None})
        if what == "nat-ip" and method == "POST":
            with emu.lock:
                inst = emu.find_instance(spec.get("instance", ""), spec.get("zone"), spec.get("project"))
                if inst is None:
                    raise ApiError(404, f"no instance named {spec.get('instance')!r}")
                configs = inst.body["networkInterfaces"][0].setdefault(
                    "accessConfigs", [{"kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT",
                                       "name": "External NAT", "networkTier": "PREMIUM"}])
                emu.nat_ips.discard(configs[0].get("natIP"))
                configs[0]["natIP"] = spec["natIP"]
                emu.nat_ips.add(spec["natIP"])
                emu.changed.notify_all()
                return self.send(200, inst.render())
        if what == "billing":
            if method == "POST":
                return self.send(200, emu.billing_control(spec))
            if method == "GET":
                return self.send(200, emu.billing_state())
        if what == "state" and method == "GET":
            with emu.lock:
                emu.tick()
                return self.send(200, {
                    "instances": [i.render() for i in emu.instances.values()],
                    "operations": [op.render() for op in emu.operations.values()],
                    "firewalls": list(emu.firewalls.values()),
                    "resourcePolicies": list(emu.policies.values()),
                    "settings": dict(emu.settings),
                    "billing_calls": emu.billing["calls"],
                })
        raise ApiError(404, f"no control endpoint {method} /_gangway/{what}")


# ----- kill points (the fault sweep) ---------------------------------------------------

# The kill points' process handling is shared with the other emulator.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from killpoints import kill_marked  # noqa: E402

class KillPoints:
    """Exact kill points for gangway's fault sweep. Once armed, the fake's
    Compute API requests (not the control API, billing or metadata) are
    numbered 1, 2, ...: request k's arrival is kill point 2k-1 and its
    return (the work done, the answer not yet sent) kill point 2k. At point
    `at` (0: never, only count) every process whose environment has the
    entry `marker` is SIGKILLed, once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.state = None

    def arm(self, spec):
        unknown = set(spec) - {"at", "marker"}
        if unknown:
            raise ApiError(400, f"unknown fields {sorted(unknown)}; known: at, marker")
        at, marker = spec.get("at", 0), spec.get("marker", "")
        if not isinstance(at, int) or isinstance(at, bool) or at < 0:
            raise ApiError(400, '"at" is a kill point (1, 2, ...), or 0 to count only')
        if not isinstance(marker, str) or (at > 0 and "=" not in marker):
            raise ApiError(400, '"marker" is an environment entry KEY=VALUE of the processes to kill')
        with self.lock:
            self.state = {"at": at, "marker": marker, "requests": 0, "fired": None}
            return self.view_locked()

    def view_locked(self):
        if self.state is None:
            return {"at": None, "requests": 0, "points": 0, "fired": None}
        return {**self.state, "points": 2 * self.state["requests"]}

    def view(self):
        with self.lock:
            return self.view_locked()

    def disarm(self):
        with self.lock:
            removed, self.state = self.state is not None, None
            return int(removed)

    def arrive(self):
        """Numbers a request: (k, whether point 2k-1 fires), or None when
        not armed."""
        with self.lock:
            if self.state is None:
                return None
            self.state["requests"] += 1
            k = self.state["requests"]
            return k, self._take(2 * k - 1)

    def returning(self, k):
        """Whether request k's return (point 2k) fires."""
        with self.lock:
            return self.state is not None and self._take(2 * k)

    def _take(self, point):
        if self.state["fired"] is None and self.state["at"] == point:
            self.state["fired"] = {"point": point}
            return True
        return False

    def kill(self, request, when, what):
        """Kills the marked processes; records what and whom."""
        with self.lock:
            state = self.state
            state["fired"].update({"request": request, "when": when, "call": what})
        # `killed` comes last: readers wait for it (the client dies first).
        killed = kill_marked(state["marker"])
        log.info("kill point: %s of request %s (%s): killed %s", when, request, what, killed)
        with self.lock:
            state["fired"]["killed"] = killed


_kill_points_lock = threading.Lock()


def kill_points_of(emu):
    """The emulator's kill points, made on first use."""
    with _kill_points_lock:
        if getattr(emu, "kill_points", None) is None:
            emu.kill_points = KillPoints()
        return emu.kill_points


class KillPointHandler(Handler):
    """The API handler with kill points (KillPoints) and their control
    endpoint, /_gangway/kill."""

    def dispatch(self):
        self._kill_return = None
        try:
            super().dispatch()
        except (BrokenPipeError, ConnectionResetError):
            pass  # an error answer to a client killed meanwhile
        finally:
            self._kill_return = None

    def api(self, url, raw):
        points = kill_points_of(self.server.emu)
        counted = points.arrive()
        if counted is not None:
            k, now = counted
            what = f"{self.command} {url.path}"
            if now:
                # Killed as the request arrived: it never reaches the fake.
                points.kill(k, "arrival", what)
                raise ApiError(503, f"gangway fault sweep: the client was killed as request {k} arrived")
            self._kill_return = (k, what)
        return super().api(url, raw)

    def send(self, status, body, content_type="application/json; charset=UTF-8", headers=None):
        pending, self._kill_return = getattr(self, "_kill_return", None), None
        if pending is not None:
            points = kill_points_of(self.server.emu)
            if points.returning(pending[0]):
                # The work is done; the answer never reaches the client.
                points.kill(pending[0], "return", pending[1])
        return super().send(status, body, content_type, headers)

    def control(self, what, url, raw):
        points = kill_points_of(self.server.emu)
        if what == "kill":
            if self.command == "POST":
                try:
                    spec = json.loads(raw) if raw.strip() else {}
                except ValueError as err:
                    raise ApiError(400, f"control body is not JSON: {err}")
                if not isinstance(spec, dict):
                    raise ApiError(400, "a kill spec is a JSON object")
                return self.send(200, points.arm(spec))
            if self.command == "GET":
                return self.send(200, points.view())
            if self.command == "DELETE":
                return self.send(200, {"removed": points.disarm()})
        if what == "reset" and self.command == "POST":
            points.disarm()
        return super().control(what, url, raw)


def serve(args, schema):
    settings = {"op_polls": args.op_polls, "op_auto_done_s": args.op_auto_done_s,
                "nat_ip_prefix": args.nat_ip_prefix}
    emu = Emulator(schema, settings)
    if args.metadata_instance:
        emu.default_metadata_instance = {"instance": args.metadata_instance, "zone": None, "project": None}
    server = EmulatorHTTPServer((args.host, args.port), KillPointHandler, emu,
                                check_responses=not args.no_check_responses)
    host, port = server.server_address[:2]
    endpoint = f"http://{host}:{port}"
    threading.Thread(target=server.serve_forever, name="serve", daemon=True).start()

    stop = threading.Event()

    def ticker():
        while not stop.wait(0.25):
            emu.tick()
    threading.Thread(target=ticker, name="ticker", daemon=True).start()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.watch_stdin:
        def watch():
            while sys.stdin.buffer.read(65536):
                pass
            stop.set()
        threading.Thread(target=watch, name="stdin", daemon=True).start()

    # Answering before READY: the first request is the health check.
    with urllib.request.urlopen(endpoint + "/_gangway/health", timeout=10) as resp:
        resp.read()
    print(f"READY {endpoint}", flush=True)
    while not stop.wait(1.0):
        pass
    server.shutdown()
    for metadata_server in list(emu.metadata_servers.values()):
        metadata_server.shutdown()
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--watch-stdin", action="store_true", help="exit when standard input reaches end of file")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    parser.add_argument("--discovery", help="compute.v1.json to use (default: the one google-api-python-client "
                                            "ships, from this python or target/gce-venv)")
    parser.add_argument("--op-polls", type=int, default=DEFAULT_SETTINGS["op_polls"],
                        help="GETs of an operation until it is DONE (0: DONE at once)")
    parser.add_argument("--op-auto-done-s", type=float, default=DEFAULT_SETTINGS["op_auto_done_s"],
                        help="an operation is DONE this many seconds after it started, polled or not "
                             "(negative: never)")
    parser.add_argument("--nat-ip-prefix", default=DEFAULT_SETTINGS["nat_ip_prefix"],
                        help="natIP prefix of new instances, e.g. 127.0.40. (one or two octets left)")
    parser.add_argument("--metadata-instance", help="instance the plain /computeMetadata/ paths describe")
    parser.add_argument("--no-check-responses", action="store_true",
                        help="do not check the emulator's own responses against the discovery schemas")
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="gce-emulator: %(message)s", stream=sys.stderr)
    path = gce_schema.find_discovery(args.discovery, extra_roots=[DEFAULT_VENV])
    if path is None:
        what = args.discovery or "googleapiclient/discovery_cache/documents/compute.v1.json"
        print(f"gce-emulator: FATAL: discovery document not found: {what}\n"
              "  run tests/emulators/gce/setup.sh (installs google-api-python-client into "
              "target/gce-venv) or pass --discovery PATH", file=sys.stderr)
        return 2
    schema = gce_schema.Discovery(path)
    log.info("discovery document %s (revision %s, %d methods)", path, schema.revision, len(schema.methods))
    return serve(args, schema)


if __name__ == "__main__":
    sys.exit(main())
