#!/usr/bin/env python3
"""Self test of the EC2 emulator (server.py) and leak_check.py, with boto3.

    python selftest.py        # with the venv's python (boto3 comes with moto)

Starts the server on a free port, checks fault injection, spot interruption,
placement groups, DescribeInstanceTopology, ClientToken idempotency, the
leak check, kill points, machines (addresses, the key pair, the metadata
service, interruptions with notice), the console output with the machines'
host keys and the record of STS AssumeRole calls, and stops it. Prints one
line per check, then `N passed, N failed`, and exits 1 if anything failed.
"""

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER = "gangway-selftest"
AMI = "ami-12345678"

results = []


def check(name, condition, detail=""):
    results.append(bool(condition))
    print(f"{'ok  ' if condition else 'FAIL'} {name}{'' if condition else ': ' + str(detail)}")


def error_of(fn, *args, **kwargs):
    """(code, HTTP status) of the ClientError fn raises, or (None, None)."""
    try:
        fn(*args, **kwargs)
    except ClientError as err:
        return err.response["Error"]["Code"], err.response["ResponseMetadata"]["HTTPStatusCode"]
    return None, None


def control(endpoint, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(endpoint + path, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def start_server(extra=(), stdin=subprocess.DEVNULL):
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "server.py"), "--port", "0", *extra],
        stdin=stdin, stdout=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit(f"server did not print READY (got {line!r})")
    return proc, line.split()[1], time.monotonic() - t0


def tagspec(resource, **extra):
    tags = [{"Key": "gangway-cluster", "Value": CLUSTER}]
    tags += [{"Key": k, "Value": v} for k, v in extra.items()]
    return [{"ResourceType": resource, "Tags": tags}]


def run(ec2, count=1, itype="p4d.24xlarge", **kwargs):
    kwargs.setdefault("TagSpecifications", tagspec("instance"))
    resp = ec2.run_instances(ImageId=AMI, MinCount=count, MaxCount=count,
                             InstanceType=itype, **kwargs)
    return [i["InstanceId"] for i in resp["Instances"]]


def instances(ec2, ids):
    resp = ec2.describe_instances(InstanceIds=ids)
    found = {i["InstanceId"]: i for r in resp["Reservations"] for i in r["Instances"]}
    return [found[i] for i in ids]


def main():
    proc, endpoint, ready_s = start_server()
    print(f"server: {endpoint}, READY after {ready_s:.2f} s")
    try:
        selftest(endpoint)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
            check("server exits on SIGTERM", proc.returncode == 0, proc.returncode)
        except subprocess.TimeoutExpired:
            proc.kill()
            check("server exits on SIGTERM", False, "still running after 10 s")

    # --watch-stdin: the server goes when its parent closes the pipe.
    proc, _, _ = start_server(["--watch-stdin", "--warm-regions", "us-east-1"], subprocess.PIPE)
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
        check("--watch-stdin: exits on end of input", proc.returncode == 0, proc.returncode)
    except subprocess.TimeoutExpired:
        proc.kill()
        check("--watch-stdin: exits on end of input", False, "still running")

    passed, failed = results.count(True), results.count(False)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def selftest(endpoint):
    session = boto3.session.Session(aws_access_key_id="testing",
                                    aws_secret_access_key="testing")
    config = Config(retries={"total_max_attempts": 1})
    ec2 = session.client("ec2", region_name="us-east-1", endpoint_url=endpoint, config=config)
    west = session.client("ec2", region_name="us-west-2", endpoint_url=endpoint, config=config)

    status, body = control(endpoint, "GET", "/_gangway/health")
    check("health", status == 200 and body == "ok", (status, body))
    sts = session.client("sts", region_name="us-east-1", endpoint_url=endpoint, config=config)
    check("STS answers on the same endpoint (moto's default account)",
          sts.get_caller_identity()["Account"] == "123456789012")
    session_1, session_2 = (sts.get_session_token(DurationSeconds=3600)["Credentials"] for _ in range(2))
    pricing = session.client("pricing", region_name="us-east-1", endpoint_url=endpoint, config=config)
    got = pricing.get_products(ServiceCode="AmazonEC2", FormatVersion="aws_v1", Filters=[
        {"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in (
            ("instanceType", "p4d.24xlarge"), ("regionCode", "us-east-1"),
            ("operatingSystem", "Linux"))])
    docs = [json.loads(d) for d in got["PriceList"]]
    usd = [d2["pricePerUnit"]["USD"] for d in docs for t in d["terms"]["OnDemand"].values()
           for d2 in t["priceDimensions"].values()]
    check("the Price List API answers GetProducts for one type, region and OS",
          len(docs) == 1 and docs[0]["product"]["attributes"]["instanceType"] == "p4d.24xlarge"
          and float(usd[0]) > 0, (len(docs), usd))
    m5 = [{"Type": "TERM_MATCH", "Field": "instanceType", "Value": "m5.large"}]
    first = pricing.get_products(ServiceCode="AmazonEC2", MaxResults=10, Filters=m5)
    second = pricing.get_products(ServiceCode="AmazonEC2", MaxResults=10, Filters=m5,
                                  NextToken=first.get("NextToken", ""))
    check("GetProducts pages by NextToken",
          len(first["PriceList"]) == 10 and first.get("NextToken")
          and not set(first["PriceList"]) & set(second["PriceList"]),
          (len(first["PriceList"]), first.get("NextToken")))
    check("each STS session has access keys of its own",
          session_1["AccessKeyId"].startswith("ASIA")
          and session_1["AccessKeyId"] != session_2["AccessKeyId"]
          and session_1["SessionToken"], (session_1["AccessKeyId"], session_2["AccessKeyId"]))
    _, counted = control(endpoint, "GET", "/_gangway/sts?scope=testing")
    _, other = control(endpoint, "GET", "/_gangway/sts?scope=AKNOSTSCALLS")
    check("GET /_gangway/sts counts a scope's GetSessionToken calls",
          counted["GetSessionToken"] >= 2 and other["GetSessionToken"] == 0, (counted, other))

    # --- fault injection ----------------------------------------------------
    status, rule = control(endpoint, "POST", "/_gangway/faults", {
        "action": "RunInstances", "contains": [CLUSTER, "us-east-1a"],
        "code": "InsufficientInstanceCapacity",
        "message": "We currently do not have sufficient p4d.24xlarge capacity in the "
                   "Availability Zone you requested (us-east-1a).",
        "times": 1})
    check("fault rule added, status defaults to 500", status == 201 and rule["status"] == 500, rule)
    code, http = error_of(run, ec2, 2, Placement={"AvailabilityZone": "us-east-1a"})
    check("boto3 sees InsufficientInstanceCapacity (HTTP 500)",
          (code, http) == ("InsufficientInstanceCapacity", 500), (code, http))
    t0 = time.monotonic()
    ids = run(ec2, 2, Placement={"AvailabilityZone": "us-east-1a"})
    print(f"     first RunInstances took {time.monotonic() - t0:.3f} s")
    check("rule expires after `times`", len(ids) == 2)
    _, listed = control(endpoint, "GET", "/_gangway/faults")
    mine = [r for r in listed["rules"] if r["id"] == rule["id"]][0]
    check("GET faults: fired 1, remaining 0", (mine["fired"], mine["remaining"]) == (1, 0), mine)
    ec2.terminate_instances(InstanceIds=ids)

    control(endpoint, "POST", "/_gangway/faults", {
        "action": "RunInstances", "contains": ["us-east-1b"], "code": "RequestLimitExceeded",
        "times": -1})
    code, http = error_of(run, ec2, 1, Placement={"AvailabilityZone": "us-east-1b"})
    check("forever rule, RequestLimitExceeded is HTTP 503", (code, http) == ("RequestLimitExceeded", 503), (code, http))
    code, _ = error_of(run, ec2, 1, Placement={"AvailabilityZone": "us-east-1b"})
    check("forever rule fires again", code == "RequestLimitExceeded", code)
    other = run(ec2, 1, Placement={"AvailabilityZone": "us-east-1c"})
    check("requests without the strings pass", len(other) == 1)
    ec2.terminate_instances(InstanceIds=other)
    for code_, want in [("VcpuLimitExceeded", 400), ("UnauthorizedOperation", 403),
                        ("AuthFailure", 401), ("InsufficientCapacityOnHost", 500)]:
        control(endpoint, "POST", "/_gangway/faults", {"action": "DescribeInstances",
                "contains": ["i-fault0000" + code_], "code": code_})
        got = error_of(ec2.describe_instances, InstanceIds=["i-fault0000" + code_])
        check(f"{code_} is HTTP {want}", got == (code_, want), got)

    # The raw error document is EC2's: Response/Errors/Error/Code.
    control(endpoint, "POST", "/_gangway/faults", {"action": "DescribeRegions",
            "contains": ["raw-check"], "code": "Unsupported", "message": "a < b"})
    req = urllib.request.Request(endpoint + "/", data=b"Action=DescribeRegions&RegionName.1=raw-check&Version=2016-11-15",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        urllib.request.urlopen(req, timeout=10)
        raw = b""
    except urllib.error.HTTPError as err:
        raw = err.read()
    check("raw error body is EC2's shape (unsigned request routed to EC2)",
          b"<Response><Errors><Error><Code>Unsupported</Code><Message>a &lt; b</Message></Error></Errors><RequestID>" in raw,
          raw)
    status, body = control(endpoint, "POST", "/_gangway/faults", {"action": "RunInstances"})
    check("bad rule is refused with 400", status == 400, (status, body))
    status, body = control(endpoint, "DELETE", "/_gangway/faults")
    _, listed = control(endpoint, "GET", "/_gangway/faults")
    check("DELETE faults clears all", status == 200 and listed["rules"] == [], listed)
    ids = run(ec2, 1, Placement={"AvailabilityZone": "us-east-1b"})
    check("cleared rule no longer fires", len(ids) == 1)
    ec2.terminate_instances(InstanceIds=ids)

    # --- plain moto features gangway relies on ---------------------------------
    itypes = {t["InstanceType"]: t for t in ec2.describe_instance_types(
        InstanceTypes=["p4d.24xlarge", "p5.48xlarge"])["InstanceTypes"]}
    gpus = itypes["p4d.24xlarge"].get("GpuInfo", {}).get("Gpus", [{}])[0]
    check("DescribeInstanceTypes has GPU info", (gpus.get("Name"), gpus.get("Count")) == ("A100", 8), gpus)
    offers = ec2.describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": ["p5.48xlarge"]}])["InstanceTypeOfferings"]
    check("DescribeInstanceTypeOfferings by zone", len(offers) > 0, offers)
    pub = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    key = ec2.import_key_pair(KeyName="gangway-selftest-key", PublicKeyMaterial=pub,
                              TagSpecifications=tagspec("key-pair"))
    check("ed25519 key import", key.get("KeyFingerprint"), key)
    sg = ec2.create_security_group(GroupName="gangway-selftest-sg", Description="selftest",
                                   TagSpecifications=tagspec("security-group"))["GroupId"]

    # --- placement groups ------------------------------------------------------
    pg = ec2.create_placement_group(GroupName="gangway-selftest-pg", Strategy="cluster",
                                    TagSpecifications=tagspec("placement-group", Name="pg"))
    group = pg.get("PlacementGroup", {})
    check("CreatePlacementGroup answers the group with tags",
          group.get("GroupId", "").startswith("pg-") and group.get("State") == "available"
          and {"Key": "gangway-cluster", "Value": CLUSTER} in group.get("Tags", []), pg)
    code, _ = error_of(ec2.create_placement_group, GroupName="gangway-selftest-pg", Strategy="cluster")
    check("duplicate group is refused", code == "InvalidPlacementGroup.Duplicate", code)
    by_tag = ec2.describe_placement_groups(
        Filters=[{"Name": "tag:gangway-cluster", "Values": [CLUSTER]}])["PlacementGroups"]
    by_name = ec2.describe_placement_groups(GroupNames=["gangway-selftest-pg"])["PlacementGroups"]
    by_filter = ec2.describe_placement_groups(
        Filters=[{"Name": "group-name", "Values": ["gangway-selftest-*"]}])["PlacementGroups"]
    check("DescribePlacementGroups by tag, GroupName.N, group-name filter",
          [g["GroupName"] for g in by_tag + by_name + by_filter] == ["gangway-selftest-pg"] * 3,
          (by_tag, by_name, by_filter))
    ec2.create_tags(Resources=[group["GroupId"]], Tags=[{"Key": "later", "Value": "1"}])
    ec2.delete_tags(Resources=[group["GroupId"]], Tags=[{"Key": "Name"}])
    tags = ec2.describe_placement_groups(GroupIds=[group["GroupId"]])["PlacementGroups"][0]["Tags"]
    check("CreateTags / DeleteTags on a placement group",
          sorted((t["Key"], t["Value"]) for t in tags) == [("gangway-cluster", CLUSTER), ("later", "1")], tags)
    check("placement groups are per region",
          west.describe_placement_groups()["PlacementGroups"] == [])
    code, _ = error_of(run, ec2, 1, Placement={"GroupName": "no-such-group"})
    check("RunInstances into an unknown group is refused", code == "InvalidPlacementGroup.Unknown", code)

    cluster = run(ec2, 4, KeyName="gangway-selftest-key", SecurityGroupIds=[sg],
                  Placement={"AvailabilityZone": "us-east-1a", "GroupName": "gangway-selftest-pg"})
    described = instances(ec2, cluster)
    check("DescribeInstances shows Placement.GroupName",
          all(i["Placement"].get("GroupName") == "gangway-selftest-pg" for i in described),
          [i["Placement"] for i in described])
    check("instances have private and public IPs",
          all(i.get("PrivateIpAddress") and i.get("PublicIpAddress") for i in described))
    filtered = ec2.describe_instances(Filters=[
        {"Name": "placement-group-name", "Values": ["gangway-selftest-pg"]}])["Reservations"]
    check("placement-group-name filter",
          sorted(i["InstanceId"] for r in filtered for i in r["Instances"]) == sorted(cluster), filtered)
    # The owner sweep's filter: every resource that has a tag, whatever its
    # value (instances, security groups and key pairs are moto's; placement
    # groups the layer's own).
    has_key = [{"Name": "tag-key", "Values": ["gangway-cluster"]}]
    no_key = [{"Name": "tag-key", "Values": ["gangway-no-such-tag"]}]
    swept = {
        "instances": sorted(i["InstanceId"] for r in ec2.describe_instances(Filters=has_key)["Reservations"]
                            for i in r["Instances"] if i["InstanceId"] in cluster),
        "security groups": [g["GroupName"] for g in ec2.describe_security_groups(Filters=has_key)["SecurityGroups"]],
        "key pairs": [k["KeyName"] for k in ec2.describe_key_pairs(Filters=has_key)["KeyPairs"]],
        "placement groups": [g["GroupName"] for g in ec2.describe_placement_groups(Filters=has_key)["PlacementGroups"]],
    }
    none = (ec2.describe_instances(Filters=no_key)["Reservations"],
            ec2.describe_security_groups(Filters=no_key)["SecurityGroups"],
            ec2.describe_key_pairs(Filters=no_key)["KeyPairs"],
            ec2.describe_placement_groups(Filters=no_key)["PlacementGroups"])
    check("tag-key filter on instances, security groups, key pairs and placement groups",
          swept == {"instances": sorted(cluster), "security groups": ["gangway-selftest-sg"],
                    "key pairs": ["gangway-selftest-key"], "placement groups": ["gangway-selftest-pg"]}
          and none == ([], [], [], []), (swept, none))
    code, http = error_of(ec2.delete_placement_group, GroupName="gangway-selftest-pg")
    check("DeletePlacementGroup in use is refused", (code, http) == ("InvalidPlacementGroup.InUse", 400), (code, http))
    code, _ = error_of(ec2.delete_placement_group, GroupName="no-such-group")
    check("DeletePlacementGroup of an unknown group", code == "InvalidPlacementGroup.Unknown", code)

    # --- DescribeInstanceTopology ---------------------------------------------
    plain = run(ec2, 1, itype="m5.large")
    topo = ec2.describe_instance_topology(InstanceIds=cluster + plain)["Instances"]
    nodes = {t["InstanceId"]: t["NetworkNodes"] for t in topo}
    check("topology answers the 4 p4d nodes, not the m5", sorted(nodes) == sorted(cluster), topo)
    if sorted(nodes) == sorted(cluster):
        layers = [nodes[i] for i in cluster]
        check("topology: 3 layers, one L1, one L2",
              all(len(n) == 3 for n in layers) and len({n[0] for n in layers}) == 1
              and len({n[1] for n in layers}) == 1, layers)
        check("topology: L3 pairs 1+2 and 3+4",
              layers[0][2] == layers[1][2] != layers[2][2] == layers[3][2], layers)
        check("topology: group name, zone and zone id",
              all(t.get("GroupName") == "gangway-selftest-pg" and t.get("AvailabilityZone") == "us-east-1a"
                  and t.get("ZoneId") for t in topo), topo)
        again = ec2.describe_instance_topology(InstanceIds=cluster)["Instances"]
        check("topology is deterministic", {t["InstanceId"]: t["NetworkNodes"] for t in again} == nodes)

    # --- spot interruption -----------------------------------------------------
    status, body = control(endpoint, "POST", "/_gangway/interrupt",
                           {"instance_id": cluster[3], "region": "us-east-1"})
    inst = instances(ec2, [cluster[3]])[0]
    check("interrupt: terminated (48), Server.SpotInstanceTermination",
          status == 200 and inst["State"] == {"Code": 48, "Name": "terminated"}
          and inst["StateReason"] == {"Code": "Server.SpotInstanceTermination",
                                      "Message": "Server.SpotInstanceTermination: Spot instance termination"},
          (status, body, inst["State"], inst.get("StateReason")))
    status, body = control(endpoint, "POST", "/_gangway/interrupt",
                           {"instance_id": cluster[2], "region": "us-east-1", "state": "stopped"})
    inst = instances(ec2, [cluster[2]])[0]
    check("interrupt stopped: stopped (80), Server.SpotInstanceShutdown",
          status == 200 and inst["State"] == {"Code": 80, "Name": "stopped"}
          and inst["StateReason"]["Code"] == "Server.SpotInstanceShutdown",
          (status, body, inst["State"], inst.get("StateReason")))
    status, body = control(endpoint, "POST", "/_gangway/interrupt",
                           {"instance_id": "i-0000000000000dead", "region": "us-east-1"})
    check("interrupt of an unknown instance is 404", status == 404, (status, body))
    topo = ec2.describe_instance_topology(InstanceIds=cluster)["Instances"]
    check("topology leaves out instances not running",
          sorted(t["InstanceId"] for t in topo) == sorted(cluster[:2]), topo)

    ec2.terminate_instances(InstanceIds=cluster + plain)
    ec2.delete_placement_group(GroupName="gangway-selftest-pg")
    check("DeletePlacementGroup once its instances are gone",
          ec2.describe_placement_groups()["PlacementGroups"] == [])

    spot = run(ec2, 1, InstanceMarketOptions={"MarketType": "spot"})
    found = ec2.describe_instances(Filters=[
        {"Name": "instance-lifecycle", "Values": ["spot"]},
        {"Name": "instance-state-name", "Values": ["running"]}])["Reservations"]
    check("instance-lifecycle filter finds the spot instance",
          [i["InstanceId"] for r in found for i in r["Instances"]] == spot, found)
    ec2.terminate_instances(InstanceIds=spot)

    # --- ClientToken -----------------------------------------------------------
    first = run(ec2, 2, ClientToken="gangway-selftest-token")
    second = run(ec2, 2, ClientToken="gangway-selftest-token")
    check("RunInstances with a repeated ClientToken is idempotent", first == second, (first, second))
    code, _ = error_of(run, ec2, 3, ClientToken="gangway-selftest-token")
    check("same ClientToken, other parameters: IdempotentParameterMismatch",
          code == "IdempotentParameterMismatch", code)
    ec2.terminate_instances(InstanceIds=first)

    # --- leak check ------------------------------------------------------------
    leak_cmd = [sys.executable, os.path.join(HERE, "leak_check.py"), "--endpoint", endpoint]
    out = subprocess.run(leak_cmd, capture_output=True, text=True)
    check("leak check sees the key pair and security group left",
          out.returncode == 1 and "gangway-selftest-key" in out.stdout
          and "gangway-selftest-sg" in out.stdout, out.stdout + out.stderr)
    ec2.delete_key_pair(KeyName="gangway-selftest-key")
    ec2.delete_security_group(GroupId=sg)
    leaked = run(west, 1, itype="g6e.xlarge")
    out = subprocess.run(leak_cmd, capture_output=True, text=True)
    check("leak check finds a tagged instance left in us-west-2",
          out.returncode == 1 and leaked[0] in out.stdout and "us-west-2" in out.stdout,
          out.stdout + out.stderr)
    west.terminate_instances(InstanceIds=leaked)
    out = subprocess.run(leak_cmd, capture_output=True, text=True)
    check("leak check passes when nothing is left",
          out.returncode == 0
          and out.stdout.strip() == "leak check: nothing left in us-east-1,us-west-2,eu-west-1",
          out.stdout + out.stderr)

    # --- kill points (the fault sweep) ----------------------------------------
    kill_points_selftest(endpoint, session, config)

    # --- machines: addresses, key, metadata service, noticed interruptions --
    machines_selftest(endpoint, config)

    # --- the console output with the machines' host keys ------------------------
    console_selftest(endpoint, config)
    console_pending_selftest()

    # --- STS AssumeRole, recorded --------------------------------------------------
    assume_role_selftest(endpoint, config)

    # --- known moto limitations (reported, not failures) ---------------------
    prices = ec2.describe_spot_price_history(InstanceTypes=["p4d.24xlarge"],
                                             ProductDescriptions=["Linux/UNIX"])["SpotPriceHistory"]
    print(f"     note: spot price history has {len({p['SpotPrice'] for p in prices})} distinct price(s)")


def imds(address, port, path, token=None, method="GET", ttl=None):
    """(status, body) of one metadata request; (None, None) when nothing answers."""
    headers = {}
    if token is not None:
        headers["X-aws-ec2-metadata-token"] = token
    if ttl is not None:
        headers["X-aws-ec2-metadata-token-ttl-seconds"] = str(ttl)
    req = urllib.request.Request(f"http://{address}:{port}{path}", method=method,
                                 headers=headers, data=b"" if method == "PUT" else None)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except (urllib.error.URLError, ConnectionError, OSError):
        return None, None


def machines_selftest(endpoint, config):
    """/_gangway/machines and interruptions with notice."""
    import tempfile

    scope = "AKSELFTESTMACH"
    pairs = [["127.0.250.1", "127.1.250.1"], ["127.0.250.2", "127.1.250.2"]]
    session = boto3.session.Session(aws_access_key_id=scope, aws_secret_access_key="testing")
    ec2 = session.client("ec2", region_name="us-east-1", endpoint_url=endpoint, config=config)
    keys = tempfile.NamedTemporaryFile(prefix="gw-selftest-keys-", delete=False).name
    status, view = control(endpoint, "POST", "/_gangway/machines",
                           {"scope": scope, "addresses": pairs, "authorized_keys": keys})
    port = view.get("imds_port") if status == 200 else None
    check("machines: a scope gets its addresses and one metadata port", status == 200 and port, view)
    status, _ = control(endpoint, "POST", "/_gangway/machines", {"scope": scope, "addresses": [["x", "y"]]})
    check("machines: a bad address is refused (400)", status == 400, status)

    public = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    ec2.import_key_pair(KeyName="gangway-selftest-machines", PublicKeyMaterial=public,
                        TagSpecifications=tagspec("key-pair"))
    ids = run(ec2, 2, KeyName="gangway-selftest-machines",
              InstanceMarketOptions={"MarketType": "spot"})
    got = {i["InstanceId"]: (i.get("PublicIpAddress"), i.get("PrivateIpAddress"))
           for i in instances(ec2, ids)}
    check("machines: each instance takes the next pair, public and private",
          sorted(got.values()) == [tuple(p) for p in pairs], got)
    with open(keys) as f:
        check("machines: the key pair is in authorized_keys", public.decode() in f.read())
    code, status = error_of(run, ec2, 1)
    check("machines: more instances than free pairs is InsufficientInstanceCapacity (500)",
          (code, status) == ("InsufficientInstanceCapacity", 500), (code, status))

    address = got[ids[0]][0]
    status, token = imds(address, port, "/latest/api/token", method="PUT", ttl=60)
    check("imds: PUT /latest/api/token hands out a token", status == 200 and token, (status, token))
    status, _ = imds(address, port, "/latest/api/token", method="PUT")
    check("imds: a token PUT without a TTL is 400", status == 400, status)
    status, _ = imds(address, port, "/latest/meta-data/instance-id")
    check("imds: a GET without a token is 401", status == 401, status)
    answers = {k: imds(address, port, f"/latest/meta-data/{k}", token)[1]
               for k in ("instance-id", "local-ipv4", "public-ipv4", "instance-life-cycle",
                         "placement/availability-zone")}
    check("imds: the instance's own id, addresses, life cycle and zone",
          answers == {"instance-id": ids[0], "local-ipv4": got[ids[0]][1], "public-ipv4": address,
                      "instance-life-cycle": "spot", "placement/availability-zone": "us-east-1a"},
          answers)
    other = imds(got[ids[1]][0], port, "/latest/meta-data/instance-id", token)
    check("imds: a token is the instance's own (another's is 401)", other[0] == 401, other)
    status, _ = imds(address, port, "/latest/meta-data/spot/instance-action", token)
    check("imds: no spot/instance-action before a notice (404)", status == 404, status)

    status, body = control(endpoint, "POST", "/_gangway/interrupt",
                           {"instance_id": ids[0], "region": "us-east-1", "notice_seconds": 1})
    status_a, action = imds(address, port, "/latest/meta-data/spot/instance-action", token)
    state = instances(ec2, [ids[0]])[0]["State"]["Name"]
    check("notice: posted at once, the instance still running",
          status == 200 and status_a == 200 and json.loads(action)["action"] == "terminate"
          and json.loads(action)["time"] == body["notice"]["time"] and state == "running",
          (status, body, status_a, action, state))
    time.sleep(1.5)
    inst = instances(ec2, [ids[0]])[0]
    check("notice: terminated after notice_seconds, Server.SpotInstanceTermination",
          inst["State"]["Name"] == "terminated"
          and inst["StateReason"]["Code"] == "Server.SpotInstanceTermination", inst.get("StateReason"))
    check("imds: a terminated instance's address answers nothing",
          imds(address, port, "/latest/api/token", method="PUT", ttl=60) == (None, None))
    ec2.terminate_instances(InstanceIds=ids)
    inst = instances(ec2, [ids[0]])[0]
    check("TerminateInstances leaves a reclaimed instance's reason alone",
          inst["StateReason"]["Code"] == "Server.SpotInstanceTermination", inst.get("StateReason"))
    again = run(ec2, 1, KeyName="gangway-selftest-machines")
    check("machines: a terminated instance's pair is free again",
          instances(ec2, again)[0].get("PublicIpAddress") == pairs[0][0],
          instances(ec2, again)[0].get("PublicIpAddress"))
    ec2.terminate_instances(InstanceIds=again)

    # Instance profiles: IAM made as a user would, then every instance of
    # the launch has it and its metadata service hands out the role's keys.
    iam = session.client("iam", region_name="us-east-1", endpoint_url=endpoint, config=config)
    iam.create_role(RoleName="gangway-selftest-nodes", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "ec2.amazonaws.com"}}]}))
    profile = iam.create_instance_profile(InstanceProfileName="gangway-selftest-nodes")
    iam.add_role_to_instance_profile(InstanceProfileName="gangway-selftest-nodes",
                                     RoleName="gangway-selftest-nodes")
    code, status = error_of(run, ec2, 1, IamInstanceProfile={"Name": "gangway-selftest-none"})
    check("RunInstances with an unknown instance profile: InvalidParameterValue (400)",
          (code, status) == ("InvalidParameterValue", 400), (code, status))
    with_profile = run(ec2, 2, KeyName="gangway-selftest-machines",
                       IamInstanceProfile={"Name": "gangway-selftest-nodes"})
    arns = [i.get("IamInstanceProfile", {}).get("Arn") for i in instances(ec2, with_profile)]
    check("RunInstances gives every instance the profile (moto: only the first)",
          arns == [profile["InstanceProfile"]["Arn"]] * 2, arns)
    keys_seen = []
    for iid in with_profile:
        at = instances(ec2, [iid])[0]["PublicIpAddress"]
        _, tok = imds(at, port, "/latest/api/token", method="PUT", ttl=60)
        listing = imds(at, port, "/latest/meta-data/iam/", tok)
        roles = imds(at, port, "/latest/meta-data/iam/security-credentials/", tok)
        info = imds(at, port, "/latest/meta-data/iam/info", tok)
        creds = imds(at, port, "/latest/meta-data/iam/security-credentials/gangway-selftest-nodes", tok)
        body = json.loads(creds[1]) if creds[0] == 200 else {}
        keys_seen.append(body.get("AccessKeyId"))
        check("imds: iam/, iam/info and iam/security-credentials/ROLE in EC2's shapes",
              listing == (200, "info\nsecurity-credentials/")
              and roles == (200, "gangway-selftest-nodes")
              and info[0] == 200
              and json.loads(info[1])["InstanceProfileArn"] == profile["InstanceProfile"]["Arn"]
              and {k for k in body} == {"Code", "LastUpdated", "Type", "AccessKeyId",
                                        "SecretAccessKey", "Token", "Expiration"}
              and body["Code"] == "Success" and body["Type"] == "AWS-HMAC"
              and body["AccessKeyId"].startswith("ASIA"),
              (listing, roles, info, creds))
    check("imds: each instance's role keys are its own", len(set(keys_seen)) == 2, keys_seen)
    ec2.terminate_instances(InstanceIds=with_profile)
    plain = run(ec2, 1, KeyName="gangway-selftest-machines")
    at = instances(ec2, plain)[0]["PublicIpAddress"]
    _, tok = imds(at, port, "/latest/api/token", method="PUT", ttl=60)
    root = imds(at, port, "/latest/meta-data/", tok)
    check("imds: no iam/ without an instance profile (404)",
          imds(at, port, "/latest/meta-data/iam/info", tok)[0] == 404
          and imds(at, port, "/latest/meta-data/iam/security-credentials/", tok)[0] == 404
          and root[0] == 200 and "iam/" not in root[1].split("\n"), root)
    ec2.terminate_instances(InstanceIds=plain)
    iam.remove_role_from_instance_profile(InstanceProfileName="gangway-selftest-nodes",
                                          RoleName="gangway-selftest-nodes")
    iam.delete_instance_profile(InstanceProfileName="gangway-selftest-nodes")
    iam.delete_role(RoleName="gangway-selftest-nodes")
    ec2.delete_key_pair(KeyName="gangway-selftest-machines")
    _, removed = control(endpoint, "DELETE", f"/_gangway/machines?scope={scope}")
    check("machines: DELETE stops the scope's metadata service",
          removed == {"removed": 1}
          and imds(pairs[1][0], port, "/latest/api/token", method="PUT", ttl=60) == (None, None),
          removed)
    os.unlink(keys)


def openssh_line(private_key, comment="root@selftest"):
    """The OpenSSH public key line of a cryptography private key."""
    public = private_key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{public} {comment}"


def fingerprint_of(line):
    """`SHA256:...` of a public key line: ssh-keygen's when it is there,
    else the same figure by hand (base64 of the blob's SHA-256, no padding)."""
    keygen = shutil.which("ssh-keygen")
    if keygen:
        out = subprocess.run([keygen, "-l", "-f", "-"], input=line + "\n",
                             capture_output=True, text=True)
        if out.returncode == 0:
            return out.stdout.split()[1]
    digest = hashlib.sha256(base64.b64decode(line.split()[1])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def key_blocks(text):
    """The fingerprints and keys blocks of a console output, as lists of
    lines (without the `ec2: ` prefix for fingerprints); None each when
    absent."""
    lines = text.replace("\r\n", "\n").split("\n")

    def between(begin, end, prefix=""):
        try:
            start = lines.index(prefix + begin)
            stop = lines.index(prefix + end, start)
        except ValueError:
            return None
        return [line[len(prefix):] for line in lines[start + 1:stop]]

    return (between("-----BEGIN SSH HOST KEY FINGERPRINTS-----",
                    "-----END SSH HOST KEY FINGERPRINTS-----", "ec2: "),
            between("-----BEGIN SSH HOST KEY KEYS-----", "-----END SSH HOST KEY KEYS-----"))


def raw_ec2(endpoint, form, access_key="testing"):
    """(status, body) of a hand-made EC2 request signed (in name) with access_key."""
    req = urllib.request.Request(endpoint + "/", data=urllib.parse.urlencode(form).encode(), headers={
        "Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
        "Authorization": f"AWS4-HMAC-SHA256 Credential={access_key}/20000101/us-east-1/ec2/aws4_request, "
                         "SignedHeaders=host, Signature=0"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def console_selftest(endpoint, config):
    """GetConsoleOutput of instances whose scope was given host keys:
    cloud-init's fingerprints and keys blocks, right fingerprints, a key
    replaced, stopped instances, a console that posts late, other
    instances left to moto."""
    scope, other_scope = "AKSELFTESTCONSOLE", "AKSELFTESTNOKEYS"
    pairs = [["127.0.251.1", "127.1.251.1"], ["127.0.251.2", "127.1.251.2"]]
    ed = openssh_line(Ed25519PrivateKey.generate())
    ecdsa = openssh_line(ec.generate_private_key(ec.SECP256R1()))
    rsa_key = openssh_line(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    replaced = openssh_line(Ed25519PrivateKey.generate(), "root@replaced")

    for bad, why in (("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "unknown key type"),
                     ("ssh-ed25519 not*base64", "is not base64"),
                     ("ssh-rsa " + ed.split()[1], "is not a ssh-rsa key")):
        status, body = control(endpoint, "POST", "/_gangway/machines",
                               {"scope": scope, "addresses": pairs, "host_keys": [bad]})
        check(f"console: a bad host key is refused (400, {why})",
              status == 400 and why in body.get("error", ""), (status, body))
    status, body = control(endpoint, "POST", "/_gangway/machines", {"scope": scope, "host_keys": [ed]})
    check("console: host keys alone for a scope that has no addresses yet are refused (400)",
          status == 400, (status, body))
    status, view = control(endpoint, "POST", "/_gangway/machines",
                           {"scope": scope, "addresses": pairs, "host_keys": [ed, ecdsa, rsa_key]})
    check("console: a scope takes host keys (ed25519, ecdsa, rsa)",
          status == 200 and view["host_keys"] == [ed, ecdsa, rsa_key], view)

    session = boto3.session.Session(aws_access_key_id=scope, aws_secret_access_key="testing")
    ec2 = session.client("ec2", region_name="us-east-1", endpoint_url=endpoint, config=config)
    ids = run(ec2, 1)
    private = instances(ec2, ids)[0]["PrivateIpAddress"]
    who = "root@ip-" + private.replace(".", "-")
    got = ec2.get_console_output(InstanceId=ids[0])
    text = got.get("Output", "")
    prints, keys = key_blocks(text)
    want_prints = [f"256 {fingerprint_of(ed)} {who} (ED25519)",
                   f"256 {fingerprint_of(ecdsa)} {who} (ECDSA)",
                   f"2048 {fingerprint_of(rsa_key)} {who} (RSA)"]
    want_keys = [" ".join(line.split()[:2]) + " " + who for line in (ed, ecdsa, rsa_key)]
    check("console: GetConsoleOutput answers the instance and a timestamp",
          got.get("InstanceId") == ids[0] and got.get("Timestamp") is not None, got)
    check("console: the fingerprints block, ssh-keygen's figures (bits, SHA256, type)",
          prints == want_prints, (prints, want_prints))
    check("console: the keys block, one `TYPE BASE64 root@ip-...` line per key",
          keys == want_keys, (keys, want_keys))
    lines = text.split("\r\n")
    check("console: boot noise first, the ##### rules around the fingerprints, lines after the keys",
          lines.index("ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----") > 3
          and lines[lines.index("ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----") - 1] == "ec2: " + "#" * 61
          and lines[lines.index("ec2: -----END SSH HOST KEY FINGERPRINTS-----") + 1] == "ec2: " + "#" * 61
          and lines.index("-----END SSH HOST KEY KEYS-----") < len(lines) - 2
          and text.endswith("\r\n"), text)
    latest = ec2.get_console_output(InstanceId=ids[0], Latest=True).get("Output")
    check("console: Latest=true answers the same log", latest == text)
    status, raw = raw_ec2(endpoint, {"Action": "GetConsoleOutput", "InstanceId": ids[0],
                                     "Version": "2016-11-15"}, scope)
    match = re.search(r"<output>([^<]*)</output>", raw)
    check("console: the raw answer is EC2's XML, output base64",
          status == 200 and raw.find("<GetConsoleOutputResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">") > 0
          and f"<instanceId>{ids[0]}</instanceId>" in raw
          and re.search(r"<timestamp>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z</timestamp>", raw)
          and match and base64.b64decode(match.group(1)).decode() == text, raw[:400])
    status, raw = raw_ec2(endpoint, {"Action": "GetConsoleOutput", "InstanceId": ids[0],
                                     "Latest": "maybe", "Version": "2016-11-15"}, scope)
    check("console: Latest other than true or false is InvalidParameterValue (400)",
          status == 400 and "<Code>InvalidParameterValue</Code>" in raw, (status, raw))

    # A replaced host key: the next console output shows the new one only.
    status, view = control(endpoint, "POST", "/_gangway/machines", {"scope": scope, "host_keys": [replaced]})
    prints, keys = key_blocks(ec2.get_console_output(InstanceId=ids[0])["Output"])
    check("console: host keys replaced by a POST with the scope and host_keys alone",
          status == 200 and view["addresses"] == pairs and view["host_keys"] == [replaced]
          and keys == [" ".join(replaced.split()[:2]) + " " + who]
          and prints == [f"256 {fingerprint_of(replaced)} {who} (ED25519)"], (view, prints, keys))

    # Stopped: no key block; started again: back.
    ec2.stop_instances(InstanceIds=ids)
    stopped = ec2.get_console_output(InstanceId=ids[0]).get("Output", "")
    check("console: a stopped instance's console has no key block",
          instances(ec2, ids)[0]["State"]["Name"] == "stopped"
          and key_blocks(stopped) == (None, None) and "Linux version" in stopped, stopped)
    ec2.start_instances(InstanceIds=ids)
    prints, _ = key_blocks(ec2.get_console_output(InstanceId=ids[0])["Output"])
    check("console: started again, the key block is back", prints is not None and len(prints) == 1, prints)

    # A console that posts the keys late (console_delay_s after the boot).
    control(endpoint, "POST", "/_gangway/machines", {"scope": scope, "console_delay_s": 1.0})
    late = run(ec2, 1)
    early = ec2.get_console_output(InstanceId=late[0]).get("Output", "")
    time.sleep(1.2)
    prints, _ = key_blocks(ec2.get_console_output(InstanceId=late[0])["Output"])
    check("console: before console_delay_s boot noise only, then the keys",
          key_blocks(early) == (None, None) and "cloud-init" in early and prints is not None,
          (early, prints))
    ec2.terminate_instances(InstanceIds=ids + late)

    # Instances of a scope without host keys, and of none, are moto's.
    control(endpoint, "POST", "/_gangway/machines",
            {"scope": other_scope, "addresses": [["127.0.252.1", "127.1.252.1"]]})
    other = boto3.session.Session(aws_access_key_id=other_scope, aws_secret_access_key="testing").client(
        "ec2", region_name="us-east-1", endpoint_url=endpoint, config=config)
    plain = session.client("ec2", region_name="us-east-1", endpoint_url=endpoint, config=config,
                           aws_access_key_id="testing", aws_secret_access_key="testing")
    theirs, unplaced = run(other, 1), run(plain, 1)
    outputs = [other.get_console_output(InstanceId=theirs[0]).get("Output", ""),
               plain.get_console_output(InstanceId=unplaced[0]).get("Output", "")]
    check("console: an instance of a scope without host keys, or of no scope, gets moto's answer",
          all(o.startswith("Linux version 2.6.16-xenU") and "SSH HOST KEY" not in o for o in outputs),
          outputs)
    control(endpoint, "POST", "/_gangway/machines", {"scope": scope, "host_keys": []})
    again = run(ec2, 1)
    output = ec2.get_console_output(InstanceId=again[0]).get("Output", "")
    check('console: "host_keys": [] takes them away (moto answers)',
          output.startswith("Linux version 2.6.16-xenU"), output)
    code, status = error_of(ec2.get_console_output, InstanceId="i-0123456789abcdef0")
    check("console: an unknown instance is InvalidInstanceID.NotFound (400)",
          (code, status) == ("InvalidInstanceID.NotFound", 400), (code, status))
    other.terminate_instances(InstanceIds=theirs)
    plain.terminate_instances(InstanceIds=unplaced)
    ec2.terminate_instances(InstanceIds=again)
    for s in (scope, other_scope):
        control(endpoint, "DELETE", f"/_gangway/machines?scope={s}")


def console_pending_selftest():
    """A pending instance's console has nothing yet. moto's instances run
    at once, so this asks Machines in this process, with a stand-in for
    moto's instance."""
    sys.path.insert(0, HERE)
    sys.dont_write_bytecode = True   # no __pycache__ next to the sources
    import machines

    class Instance:
        state = "pending"

    class Backend:
        def get_instance_by_id(self, instance_id):
            return Instance()

    class Emulator:
        def backend(self, region):
            return Backend()

    m = machines.Machines(Emulator())
    line = openssh_line(Ed25519PrivateKey.generate())
    m.scopes["S"] = {"pairs": [("127.0.0.1", "10.0.0.1")], "authorized_keys": None,
                     "imds_port": 0, "servers": {}, "host_keys": [line], "console_delay_s": 0}
    m.held["i-pending"] = {"instance_id": "i-pending", "scope": "S", "region": "us-east-1",
                           "public": "127.0.0.1", "private": "10.0.0.1", "booted": time.time()}
    pending = m.console_output("us-east-1", "i-pending")
    Instance.state = "running"
    running = m.console_output("us-east-1", "i-pending")
    check("console: a pending instance has no output yet; running, the keys",
          pending is not None and pending[1] is None
          and running is not None and key_blocks(running[1])[1] == [
              " ".join(line.split()[:2]) + " root@ip-10-0-0-1"], (pending, running))
    check("console: another region's instance is not it (moto answers)",
          m.console_output("us-west-2", "i-pending") is None)


def assume_role_selftest(endpoint, config):
    """STS AssumeRole: moto answers for a role IAM does not have; the call
    is recorded under the signing access key (/_gangway/sts)."""
    scope = "AKSELFTESTROLE"
    sts = boto3.session.Session(aws_access_key_id=scope, aws_secret_access_key="testing").client(
        "sts", region_name="us-east-1", endpoint_url=endpoint, config=config)
    policy = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::gw-selftest/*"}]})
    arn = "arn:aws:iam::123456789012:role/gangway-nodes"
    got = sts.assume_role(RoleArn=arn, RoleSessionName="gangway-selftest", Policy=policy,
                          DurationSeconds=900)
    creds = got.get("Credentials", {})
    check("sts: AssumeRole of a role IAM does not have answers keys of their own",
          creds.get("AccessKeyId", "").startswith("ASIA") and creds.get("SessionToken")
          and got.get("AssumedRoleUser", {}).get("Arn", "").endswith(":assumed-role/gangway-nodes/gangway-selftest"),
          got)
    sts.assume_role(RoleArn=arn, RoleSessionName="gangway-selftest-2")
    _, seen = control(endpoint, "GET", f"/_gangway/sts?scope={scope}")
    _, other = control(endpoint, "GET", "/_gangway/sts?scope=AKNOSTSCALLS")
    check("sts: /_gangway/sts lists the scope's AssumeRole calls (role, session, policy, duration)",
          seen.get("assume_role") == [
              {"role_arn": arn, "session_name": "gangway-selftest", "policy": policy, "duration": "900"},
              {"role_arn": arn, "session_name": "gangway-selftest-2", "policy": None, "duration": None}]
          and other.get("assume_role") == [], (seen, other))
    check("sts: AssumeRole is not counted as a GetSessionToken session",
          seen.get("GetSessionToken") == 0, seen)


def kill_points_selftest(endpoint, session, config):
    """/_gangway/kill: requests numbered per access key; the marked
    processes killed at an arrival (the request never reaches EC2) or a
    return (the work done)."""
    scoped = session.client("ec2", region_name="us-east-1", endpoint_url=endpoint, config=config,
                            aws_access_key_id="AKSELFTESTKILL", aws_secret_access_key="testing")
    ec2 = session.client("ec2", region_name="us-east-1", endpoint_url=endpoint, config=config)

    def victim():
        return subprocess.Popen(["sleep", "60"], env={**os.environ, "GANGWAY_SELFTEST_KILL": "victim"})

    def gone(proc):
        try:
            return proc.wait(timeout=5) == -9
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return False

    def key_names():
        return {k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]}

    public_key = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)

    status, state = control(endpoint, "POST", "/_gangway/kill", {"scope": "AKSELFTESTKILL", "at": 0})
    scoped.describe_regions()
    ec2.describe_regions()  # another scope: not counted
    scoped.describe_regions()
    _, state = control(endpoint, "GET", "/_gangway/kill?scope=AKSELFTESTKILL")
    check("kill points count a scope's requests (arrival and return each)",
          status == 200 and (state["requests"], state["points"], state["fired"]) == (2, 4, None), state)

    # Point 3: the arrival of request 2, an ImportKeyPair that never happens.
    proc = victim()
    control(endpoint, "POST", "/_gangway/kill",
            {"scope": "AKSELFTESTKILL", "at": 3, "marker": "GANGWAY_SELFTEST_KILL=victim"})
    scoped.describe_regions()
    alive_after_1 = proc.poll() is None
    code, _ = error_of(scoped.import_key_pair, KeyName="gangway-selftest-killed-early",
                       PublicKeyMaterial=public_key)
    _, state = control(endpoint, "GET", "/_gangway/kill?scope=AKSELFTESTKILL")
    check("killed at the arrival of request 2: the request never reached EC2",
          alive_after_1 and gone(proc) and code == "ServiceUnavailable"
          and "gangway-selftest-killed-early" not in key_names()
          and {k: state["fired"].get(k) for k in ("point", "request", "when", "action")}
          == {"point": 3, "request": 2, "when": "arrival", "action": "ImportKeyPair"}
          and state["fired"]["killed"] == [proc.pid], (code, state))

    # Point 2: the return of request 1, done but not answered to the killed.
    proc = victim()
    control(endpoint, "POST", "/_gangway/kill",
            {"scope": "AKSELFTESTKILL", "at": 2, "marker": "GANGWAY_SELFTEST_KILL=victim"})
    scoped.import_key_pair(KeyName="gangway-selftest-killed-late", PublicKeyMaterial=public_key)
    _, state = control(endpoint, "GET", "/_gangway/kill?scope=AKSELFTESTKILL")
    check("killed at the return of request 1: the work was done",
          gone(proc) and "gangway-selftest-killed-late" in key_names()
          and (state["fired"]["when"], state["fired"]["killed"]) == ("return", [proc.pid]), state)
    ec2.delete_key_pair(KeyName="gangway-selftest-killed-late")

    status, _ = control(endpoint, "POST", "/_gangway/kill", {"scope": "AKSELFTESTKILL", "at": 1})
    status_scope, _ = control(endpoint, "POST", "/_gangway/kill", {"at": 0})
    check("a kill without a marker, or without a scope, is refused (400)",
          (status, status_scope) == (400, 400), (status, status_scope))
    _, removed = control(endpoint, "DELETE", "/_gangway/kill?scope=AKSELFTESTKILL")
    status, _ = control(endpoint, "GET", "/_gangway/kill?scope=AKSELFTESTKILL")
    check("DELETE disarms the scope", removed == {"removed": 1} and status == 404, (removed, status))


if __name__ == "__main__":
    sys.exit(main())
