#!/usr/bin/env python3
"""EC2 emulator for gangway's AWS tests.

Runs moto's EC2 server in this process (werkzeug, threaded) behind a small
WSGI middleware that adds what the tests need and moto lacks:

* fault rules: make the next N matching EC2 requests fail with EC2's real
  error response (capacity, throttling, quotas, auth, ...);
* spot interruptions: make an instance look reclaimed by EC2;
* placement groups (Create/Describe/DeletePlacementGroup), which moto does not
  implement, and Placement.GroupName on RunInstances / DescribeInstances;
* DescribeInstanceTopology, which moto does not implement;
* ClientToken idempotency for RunInstances, which moto ignores;
* kill points for gangway's fault sweep: SIGKILL the client's processes as
  its N-th request arrives or returns (/_gangway/kill);
* machines (machines.py): instances of a scope get addresses where a real
  sshd listens, their key pair in its authorized_keys, and an IMDSv2-shaped
  metadata service each; spot interruptions with a notice there first
  (/_gangway/machines, /_gangway/interrupt with notice_seconds);
* GetConsoleOutput for instances of a scope given that sshd's host keys:
  a cloud-init boot log with EC2's fingerprints and keys blocks, so a
  client can pin the host key from the API;
* a record of the STS sessions asked for (GetSessionToken,
  GetFederationToken with its policy, AssumeRole with its role and
  policy) per access key (/_gangway/sts), since moto enforces no policy.

Usage:

    python server.py --host 127.0.0.1 --port 0 [--watch-stdin] [--verbose]
                     [--spot-notice-seconds 120]

Prints exactly one line `READY http://HOST:PORT` on stdout once the server
accepts requests (after one warm-up EC2 call, so the first real call is
fast), then serves until SIGTERM or SIGINT, or, with --watch-stdin, until its
standard input reaches end of file (so that a parent which keeps the write
end of a pipe open takes the server down with it when it exits).

The control API lives under /_gangway/ and is described in README.md next to
this file.
"""

import argparse
import base64
import fnmatch
import hashlib
import io
import json
import logging
import os
import re
import signal
import sys
import threading
import urllib.parse
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from xml.sax.saxutils import escape

from moto.core import DEFAULT_ACCOUNT_ID
from moto.ec2 import utils as ec2_utils
from moto.ec2.models import ec2_backends
from moto.ec2.models.instances import StateReason
from moto.iam.models import iam_backends
from machines import Machines
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    create_backend_app,
)
from werkzeug.serving import make_server

try:  # moto >= 5.2 normalizes header names with this handler; optional.
    from moto.moto_server.werkzeug_app import MotoRequestHandler
except ImportError:  # pragma: no cover - older moto
    MotoRequestHandler = None

HERE = os.path.dirname(os.path.abspath(__file__))
EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
DEFAULT_REGION = "us-east-1"

# HTTP status EC2 answers with, per error code. EC2 sends client errors with
# a 400-series status and server errors (capacity, internal, throttling) with
# a 500-series one. A fault rule without "status" takes it from here, and
# codes not listed get 400.
STATUS_BY_CODE = {
    # Capacity: EC2 lists these as server errors.
    "InsufficientInstanceCapacity": 500,
    "InsufficientCapacity": 500,
    "InsufficientHostCapacity": 500,
    "InsufficientCapacityOnHost": 500,
    "InsufficientAddressCapacity": 500,
    "InsufficientReservedInstanceCapacity": 500,
    "InternalError": 500,
    "InternalFailure": 500,
    # Throttling and outages.
    "RequestLimitExceeded": 503,
    "ServiceUnavailable": 503,
    "Unavailable": 503,
    # Credentials and permissions.
    "AuthFailure": 401,
    "UnauthorizedOperation": 403,
    "Blocked": 403,
    # Quotas, prices and the rest are client errors.
    "InstanceLimitExceeded": 400,
    "VcpuLimitExceeded": 400,
    "MaxSpotInstanceCountExceeded": 400,
    "SpotMaxPriceTooLow": 400,
    "Unsupported": 400,
    "InvalidParameterValue": 400,
    "InvalidParameterCombination": 400,
    "InsufficientFreeAddressesInSubnet": 400,
}

# Messages for rules that give none; close to what EC2 says.
DEFAULT_MESSAGES = {
    "InsufficientInstanceCapacity": "We currently do not have sufficient capacity in the Availability Zone you requested.",
    "RequestLimitExceeded": "Request limit exceeded.",
    "UnauthorizedOperation": "You are not authorized to perform this operation.",
    "AuthFailure": "AWS was not able to validate the provided access credentials",
    "InstanceLimitExceeded": "You have requested more instances than your current instance limit allows for the specified instance type.",
    "VcpuLimitExceeded": "You have requested more vCPU capacity than your current vCPU limit allows for the instance bucket that the specified instance type belongs to.",
    "MaxSpotInstanceCountExceeded": "Max spot instance count exceeded",
    "SpotMaxPriceTooLow": "Your Spot request price is lower than the minimum required Spot request fulfillment price.",
    "Unsupported": "The requested configuration is currently not supported.",
}

# Instance families for which EC2 answers DescribeInstanceTopology (the
# documented list); instances of other types are left out of the answer.
TOPOLOGY_FAMILIES = {
    "p3dn", "p4d", "p4de", "p5", "p5e", "p5en",
    "trn1", "trn1n", "trn2",
    "g6", "g6e",
    "hpc6a", "hpc6id", "hpc7a", "hpc7g",
}
# Synthetic topology: every instance of a region hangs off one L1 node; each
# L2 node serves a block of this many instances, each L3 node a pair.
TOPOLOGY_L2_BLOCK = 4
TOPOLOGY_L3_BLOCK = 2

PLACEMENT_STRATEGIES = ("cluster", "spread", "partition")

log = logging.getLogger("gangway-ec2-emulator")


class EmulatorError(Exception):
    """An EC2 error to answer with instead of calling moto."""

    def __init__(self, code, message, status=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or STATUS_BY_CODE.get(code, 400)


def ec2_error_body(code, message):
    """EC2's error document (the shape every EC2 query client parses)."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code>"
        f"<Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode("utf-8")


def ec2_response(action, inner):
    """A successful EC2 response document for `action` with `inner` XML."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<{action}Response xmlns="{EC2_NS}">'
        f"<requestId>{uuid.uuid4()}</requestId>{inner}</{action}Response>"
    ).encode("utf-8")


def el(name, value):
    """<name>value</name> with the value escaped; nothing for None."""
    if value is None:
        return ""
    return f"<{name}>{escape(str(value))}</{name}>"


def indexed(params, prefix):
    """Values of PREFIX.1, PREFIX.2, ... in index order."""
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)$")
    found = []
    for key, value in params.items():
        match = pattern.match(key)
        if match:
            found.append((int(match.group(1)), value))
    return [value for _, value in sorted(found)]


def parse_filters(params):
    """Filter.N.Name / Filter.N.Value.M as {name: [values]}."""
    filters = {}
    for key in params:
        match = re.match(r"Filter\.(\d+)\.Name$", key)
        if match:
            n = match.group(1)
            filters.setdefault(params[key], []).extend(
                indexed(params, f"Filter.{n}.Value")
            )
    return filters


def parse_tag_specifications(params, resource_type):
    """Tags from TagSpecification.N for `resource_type`, as {key: value}."""
    tags = {}
    for key in params:
        match = re.match(r"TagSpecification\.(\d+)\.ResourceType$", key)
        if match and params[key] == resource_type:
            n = match.group(1)
            for tkey in params:
                tmatch = re.match(rf"TagSpecification\.{n}\.Tag\.(\d+)\.Key$", tkey)
                if tmatch:
                    m = tmatch.group(1)
                    tags[params[tkey]] = params.get(
                        f"TagSpecification.{n}.Tag.{m}.Value", ""
                    )
    return tags


def filter_matches(value, patterns):
    """EC2 filter semantics: any pattern matches; * and ? are wildcards."""
    return value is not None and any(
        fnmatch.fnmatchcase(str(value), p) for p in patterns
    )


PRICE_LIST_NOTE = ("the EC2 emulator's own on-demand prices: $0.05 per vCPU-hour plus "
                   "$3.00 per GPU-hour, Windows twice that; not AWS's")


def price_list_products(instance_type=None):
    """Price List API product documents (aws_v1) for `instance_type` (or
    every type moto knows) in every EC2 region."""
    from moto.ec2.models.instance_types import INSTANCE_TYPES
    import boto3
    regions = boto3.session.Session().get_available_regions("ec2")
    types = [instance_type] if instance_type else sorted(INSTANCE_TYPES)
    docs = []
    for t in types:
        info = INSTANCE_TYPES.get(t)
        if not info:
            continue
        vcpus = info.get("VCpuInfo", {}).get("DefaultVCpus", 1)
        gpus = sum(g.get("Count", 0) for g in info.get("GpuInfo", {}).get("Gpus", []))
        linux = round(0.05 * vcpus + 3.0 * gpus, 4)
        for region in regions:
            for os_name, price in (("Linux", linux), ("Windows", round(2 * linux, 4))):
                sku = hashlib.sha1(f"{t}/{region}/{os_name}".encode()).hexdigest()[:16].upper()
                docs.append({
                    "product": {"productFamily": "Compute Instance", "sku": sku, "attributes": {
                        "instanceType": t, "regionCode": region, "operatingSystem": os_name,
                        "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
                        "vcpu": str(vcpus), "servicecode": "AmazonEC2"}},
                    "serviceCode": "AmazonEC2",
                    "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
                        "offerTermCode": "JRTCKXETXF", "sku": sku,
                        "effectiveDate": "2026-11-01T00:00:00Z",
                        "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                            "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7", "unit": "Hrs",
                            "description": f"${price} per On Demand {os_name} {t} Instance Hour",
                            "pricePerUnit": {"USD": f"{price:.10f}"}}}}}},
                    "version": "20261101", "publicationDate": "2026-11-01T00:00:00Z",
                })
    return docs


def region_from_authorization(header):
    """The region of a SigV4 credential scope (Credential=AK/DATE/REGION/SVC/...)."""
    match = re.search(r"Credential=[^/,\s]+/\d+/([^/,\s]+)/", header or "")
    return match.group(1) if match else None


class FaultRules:
    """Ordered fault rules, matched first to last; thread safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rules = []
        self._next_id = 1

    def add(self, spec):
        if not isinstance(spec, dict):
            raise ValueError("a fault rule is a JSON object")
        action = spec.get("action")
        code = spec.get("code")
        if not isinstance(action, str) or not action:
            raise ValueError('"action" (an EC2 action name) is required')
        if not isinstance(code, str) or not code:
            raise ValueError('"code" (an EC2 error code) is required')
        contains = spec.get("contains", [])
        if isinstance(contains, str):
            contains = [contains]
        if not isinstance(contains, list) or not all(
            isinstance(c, str) for c in contains
        ):
            raise ValueError('"contains" is a list of strings')
        # Exact matches on named parameters, e.g.
        # {"NetworkInterface.2.InterfaceType": "efa"}: for checks that a
        # substring of some value cannot make.
        params = spec.get("params", {})
        if not isinstance(params, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in params.items()
        ):
            raise ValueError('"params" maps parameter names to exact values')
        times = spec.get("times", 1)
        if not isinstance(times, int) or isinstance(times, bool) or times == 0 or times < -1:
            raise ValueError('"times" is a positive count, or -1 for always')
        status = spec.get("status", STATUS_BY_CODE.get(code, 400))
        if not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError('"status" is an HTTP error status (400-599)')
        region = spec.get("region")
        if region is not None and not isinstance(region, str):
            raise ValueError('"region" is a region name')
        message = spec.get("message") or DEFAULT_MESSAGES.get(code, code)
        with self._lock:
            rule = {
                "id": self._next_id,
                "action": action,
                "contains": contains,
                "params": params,
                "region": region,
                "code": code,
                "message": message,
                "status": status,
                "times": times,
                "remaining": times,
                "fired": 0,
            }
            self._next_id += 1
            self._rules.append(rule)
            return dict(rule)

    def take(self, action, region, request):
        """The first live rule matching this request (a dict of its
        parameters), counted as fired."""
        values = list(request.values())
        with self._lock:
            for rule in self._rules:
                if rule["remaining"] == 0 or rule["action"] != action:
                    continue
                if rule["region"] and rule["region"] != region:
                    continue
                if not all(any(c in v for v in values) for c in rule["contains"]):
                    continue
                if any(request.get(k) != v for k, v in rule["params"].items()):
                    continue
                if rule["remaining"] > 0:
                    rule["remaining"] -= 1
                rule["fired"] += 1
                return dict(rule)
        return None

    def list(self):
        with self._lock:
            return [dict(rule) for rule in self._rules]

    def clear(self, rule_id=None):
        with self._lock:
            before = len(self._rules)
            if rule_id is None:
                self._rules = []
            else:
                self._rules = [r for r in self._rules if r["id"] != rule_id]
            return before - len(self._rules)


class Emulator:
    """The WSGI middleware in front of moto."""

    def __init__(self, moto_app, account_id=DEFAULT_ACCOUNT_ID, notice_seconds=120.0):
        self.moto_app = moto_app
        self.account_id = account_id
        self.faults = FaultRules()
        self.machines = Machines(self, notice_seconds)
        self._lock = threading.RLock()
        # region -> group name -> placement group record
        self.placement_groups = {}
        # instance id -> placement group id, recorded at RunInstances
        self.instance_group = {}
        # (region, client token) -> (request fingerprint, response body)
        self.client_tokens = {}
        self._run_lock = threading.Lock()
        # access key id -> GetSessionToken calls signed with it
        self.sts_sessions = {}
        # GetFederationToken's (name, policy, duration) per scope: the
        # session policies gangway asked for (moto does not enforce them).
        self.sts_policies = {}
        # AssumeRole's (role, session name, policy, duration) per scope,
        # likewise.
        self.sts_roles = {}
        self.own_actions = {
            "CreatePlacementGroup": self.create_placement_group,
            "DescribePlacementGroups": self.describe_placement_groups,
            "DeletePlacementGroup": self.delete_placement_group,
            "DescribeInstanceTopology": self.describe_instance_topology,
        }

    # ----- plumbing -------------------------------------------------------

    def backend(self, region):
        return ec2_backends[self.account_id][region]

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path.startswith("/_gangway/"):
            return self.control(environ, start_response)
        if path.startswith("/moto-api/reset"):
            self.reset()
            return self.moto_app(environ, start_response)

        body = self._read_body(environ)
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target.startswith("AWSPriceListService."):
            scope = access_key_from_authorization(environ.get("HTTP_AUTHORIZATION")) or ""
            return self.price_list(target.split(".", 1)[1], body, start_response, scope)
        params = self._params(environ, body)
        action = params.get("Action")
        if not action:
            return self.moto_app(environ, start_response)

        region = region_from_authorization(environ.get("HTTP_AUTHORIZATION"))
        if region is None:
            # Unsigned request (a hand-made test call): moto would route it to
            # S3, so sign it for EC2 in the default region.
            region = DEFAULT_REGION
            environ["HTTP_AUTHORIZATION"] = (
                f"AWS4-HMAC-SHA256 Credential=testing/20000101/{region}/ec2/aws4_request, "
                "SignedHeaders=host, Signature=0"
            )

        if action in ("GetSessionToken", "GetFederationToken"):
            scope = access_key_from_authorization(environ.get("HTTP_AUTHORIZATION"))
            with self._lock:
                self.sts_sessions[scope] = self.sts_sessions.get(scope, 0) + 1
                if action == "GetFederationToken":
                    self.sts_policies.setdefault(scope, []).append(
                        {"name": params.get("Name"), "policy": params.get("Policy"),
                         "duration": params.get("DurationSeconds")})
            return self.session_token(environ, start_response)
        if action == "AssumeRole":
            # Recorded, then moto's answer (it takes any role ARN, whether
            # IAM has the role or not, and makes keys of their own).
            scope = access_key_from_authorization(environ.get("HTTP_AUTHORIZATION"))
            with self._lock:
                self.sts_roles.setdefault(scope, []).append(
                    {"role_arn": params.get("RoleArn"), "session_name": params.get("RoleSessionName"),
                     "policy": params.get("Policy"), "duration": params.get("DurationSeconds")})
            return self.moto_app(environ, start_response)
        try:
            rule = self.faults.take(action, region, params)
            if rule:
                log.info("fault rule %s: %s -> %s", rule["id"], action, rule["code"])
                raise EmulatorError(rule["code"], rule["message"], rule["status"])
            handler = self.own_actions.get(action)
            if handler:
                return self._reply(start_response, 200, handler(region, params))
            if action == "RunInstances":
                scope = access_key_from_authorization(environ.get("HTTP_AUTHORIZATION"))
                return self.run_instances(environ, start_response, region, params, scope)
            if action == "TerminateInstances":
                return self.terminate_instances(environ, start_response, region, params)
            if action == "StartInstances":
                return self.start_instances(environ, start_response, region, params)
            if action == "GetConsoleOutput":
                body = self.console_output(region, params)
                if body is not None:
                    return self._reply(start_response, 200, body)
            if action in ("CreateTags", "DeleteTags"):
                ids = indexed(params, "ResourceId")
                if ids and all(i.startswith("pg-") for i in ids):
                    body = self.tag_placement_groups(action, region, ids, params)
                    return self._reply(start_response, 200, body)
        except EmulatorError as err:
            return self._reply(
                start_response, err.status, ec2_error_body(err.code, err.message)
            )
        return self.moto_app(environ, start_response)

    @staticmethod
    def _read_body(environ):
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        body = environ["wsgi.input"].read(length) if length > 0 else b""
        # Put it back for moto, which reads it again.
        environ["wsgi.input"] = io.BytesIO(body)
        return body

    @staticmethod
    def _params(environ, body):
        """Query string and form body parameters, decoded, as one dict."""
        pairs = urllib.parse.parse_qsl(
            environ.get("QUERY_STRING", ""), keep_blank_values=True
        )
        ctype = environ.get("CONTENT_TYPE", "")
        if body and (ctype.startswith("application/x-www-form-urlencoded") or not ctype):
            pairs += urllib.parse.parse_qsl(
                body.decode("utf-8", "replace"), keep_blank_values=True
            )
        return dict(pairs)

    @staticmethod
    def _reply(start_response, status, body, ctype="text/xml;charset=UTF-8"):
        reasons = {200: "OK", 201: "Created", 400: "Bad Request", 401: "Unauthorized",
                   403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
                   500: "Internal Server Error", 503: "Service Unavailable"}
        start_response(
            f"{status} {reasons.get(status, 'Error')}",
            [("Content-Type", ctype), ("Content-Length", str(len(body)))],
        )
        return [body]

    def _call_moto(self, environ):
        """Runs moto and returns (status line, headers, body bytes)."""
        captured = {}

        def start_response(status, headers, exc_info=None):
            captured["status"] = status
            captured["headers"] = headers
            return lambda data: None

        result = self.moto_app(environ, start_response)
        try:
            body = b"".join(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        return captured["status"], captured["headers"], body

    def price_list(self, operation, body, start_response, scope=""):
        """The Price List Query API's GetProducts (JSON 1.1), which moto
        lacks: EC2 instance products of every type moto knows in every EC2
        region, Linux and Windows, each with one on-demand hourly term, in
        the documented response shape (PriceList: JSON documents as
        strings; NextToken paging). The prices are this emulator's own
        figures (PRICE_LIST_NOTE), not AWS's. Fault rules apply to
        "GetProducts" as to EC2 actions (region us-east-1), matched against
        the caller's access key id (`contains`), so parallel tests each
        fail only their own calls."""
        def reply(status, doc):
            data = json.dumps(doc).encode()
            start_response(f"{status} {'OK' if status == 200 else 'Error'}",
                           [("Content-Type", "application/x-amz-json-1.1"),
                            ("Content-Length", str(len(data)))])
            return [data]
        if operation != "GetProducts":
            return reply(400, {"__type": "InvalidParameterException",
                               "message": f"{operation} is not served by the emulator"})
        rule = self.faults.take("GetProducts", "us-east-1", {"AccessKeyId": scope})
        if rule:
            return reply(rule["status"], {"__type": rule["code"], "message": rule["message"]})
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            return reply(400, {"__type": "InvalidParameterException", "message": "not JSON"})
        if req.get("ServiceCode") != "AmazonEC2":
            return reply(400, {"__type": "InvalidParameterException",
                               "message": "Input for ServiceCode is invalid"})
        want = {}
        for f in req.get("Filters") or []:
            if f.get("Type") != "TERM_MATCH":
                return reply(400, {"__type": "InvalidParameterException",
                                   "message": f"filter type {f.get('Type')} is not TERM_MATCH"})
            want[f["Field"]] = f["Value"]
        docs = [d for d in price_list_products(want.get("instanceType"))
                if all(d["product"]["attributes"].get(k) == v for k, v in want.items())]
        size = min(int(req.get("MaxResults") or 100), 100)
        start = int(req.get("NextToken") or 0)
        page = docs[start:start + size]
        out = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(d) for d in page]}
        if start + size < len(docs):
            out["NextToken"] = str(start + size)
        return reply(200, out)

    def session_token(self, environ, start_response):
        """STS GetSessionToken or GetFederationToken: moto's answer, with an access key id of its
        own for each session, as STS gives (moto repeats one example key),
        so that tests can tell renewed credentials from the first ones."""
        status, headers, body = self._call_moto(environ)
        key = "ASIAGW" + uuid.uuid4().hex[:14].upper()
        body = re.sub(rb"<AccessKeyId>[^<]*</AccessKeyId>",
                      f"<AccessKeyId>{key}</AccessKeyId>".encode(), body)
        headers = [(k, str(len(body)) if k.lower() == "content-length" else v)
                   for k, v in headers]
        start_response(status, headers)
        return [body]

    def instance_profile(self, region, instance_id):
        """The IAM instance profile an instance was launched with (moto's
        InstanceProfile), or None."""
        association = self.backend(region).iam_instance_profile_associations.get(instance_id)
        return association.iam_instance_profile if association is not None else None

    def _check_instance_profile(self, params):
        """EC2's answer to a RunInstances naming an instance profile IAM
        does not have (moto would answer IAM's NoSuchEntity, with 404)."""
        name = params.get("IamInstanceProfile.Name")
        arn = params.get("IamInstanceProfile.Arn")
        if not name and not arn:
            return
        iam = iam_backends[self.account_id]["aws"]
        try:
            if arn:
                iam.get_instance_profile_by_arn(arn)
            else:
                iam.get_instance_profile(name)
        except Exception:
            which = "arn" if arn else "name"
            raise EmulatorError(
                "InvalidParameterValue",
                f"Value ({arn or name}) for parameter iamInstanceProfile.{which} is invalid. "
                f"Invalid IAM Instance Profile {which}",
            ) from None

    def _associate_profile(self, region, params, ids):
        """moto associates a RunInstances' instance profile with its first
        instance only; EC2 gives it to every one."""
        name = params.get("IamInstanceProfile.Name")
        arn = params.get("IamInstanceProfile.Arn")
        if not name and not arn:
            return
        backend = self.backend(region)
        for instance_id in ids:
            if instance_id not in backend.iam_instance_profile_associations:
                backend.associate_iam_instance_profile(
                    instance_id=instance_id,
                    iam_instance_profile_name=name,
                    iam_instance_profile_arn=arn,
                )

    def reset(self):
        with self._lock:
            self.sts_sessions.clear()
            self.sts_policies.clear()
            self.sts_roles.clear()
            self.placement_groups.clear()
            self.instance_group.clear()
            self.client_tokens.clear()
        self.faults.clear()
        self.machines.reset()

    # ----- control API ----------------------------------------------------

    def control(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        query = dict(urllib.parse.parse_qsl(environ.get("QUERY_STRING", "")))

        def reply(status, obj):
            body = (json.dumps(obj, indent=1) + "\n").encode("utf-8")
            return self._reply(start_response, status, body, "application/json")

        try:
            if path == "/_gangway/health" and method == "GET":
                return self._reply(start_response, 200, b"ok", "text/plain")
            if path == "/_gangway/faults":
                if method == "GET":
                    return reply(200, {"rules": self.faults.list()})
                if method == "DELETE":
                    rule_id = int(query["id"]) if "id" in query else None
                    return reply(200, {"removed": self.faults.clear(rule_id)})
                if method == "POST":
                    spec = json.loads(self._read_body(environ) or b"null")
                    return reply(201, self.faults.add(spec))
                return reply(405, {"error": "use GET, POST or DELETE"})
            if path == "/_gangway/sts" and method == "GET":
                scope = query.get("scope", "")
                with self._lock:
                    n = self.sts_sessions.get(scope, 0)
                    policies = list(self.sts_policies.get(scope, []))
                    roles = list(self.sts_roles.get(scope, []))
                return reply(200, {"scope": scope, "GetSessionToken": n, "sessions": n,
                                   "federation": policies, "assume_role": roles})
            if path == "/_gangway/interrupt":
                if method != "POST":
                    return reply(405, {"error": "use POST"})
                spec = json.loads(self._read_body(environ) or b"null")
                return reply(200, self.interrupt(spec))
            if path == "/_gangway/machines":
                if method == "POST":
                    spec = json.loads(self._read_body(environ) or b"null")
                    try:
                        return reply(200, self.machines.configure(spec))
                    except OSError as err:  # an address that cannot be bound
                        return reply(409, {"error": f"cannot serve metadata there: {err}"})
                if method == "GET":
                    return reply(200, self.machines.view(query.get("scope", "")))
                if method == "DELETE":
                    return reply(200, {"removed": self.machines.remove(query.get("scope", ""))})
                return reply(405, {"error": "use GET, POST or DELETE"})
            return reply(404, {"error": f"no control path {path}"})
        except LookupError as err:
            return reply(404, {"error": str(err).strip("'\"")})
        except (ValueError, TypeError) as err:
            return reply(400, {"error": str(err)})

    def interrupt(self, spec):
        """Makes an instance look like EC2 reclaimed it (spot interruption)."""
        if not isinstance(spec, dict) or not isinstance(spec.get("instance_id"), str):
            raise ValueError('"instance_id" is required')
        region = spec.get("region") or DEFAULT_REGION
        state = spec.get("state", "terminated")
        if state not in ("terminated", "stopped"):
            raise ValueError('"state" is "terminated" or "stopped"')
        instance_id = spec["instance_id"]
        seconds = spec.get("notice_seconds")
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0
        ):
            raise ValueError('"notice_seconds" is a number of seconds, 0 or more')
        if spec.get("notice") or seconds is not None:
            with self._lock:
                if self.backend(region).get_instance_by_id(instance_id) is None:
                    raise LookupError(f"no instance {instance_id} in {region}")
            plain = {k: v for k, v in spec.items() if k not in ("notice", "notice_seconds")}
            action = self.machines.notice(
                region, instance_id, seconds, state, lambda: self.interrupt(plain)
            )
            return {"instance_id": instance_id, "region": region, "state": "running",
                    "notice": action}
        with self._lock:
            instance = self.backend(region).get_instance_by_id(instance_id)
            if instance is None:
                raise LookupError(f"no instance {instance_id} in {region}")
            now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S GMT")
            if state == "terminated":
                instance.terminate()  # moto's teardown: NICs, volumes, state 48
                code, text = "Server.SpotInstanceTermination", "Spot instance termination"
            else:
                instance.stop()  # state 80
                code, text = "Server.SpotInstanceShutdown", "Spot instance shutdown"
            instance.state_reason = StateReason(f"{code}: {text}", code)
            instance._reason = f"Service initiated ({now})"
            return {
                "instance_id": instance_id,
                "region": region,
                "state": instance.state,
                "state_code": instance.state_code,
                "state_reason": code,
            }

    def terminate_instances(self, environ, start_response, region, params):
        """moto's TerminateInstances, except that an instance already
        terminated stays as it was (EC2 changes nothing there; moto would
        overwrite a spot reclaim's state reason with a user's)."""
        backend = self.backend(region)
        kept = {}
        with self._lock:
            for instance_id in indexed(params, "InstanceId"):
                instance = backend.get_instance_by_id(instance_id)
                if instance is not None and instance.state == "terminated":
                    kept[instance_id] = (instance.state_reason, instance._reason)
        status, headers, body = self._call_moto(environ)
        with self._lock:
            for instance_id, (reason, text) in kept.items():
                instance = backend.get_instance_by_id(instance_id)
                if instance is not None:
                    instance.state_reason, instance._reason = reason, text
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(body))))
        start_response(status, headers)
        return [body]

    def start_instances(self, environ, start_response, region, params):
        """moto's StartInstances; an instance on a machine comes back at
        that machine's addresses (moto gives a started instance a new
        public address, as EC2 does, where no sshd listens)."""
        status, headers, body = self._call_moto(environ)
        if status.startswith("200"):
            self.machines.restore(region, indexed(params, "InstanceId"))
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(body))))
        start_response(status, headers)
        return [body]

    def console_output(self, region, params):
        """GetConsoleOutput of an instance whose scope has host keys (see
        Machines.console_output): EC2's answer, the output base64 and left
        out while there is none yet. None for every other instance, which
        moto answers (its fixed sample text; InvalidInstanceID.NotFound for
        an instance it does not have)."""
        instance_id = params.get("InstanceId", "")
        latest = params.get("Latest")
        if latest is not None and latest.lower() not in ("true", "false"):
            raise EmulatorError("InvalidParameterValue",
                                f"Invalid value '{latest}' for Latest. It must be true or false.")
        found = self.machines.console_output(region, instance_id)
        if found is None:
            return None
        stamp, text = found
        output = None if text is None else base64.b64encode(text.encode()).decode()
        return ec2_response("GetConsoleOutput",
                            el("instanceId", instance_id) + el("timestamp", stamp) + el("output", output))

    # ----- RunInstances additions -----------------------------------------

    def run_instances(self, environ, start_response, region, params, scope=None):
        """Placement groups, ClientToken idempotency and machines (addresses,
        key, metadata service) around moto's RunInstances."""
        group = self._placement_group_of(region, params)
        self._check_instance_profile(params)
        if scope:
            try:
                wanted = int(params.get("MinCount") or 1)
            except ValueError:
                wanted = 1
            short = self.machines.shortfall(scope, wanted)
            if short:
                raise EmulatorError("InsufficientInstanceCapacity", short)
        token = params.get("ClientToken")
        if token:
            # EC2 compares a reused token's request parameters with the first's.
            fingerprint = hashlib.sha256(
                json.dumps(sorted(params.items())).encode("utf-8")
            ).hexdigest()
            with self._run_lock:
                seen = self.client_tokens.get((region, token))
                if seen and seen[0] != fingerprint:
                    raise EmulatorError(
                        "IdempotentParameterMismatch",
                        f"Arguments on this idempotent request are inconsistent with arguments used in previous request(s) with client token '{token}'.",
                    )
                if seen:
                    return self._reply(start_response, 200, seen[1])
                status, headers, body = self._run_in_moto(environ, region, group, scope, params)
                if status.startswith("200"):
                    self.client_tokens[(region, token)] = (fingerprint, body)
        else:
            status, headers, body = self._run_in_moto(environ, region, group, scope, params)
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(body))))
        start_response(status, headers)
        return [body]

    def _placement_group_of(self, region, params):
        name = params.get("Placement.GroupName")
        group_id = params.get("Placement.GroupId")
        if not name and not group_id:
            return None
        with self._lock:
            for group in self.placement_groups.get(region, {}).values():
                if group["name"] == name or group["id"] == group_id:
                    return group
        raise EmulatorError(
            "InvalidPlacementGroup.Unknown",
            f"The Placement Group '{name or group_id}' is unknown.",
        )

    def _run_in_moto(self, environ, region, group, scope=None, params=None):
        status, headers, body = self._call_moto(environ)
        if not status.startswith("200"):
            return status, headers, body
        ids = [
            e.text for e in ET.fromstring(body).iter()
            if e.tag.rsplit("}", 1)[-1] == "instanceId"
        ]
        self._associate_profile(region, params or {}, ids)
        if scope:
            self.machines.place(scope, region, ids)
        if group is None:
            return status, headers, body
        # moto drops Placement.GroupName: record it on its instances so that
        # DescribeInstances (and its placement-group-name filter) shows it,
        # and put it into this response too.
        with self._lock:
            backend = self.backend(region)
            for instance_id in ids:
                instance = backend.get_instance_by_id(instance_id)
                if instance is not None:
                    instance.placement.group_name = group["name"]
                self.instance_group[instance_id] = group["id"]
        filled = f"<placement><groupName>{escape(group['name'])}</groupName>".encode()
        body = body.replace(b"<placement><groupName/>", filled)
        body = body.replace(b"<placement><groupName></groupName>", filled)
        return status, headers, body

    # ----- placement groups -----------------------------------------------

    @staticmethod
    def _group_xml(group):
        tags = "".join(
            f"<item>{el('key', k)}{el('value', v)}</item>" for k, v in group["tags"].items()
        )
        return (
            el("groupName", group["name"])
            + el("state", group["state"])
            + el("strategy", group["strategy"])
            + el("partitionCount", group.get("partition_count"))
            + el("groupId", group["id"])
            + f"<tagSet>{tags}</tagSet>"
            + el("groupArn", group["arn"])
            + el("spreadLevel", group.get("spread_level"))
        )

    def create_placement_group(self, region, params):
        name = params.get("GroupName")
        strategy = params.get("Strategy", "cluster")
        if not name:
            raise EmulatorError("MissingParameter", "The request must contain the parameter groupName")
        if strategy not in PLACEMENT_STRATEGIES:
            raise EmulatorError(
                "InvalidParameterValue",
                f"Value ({strategy}) for parameter strategy is invalid. "
                f"Valid values are {', '.join(PLACEMENT_STRATEGIES)}.",
            )
        group_id = "pg-" + uuid.uuid4().hex[:17]
        group = {
            "name": name,
            "id": group_id,
            "strategy": strategy,
            "state": "available",
            "tags": parse_tag_specifications(params, "placement-group"),
            "arn": f"arn:aws:ec2:{region}:{self.account_id}:placement-group/{name}",
        }
        if strategy == "partition":
            group["partition_count"] = int(params.get("PartitionCount", "2"))
        if strategy == "spread":
            group["spread_level"] = params.get("SpreadLevel", "rack")
        with self._lock:
            groups = self.placement_groups.setdefault(region, {})
            if name in groups:
                raise EmulatorError(
                    "InvalidPlacementGroup.Duplicate",
                    f"The placement group '{name}' already exists.",
                )
            groups[name] = group
        return ec2_response(
            "CreatePlacementGroup", f"<placementGroup>{self._group_xml(group)}</placementGroup>"
        )

    def describe_placement_groups(self, region, params):
        names = indexed(params, "GroupName")
        ids = indexed(params, "GroupId")
        filters = parse_filters(params)
        with self._lock:
            groups = list(self.placement_groups.get(region, {}).values())
        for wanted, key in ((names, "name"), (ids, "id")):
            known = {g[key] for g in groups}
            for value in wanted:
                if value not in known:
                    raise EmulatorError(
                        "InvalidPlacementGroup.Unknown",
                        f"The Placement Group '{value}' is unknown.",
                    )
        if names:
            groups = [g for g in groups if g["name"] in names]
        if ids:
            groups = [g for g in groups if g["id"] in ids]
        attribute = {"group-name": "name", "group-id": "id", "state": "state",
                     "strategy": "strategy", "spread-level": "spread_level"}
        for fname, values in filters.items():
            if fname in attribute:
                groups = [g for g in groups if filter_matches(g.get(attribute[fname]), values)]
            elif fname.startswith("tag:"):
                key = fname[4:]
                groups = [g for g in groups if filter_matches(g["tags"].get(key), values)]
            elif fname == "tag-key":
                groups = [g for g in groups if any(filter_matches(k, values) for k in g["tags"])]
            else:
                raise EmulatorError("InvalidParameterValue", f"The filter '{fname}' is invalid")
        items = "".join(f"<item>{self._group_xml(g)}</item>" for g in groups)
        return ec2_response("DescribePlacementGroups", f"<placementGroupSet>{items}</placementGroupSet>")

    def delete_placement_group(self, region, params):
        name = params.get("GroupName")
        with self._lock:
            group = self.placement_groups.get(region, {}).get(name)
            if group is None:
                raise EmulatorError(
                    "InvalidPlacementGroup.Unknown",
                    f"The Placement Group '{name}' is unknown.",
                )
            for instance in self.backend(region).all_instances():
                if (
                    self.instance_group.get(instance.id) == group["id"]
                    and instance.state != "terminated"
                ):
                    raise EmulatorError(
                        "InvalidPlacementGroup.InUse",
                        f"The placement group '{name}' is in use and may not be deleted.",
                    )
            del self.placement_groups[region][name]
        return ec2_response("DeletePlacementGroup", "<return>true</return>")

    def tag_placement_groups(self, action, region, ids, params):
        """CreateTags / DeleteTags on placement groups only (moto refuses pg- ids)."""
        tags = []
        for key in params:
            match = re.match(r"Tag\.(\d+)\.Key$", key)
            if match:
                tags.append((params[key], params.get(f"Tag.{match.group(1)}.Value")))
        with self._lock:
            by_id = {g["id"]: g for g in self.placement_groups.get(region, {}).values()}
            for group_id in ids:
                if group_id not in by_id:
                    raise EmulatorError("InvalidID", f"The ID '{group_id}' is not valid")
            for group_id in ids:
                group_tags = by_id[group_id]["tags"]
                if action == "CreateTags":
                    group_tags.update((k, v or "") for k, v in tags)
                elif not tags:
                    group_tags.clear()
                else:
                    for k, v in tags:
                        if k in group_tags and (v is None or group_tags[k] == v):
                            del group_tags[k]
        return ec2_response(action, "<return>true</return>")

    # ----- DescribeInstanceTopology ---------------------------------------

    def describe_instance_topology(self, region, params):
        """Synthetic, deterministic three-layer topology.

        Instances are grouped into launch cohorts: the instances launched into
        one placement group (by its group id), or else the instances of one
        reservation (one RunInstances call). Within a cohort, instances are
        ordered by launch: reservations in the order they were made, then by
        AMI launch index; terminated instances keep their place, so positions
        never shift. Position p of cohort C in region R hangs off
        L1 = node(R), L2 = node(R, C, p // 4), L3 = node(R, C, p // 2): a
        4-node cluster gets one L2 and two L3s (nodes 1+2, nodes 3+4).
        """
        wanted = set(indexed(params, "InstanceId"))
        groups = set(indexed(params, "GroupName"))
        filters = parse_filters(params)
        backend = self.backend(region)
        zone_ids = {z.name: z.zone_id for z in backend.zones.get(region, [])}

        def node(*key):
            digest = hashlib.sha256("|".join(map(str, key)).encode()).hexdigest()
            return "nn-" + digest[:17]

        items = []
        with self._lock:
            positions = {}
            cohorts = {}
            for reservation in list(backend.reservations.values()):
                for instance in sorted(reservation.instances, key=lambda i: i.ami_launch_index):
                    cohort = self.instance_group.get(instance.id) or reservation.id
                    positions[instance.id] = (cohort, cohorts.get(cohort, 0))
                    cohorts[cohort] = cohorts.get(cohort, 0) + 1
            for reservation in list(backend.reservations.values()):
                for instance in reservation.instances:
                    if wanted and instance.id not in wanted:
                        continue
                    if instance.state != "running":
                        continue
                    family = instance.instance_type.split(".", 1)[0]
                    if family not in TOPOLOGY_FAMILIES:
                        continue
                    group_name = instance.placement.group_name or None
                    if groups and group_name not in groups:
                        continue
                    zone = instance.placement.zone
                    fields = {"availability-zone": zone, "zone-id": zone_ids.get(zone),
                              "instance-type": instance.instance_type}
                    if any(not filter_matches(fields.get(f), v) for f, v in filters.items()):
                        continue
                    cohort, pos = positions[instance.id]
                    nodes = [
                        node("L1", region),
                        node("L2", region, cohort, pos // TOPOLOGY_L2_BLOCK),
                        node("L3", region, cohort, pos // TOPOLOGY_L3_BLOCK),
                    ]
                    items.append(
                        "<item>"
                        + el("instanceId", instance.id)
                        + el("instanceType", instance.instance_type)
                        + el("groupName", group_name)
                        + "<networkNodeSet>"
                        + "".join(el("item", n) for n in nodes)
                        + "</networkNodeSet>"
                        + el("availabilityZone", zone)
                        + el("zoneId", zone_ids.get(zone))
                        + "</item>"
                    )
        return ec2_response("DescribeInstanceTopology", f"<instanceSet>{''.join(items)}</instanceSet>")


# ----- kill points (the fault sweep) ----------------------------------------

# The kill points' process handling is shared with the other emulator.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from killpoints import kill_marked  # noqa: E402

def access_key_from_authorization(header):
    """The access key id of a SigV4 credential (Credential=AKID/DATE/...)."""
    match = re.search(r"Credential=([^/,\s]+)/", header or "")
    return match.group(1) if match else None


class KillPoints:
    """Exact kill points for gangway's fault sweep, per scope (the SigV4
    access key id: parallel tests each use their own). Once a scope is
    armed, its requests are numbered 1, 2, ...; request k's arrival is
    kill point 2k-1 and its return (the work done, the answer not yet
    sent) kill point 2k. At point `at` (0: never, only count) every
    process whose environment has the entry `marker` is SIGKILLed, once."""

    def __init__(self):
        self._lock = threading.Lock()
        self._scopes = {}

    def arm(self, spec):
        if not isinstance(spec, dict):
            raise ValueError("a kill spec is a JSON object")
        unknown = set(spec) - {"scope", "at", "marker"}
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}; known: at, marker, scope")
        scope, at, marker = spec.get("scope"), spec.get("at", 0), spec.get("marker", "")
        if not isinstance(scope, str) or not scope:
            raise ValueError('"scope" (the access key id of the requests to count) is required')
        if not isinstance(at, int) or isinstance(at, bool) or at < 0:
            raise ValueError('"at" is a kill point (1, 2, ...), or 0 to count only')
        if not isinstance(marker, str) or (at > 0 and "=" not in marker):
            raise ValueError('"marker" is an environment entry KEY=VALUE of the processes to kill')
        with self._lock:
            self._scopes[scope] = {"scope": scope, "at": at, "marker": marker,
                                   "requests": 0, "fired": None}
            return self._view(scope)

    def _view(self, scope):
        state = dict(self._scopes[scope])
        state["points"] = 2 * state["requests"]
        return state

    def view(self, scope):
        with self._lock:
            if scope not in self._scopes:
                raise LookupError(f"scope {scope!r} is not armed")
            return self._view(scope)

    def disarm(self, scope=None):
        with self._lock:
            if scope is None:
                removed = len(self._scopes)
                self._scopes.clear()
                return removed
            return 1 if self._scopes.pop(scope, None) else 0

    def arrive(self, scope):
        """Numbers a request of `scope`: (k, whether point 2k-1 fires), or
        None when the scope is not armed."""
        with self._lock:
            state = self._scopes.get(scope)
            if state is None:
                return None
            state["requests"] += 1
            k = state["requests"]
            return k, self._take(state, 2 * k - 1)

    def returning(self, scope, k):
        """Whether request k's return (point 2k) fires."""
        with self._lock:
            state = self._scopes.get(scope)
            return state is not None and self._take(state, 2 * k)

    @staticmethod
    def _take(state, point):
        if state["fired"] is None and state["at"] == point:
            state["fired"] = {"point": point}
            return True
        return False

    def kill(self, scope, request, when, what):
        """Kills the scope's marked processes; records what and whom."""
        with self._lock:
            state = self._scopes[scope]
            state["fired"].update({"request": request, "when": when, "action": what})
        # `killed` comes last: readers wait for it (the client dies first).
        killed = kill_marked(state["marker"])
        log.info("kill point of %s: %s of request %s (%s): killed %s", scope, when, request, what, killed)
        with self._lock:
            state["fired"]["killed"] = killed


class KillPointLayer:
    """WSGI layer in front of the emulator: counts each scope's AWS
    requests and kills at the armed point (see KillPoints); serves
    /_gangway/kill."""

    def __init__(self, app):
        self.app = app
        self.points = KillPoints()
        # Each scope's requests by action, for /_gangway/calls.
        self.calls = {}
        self.calls_lock = threading.Lock()

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/_gangway/kill":
            return self.control(environ, start_response)
        if path == "/_gangway/calls":
            return self.count_view(environ, start_response)
        if path.startswith("/_gangway/") or path.startswith("/moto-api/"):
            return self.app(environ, start_response)
        scope = access_key_from_authorization(environ.get("HTTP_AUTHORIZATION"))
        what = None
        if scope:
            what = Emulator._params(environ, Emulator._read_body(environ)).get("Action") or path
            with self.calls_lock:
                by_action = self.calls.setdefault(scope, {})
                by_action[what] = by_action.get(what, 0) + 1
        counted = self.points.arrive(scope) if scope else None
        if counted is None:
            return self.app(environ, start_response)
        k, now = counted
        if now:
            # Killed as the request arrived: it never reaches EC2.
            self.points.kill(scope, k, "arrival", what)
            return Emulator._reply(start_response, 503, ec2_error_body(
                "ServiceUnavailable", f"gangway fault sweep: the client was killed as request {k} arrived"))
        captured = {}
        written = []

        def capture(status, headers, exc_info=None):
            captured["status"], captured["headers"] = status, headers
            return written.append

        result = self.app(environ, capture)
        try:
            body = b"".join(written) + b"".join(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        if self.points.returning(scope, k):
            # The work is done; the answer never reaches the client.
            self.points.kill(scope, k, "return", what)
        start_response(captured["status"], captured["headers"])
        return [body]

    def count_view(self, environ, start_response):
        """GET /_gangway/calls?scope=AKID: that scope's requests so far, by
        action; DELETE forgets them."""
        query = dict(urllib.parse.parse_qsl(environ.get("QUERY_STRING", "")))
        scope = query.get("scope", "")
        with self.calls_lock:
            if environ.get("REQUEST_METHOD", "GET") == "DELETE":
                self.calls.pop(scope, None)
                counts = {}
            else:
                counts = dict(self.calls.get(scope, {}))
        body = (json.dumps({"scope": scope, "calls": counts}) + "\n").encode("utf-8")
        return Emulator._reply(start_response, 200, body, "application/json")

    def control(self, environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        query = dict(urllib.parse.parse_qsl(environ.get("QUERY_STRING", "")))

        def reply(status, obj):
            body = (json.dumps(obj, indent=1) + "\n").encode("utf-8")
            return Emulator._reply(start_response, status, body, "application/json")

        try:
            if method == "POST":
                spec = json.loads(Emulator._read_body(environ) or b"null")
                return reply(200, self.points.arm(spec))
            if method == "GET":
                if "scope" not in query:
                    raise ValueError("GET /_gangway/kill?scope=ACCESS_KEY_ID")
                return reply(200, self.points.view(query["scope"]))
            if method == "DELETE":
                return reply(200, {"removed": self.points.disarm(query.get("scope"))})
            return reply(405, {"error": "use GET, POST or DELETE"})
        except LookupError as err:
            return reply(404, {"error": str(err).strip("'\"")})
        except (ValueError, TypeError) as err:
            return reply(400, {"error": str(err)})


# The image gangway picks by default for GPU types: the Deep Learning AMI,
# by name pattern, owned by "amazon". moto's bundled images predate its
# current naming, so the emulator adds one image of that shape to every
# region (moto builds each region's images from this list on first use).
DEEP_LEARNING_AMI = {
    "ami_id": "ami-0d1a0b1e2c3d4e5f6",
    "state": "available",
    "public": True,
    "owner_id": "898082745236",
    "image_location": "amazon/deep-learning",
    "sriov": "simple",
    "root_device_type": "ebs",
    "root_device_name": "/dev/sda1",
    "description": "Deep Learning AMI for NVIDIA GPUs with PyTorch (emulator)",
    "image_type": "machine",
    "platform": None,
    "architecture": "x86_64",
    "name": "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.5.1 (Ubuntu 22.04) 20250101",
    "virtualization_type": "hvm",
    "hypervisor": "xen",
    "creation_date": "2025-01-01T00:00:00.000Z",
}


def seed_deep_learning_ami():
    from moto.ec2.models import amis

    if not any(a["ami_id"] == DEEP_LEARNING_AMI["ami_id"] for a in amis.AMIS):
        amis.AMIS.append(dict(DEEP_LEARNING_AMI))


def pinned_moto_version():
    try:
        with open(os.path.join(HERE, "requirements.txt")) as f:
            for line in f:
                match = re.match(r"\s*moto(\[[^\]]*\])?==([^\s;#]+)", line)
                if match:
                    return match.group(2)
    except OSError:
        pass
    return None


def warm_up(endpoint, regions):
    """One EC2 call per region: moto loads its data on the first one (~2 s)."""
    for region in regions:
        req = urllib.request.Request(
            endpoint + "/",
            data=b"Action=DescribeRegions&Version=2016-11-15",
            headers={
                "Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
                "Authorization": f"AWS4-HMAC-SHA256 Credential=testing/20000101/{region}/ec2/aws4_request, SignedHeaders=host, Signature=0",
            },
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--watch-stdin", action="store_true",
                        help="exit when standard input reaches end of file")
    parser.add_argument("--warm-regions", default="us-east-1,us-west-2,eu-west-1",
                        help="regions to make one warm-up call in before READY")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    parser.add_argument("--spot-notice-seconds", type=float, default=120.0,
                        help="seconds from a spot interruption notice to the termination "
                             "(EC2: two minutes)")
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="ec2-emulator: %(message)s", stream=sys.stderr)
    if not args.verbose:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)

    import moto
    pinned = pinned_moto_version()
    if pinned and moto.__version__ != pinned:
        log.warning("moto %s is installed, requirements.txt pins %s", moto.__version__, pinned)

    # DescribeInstances filters moto lacks (it answers 500 for them): the
    # placement group recorded by run_instances above, and spot or not.
    ec2_utils.filter_dict_attribute_mapping.setdefault(
        "placement-group-name", "placement.group_name"
    )
    ec2_utils.filter_dict_attribute_mapping.setdefault("instance-lifecycle", "lifecycle")

    seed_deep_learning_ami()
    app = Emulator(DomainDispatcherApplication(create_backend_app),
                   notice_seconds=args.spot_notice_seconds)
    extra = {"request_handler": MotoRequestHandler} if MotoRequestHandler else {}
    server = make_server(args.host, args.port, KillPointLayer(app), threaded=True, **extra)
    host, port = server.server_address[:2]
    endpoint = f"http://{host}:{port}"
    threading.Thread(target=server.serve_forever, name="serve", daemon=True).start()

    stop = threading.Event()

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

    warm_up(endpoint, [r for r in args.warm_regions.split(",") if r])
    print(f"READY {endpoint}", flush=True)

    # Event.wait with a timeout keeps the main thread responsive to signals.
    while not stop.wait(1.0):
        pass
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
