#!/usr/bin/env python3
"""Self test of the GCE emulator (server.py), with urllib only.

    python selftest.py        # any python3; the venv's is fine

Starts the server on a free port, checks routing, schema rejections, the
instance lifecycle (bulkInsert, insert, stop, start, delete), operations,
requestId idempotency, fault injection, capacity, list filters, the
catalog's aggregated lists, preemption and the metadata server, guest
attributes (the host keys), resource policies and firewalls, kill points,
the Cloud Billing SKU list (against
cloudbilling.v1.json's Sku schema when the venv has it), and stops it.
Every JSON answer of the API is also checked here against the discovery
document's response schema. Prints one line per check, then
`N passed, N failed`, and exits 1 if anything failed.
"""

import base64
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # no __pycache__ next to the sources
import gce_schema  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
PROJECT = "gangway-selftest"
ZONE = "us-central1-a"
REGION = "us-central1"

results = []
schema = None
billing_schema = None
responses_checked = [0]


def check(name, condition, detail=""):
    results.append(bool(condition))
    print(f"{'ok  ' if condition else 'FAIL'} {name}{'' if condition else ': ' + str(detail)[:2000]}")


def http(endpoint, method, path, body=None, headers=None, timeout=30):
    """(status, parsed JSON or text, headers)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(endpoint + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, status, got = resp.read(), resp.status, resp.headers
    except urllib.error.HTTPError as err:
        raw, status, got = err.read(), err.code, err.headers
    try:
        return status, json.loads(raw), got
    except ValueError:
        return status, raw.decode(), got


class Api:
    """Compute API calls under /compute/v1/projects/PROJECT/..., the way the
    Rust client sends them ($alt=json), with their answers checked against
    the response schema."""

    def __init__(self, endpoint):
        self.endpoint = endpoint

    def call(self, method, path, body=None, **query):
        query = {"$alt": "json", **{k: v for k, v in query.items() if v is not None}}
        relative = f"projects/{PROJECT}" + (f"/{path}" if path else "")
        full = f"/compute/v1/{relative}?" + urllib.parse.urlencode(query)
        status, answer, _ = http(self.endpoint, method, full, body)
        if status == 200 and isinstance(answer, dict):
            found, _ = schema.route(method, relative)
            problems = schema.check_response_body(found, answer) if found else ["no route"]
            responses_checked[0] += 1
            if problems:
                check(f"response of {method} {path} matches the schema", False, problems)
        return status, answer

    def get(self, path, **query):
        return self.call("GET", path, **query)

    def post(self, path, body=None, **query):
        return self.call("POST", path, body, **query)

    def delete(self, path, **query):
        return self.call("DELETE", path, **query)

    def op_get(self, op):
        return self.get(op_path(op))[1]

    def until_done(self, op, limit=20):
        """Polls an operation the way the Rust client's until_done does."""
        statuses = [op["status"]]
        for _ in range(limit):
            if op["status"] == "DONE":
                break
            op = self.op_get(op)
            statuses.append(op["status"])
        return op, statuses


def op_path(op):
    if "zone" in op:
        return f"zones/{op['zone'].rsplit('/', 1)[1]}/operations/{op['name']}"
    if "region" in op:
        return f"regions/{op['region'].rsplit('/', 1)[1]}/operations/{op['name']}"
    return f"global/operations/{op['name']}"


def control(endpoint, method, what, body=None):
    status, answer, _ = http(endpoint, method, "/_gangway/" + what, body)
    return status, answer


def instance_properties(**extra):
    props = {
        "machineType": "a2-highgpu-1g",
        "disks": [{"boot": True, "autoDelete": True,
                   "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12",
                                        "diskSizeGb": "200"}}],
        "networkInterfaces": [{"network": "global/networks/default",
                               "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}],
        "labels": {"gangway-cluster": "selftest"},
        "metadata": {"items": [{"key": "ssh-keys", "value": "gangway:ssh-ed25519 AAAA test"}]},
        "tags": {"items": ["gangway-selftest"]},
        "scheduling": {"onHostMaintenance": "TERMINATE", "automaticRestart": False},
    }
    props.update(extra)
    return props


def error_of(answer):
    return (answer.get("error") or {}) if isinstance(answer, dict) else {}


def start_server(extra=(), stdin=subprocess.DEVNULL):
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "server.py"), "--port", "0", *extra],
                            stdin=stdin, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit(f"server did not print READY (got {line!r})")
    return proc, line.split()[1], time.monotonic() - t0


def main():
    global schema
    path = gce_schema.find_discovery(None, [os.path.join(ROOT, "target", "gce-venv")])
    if path is None:
        raise SystemExit("compute.v1.json not found: run tests/emulators/gce/setup.sh first")
    schema = gce_schema.Discovery(path)
    # The Cloud Billing document ships next to Compute's; only the SKUs the
    # fake serves are checked against it, here rather than on every request.
    global billing_schema
    billing_path = os.path.join(os.path.dirname(path), "cloudbilling.v1.json")
    billing_schema = gce_schema.Discovery(billing_path) if os.path.isfile(billing_path) else None

    proc, endpoint, ready_s = start_server()
    print(f"server: {endpoint}, READY after {ready_s:.2f} s (discovery revision {schema.revision})")
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

    proc, _, _ = start_server(["--watch-stdin"], subprocess.PIPE)
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
        check("--watch-stdin: exits on end of input", proc.returncode == 0, proc.returncode)
    except subprocess.TimeoutExpired:
        proc.kill()
        check("--watch-stdin: exits on end of input", False, "still running")

    out = subprocess.run([sys.executable, os.path.join(HERE, "server.py"), "--discovery", "/nonexistent.json"],
                         capture_output=True, text=True, timeout=30)
    check("--discovery with a missing file fails loudly (exit 2, FATAL)",
          out.returncode == 2 and "FATAL" in out.stderr and out.stdout == "", (out.returncode, out.stderr))

    print(f"     {responses_checked[0]} API responses checked against the response schemas")
    passed, failed = results.count(True), results.count(False)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def selftest(endpoint):
    api = Api(endpoint)
    status, body, _ = http(endpoint, "GET", "/_gangway/health")
    check("health", status == 200 and body == "ok", (status, body))

    # --- routing and the catalog -------------------------------------------------
    status, zones = api.get("zones")
    names = [z["name"] for z in zones.get("items", [])]
    check("zones.list has the ten zones", status == 200 and len(names) == 10 and ZONE in names, zones)
    status, regions = api.get("regions")
    check("regions.list has four regions with quotas",
          status == 200 and len(regions["items"]) == 4 and regions["items"][0]["quotas"], regions)
    status, region = api.get(f"regions/{REGION}")
    check("regions.get lists its zones", status == 200 and len(region["zones"]) == 4, region)
    status, project = api.get("")  # projects.get: projects/{project}
    check("projects.get (for `check`)", status == 200 and project["name"] == PROJECT
          and project["id"].isdigit(), project)
    status, mts = api.get(f"zones/{ZONE}/machineTypes")
    by_name = {m["name"]: m for m in mts.get("items", [])}
    check("machineTypes.list has the GPU types with accelerators",
          {"a2-highgpu-8g", "a2-ultragpu-8g", "a3-highgpu-8g", "g2-standard-96", "e2-standard-2"} <= set(by_name)
          and by_name["a3-highgpu-8g"]["accelerators"] == [
              {"guestAcceleratorType": "nvidia-h100-80gb", "guestAcceleratorCount": 8}], sorted(by_name))
    status, mt = api.get(f"zones/{ZONE}/machineTypes/g2-standard-4")
    check("machineTypes.get g2-standard-4: 4 vCPUs, 16 GB, 1 L4",
          status == 200 and (mt["guestCpus"], mt["memoryMb"]) == (4, 16384)
          and mt["accelerators"][0]["guestAcceleratorType"] == "nvidia-l4", mt)
    status, err = api.get("zones/us-east1-b/machineTypes/a2-highgpu-1g")
    check("a machine type whose GPU the zone lacks: 404 notFound",
          status == 404 and error_of(err)["errors"][0]["reason"] == "notFound", (status, err))
    status, accs = api.get(f"zones/{ZONE}/acceleratorTypes")
    check("acceleratorTypes.list", status == 200 and {a["name"] for a in accs["items"]} == {
        "nvidia-tesla-a100", "nvidia-a100-80gb", "nvidia-h100-80gb", "nvidia-h100-mega-80gb", "nvidia-l4",
        "nvidia-tesla-t4", "nvidia-tesla-v100"}, accs)
    status, acc = api.get(f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4")
    check("acceleratorTypes.get", status == 200 and acc["maximumCardsPerInstance"] == 4, acc)
    status, err = api.get("zones/mars-north1-a/instances")
    check("unknown zone: 404", status == 404 and "mars-north1-a" in error_of(err).get("message", ""), err)
    status, err, _ = http(endpoint, "GET", f"/compute/v1/projects/{PROJECT}/nosuchthing")
    check("unknown path: 404 Google JSON error", status == 404 and error_of(err)["code"] == 404, err)
    status, err = api.post(f"zones/{ZONE}/instances/x/setLabels", {"labels": {}})
    check("a real method the emulator lacks: 501 UNIMPLEMENTED",
          status == 501 and error_of(err)["status"] == "UNIMPLEMENTED", (status, err))
    status, listed, _ = http(endpoint, "GET", f"/projects/{PROJECT}/zones/{ZONE}/instances")
    check("paths without /compute/v1 work too", status == 200 and listed["kind"] == "compute#instanceList",
          listed)

    # --- the catalog's aggregated lists ----------------------------------------------
    catalog_selftest(api)

    # --- schema rejections ---------------------------------------------------------
    bulk_path = f"zones/{ZONE}/instances/bulkInsert"

    def rejected(name, body, must, location=None, **query):
        status, err = api.post(bulk_path, body, **query)
        e = error_of(err)
        ok = (status == 400 and e.get("status") == "INVALID_ARGUMENT" and must in e.get("message", "")
              and (location is None or any(x.get("location") == location for x in e.get("errors", []))))
        check(name, ok, (status, err))

    good = {"count": "1", "namePattern": "gw-schema-#", "instanceProperties": instance_properties()}
    rejected("unknown field -> 400 naming its path",
             dict(good, instanceProperties=instance_properties(scheduling={"provisioningModle": "SPOT"})),
             'instanceProperties.scheduling.provisioningModle', "instanceProperties.scheduling.provisioningModle")
    rejected("bad enum -> 400 listing the values",
             dict(good, instanceProperties=instance_properties(scheduling={"provisioningModel": "SPOTT"})),
             'instanceProperties.scheduling.provisioningModel: "SPOTT" is not one of FLEX_START, '
             'RESERVATION_BOUND, SPOT, STANDARD')
    rejected("int64 sent as a JSON number -> 400", dict(good, count=1),
             "count: 1 is a JSON number, but int64 fields are JSON strings", "count")
    rejected("int64 inside an array item -> 400",
             dict(good, instanceProperties=instance_properties(
                 disks=[{"boot": True, "initializeParams": {"diskSizeGb": 200}}])),
             "instanceProperties.disks[0].initializeParams.diskSizeGb: 200 is a JSON number")
    rejected("wrong type in a map value -> 400",
             dict(good, instanceProperties=instance_properties(labels={"n": 3})),
             "instanceProperties.labels.n: expected a string, got a number 3")
    rejected("int32 sent as a string -> 400",
             dict(good, instanceProperties=instance_properties(
                 guestAccelerators=[{"acceleratorType": "nvidia-tesla-a100", "acceleratorCount": "1"}])),
             "acceleratorCount: expected an integer")
    rejected("pattern of a metadata key -> 400",
             dict(good, instanceProperties=instance_properties(metadata={"items": [{"key": "bad key!",
                                                                                    "value": "x"}]})),
             "instanceProperties.metadata.items[0].key")
    rejected("unknown query parameter -> 400", good, 'Unknown name "requestID"', requestID=str(uuid.uuid4()))
    rejected("requestId that is no UUID -> 400", good, "requestId", requestId="not-a-uuid")
    status, err = api.get(f"zones/{ZONE}/instances/Bad_Name")
    check("path parameter against its pattern -> 400",
          status == 400 and "instance" in error_of(err).get("message", ""), (status, err))
    status, err = api.get(f"zones/{ZONE}/instances", maxResults="lots")
    check("uint32 query parameter that is no number -> 400", status == 400, (status, err))
    status, err = api.post(f"zones/{ZONE}/instances", {
        "machineType": f"zones/{ZONE}/machineTypes/e2-standard-2",
        "disks": [{"boot": True, "initializeParams": {"sourceImage": "x"}}]})
    check("instances.insert without name: required field -> 400",
          status == 400 and "Required field 'name' not specified" in error_of(err).get("message", ""), err)
    status, err, _ = http(endpoint, "POST", f"/compute/v1/projects/{PROJECT}/{bulk_path}", b"{not json")
    check("a body that is not JSON -> 400", status == 400, (status, err))
    status, listed = api.get(f"zones/{ZONE}/instances")
    check("rejected calls created nothing (an empty list has no `items`, as on GCE)",
          status == 200 and "items" not in listed, listed)

    # --- bulkInsert, operations, requestId -----------------------------------------
    request_id = str(uuid.uuid4())
    body = {"count": "4", "minCount": "4", "namePattern": "gw-abc-####",
            "instanceProperties": instance_properties(labels={"gangway-cluster": "abc", "role": "worker"})}
    status, op = api.post(bulk_path, body, requestId=request_id)
    check("bulkInsert answers a PENDING zone operation",
          status == 200 and op["status"] == "PENDING" and op["operationType"] == "bulkInsert"
          and op["zone"].endswith(f"/zones/{ZONE}") and op["clientOperationId"] == request_id, op)
    status, listed = api.get(f"zones/{ZONE}/instances", filter='labels.gangway-cluster = "abc"')
    check("instances exist at once, PROVISIONING",
          [i["status"] for i in listed.get("items", [])] == ["PROVISIONING"] * 4, listed)
    status, again = api.post(bulk_path, body, requestId=request_id)
    check("same requestId: the same operation", status == 200 and again["name"] == op["name"], again)
    polled = api.op_get(op)
    status, inst = api.get(f"zones/{ZONE}/instances/gw-abc-0001")
    check("first GET of the operation: RUNNING, instance STAGING",
          polled["status"] == "RUNNING" and inst["status"] == "STAGING", (polled["status"], inst.get("status")))
    done, _ = api.until_done(polled)
    check("second GET: DONE without error",
          done["status"] == "DONE" and "error" not in done and done["progress"] == 100, done)
    status, listed = api.get(f"zones/{ZONE}/instances", filter="labels.gangway-cluster=abc")
    names = [i["name"] for i in listed.get("items", [])]
    check("namePattern gw-abc-#### made gw-abc-0001..0004, all RUNNING",
          names == [f"gw-abc-000{n}" for n in range(1, 5)]
          and all(i["status"] == "RUNNING" for i in listed.get("items", [])), listed)
    status, again = api.post(bulk_path, body, requestId=request_id)
    status, listed = api.get(f"zones/{ZONE}/instances")
    check("repeating the requestId after DONE creates nothing more",
          again["name"] == op["name"] and again["status"] == "DONE" and len(listed["items"]) == 4, again)
    nat_ips = [i["networkInterfaces"][0]["accessConfigs"][0]["natIP"] for i in listed.get("items", [])]
    internal_ips = [i["networkInterfaces"][0]["networkIP"] for i in listed.get("items", [])]
    check("distinct natIPs (203.0.113.x) and 10.x networkIPs",
          len(set(nat_ips)) == 4 and all(ip.startswith("203.0.113.") for ip in nat_ips)
          and len(set(internal_ips)) == 4 and all(ip.startswith("10.") for ip in internal_ips),
          (nat_ips, internal_ips))
    first = listed["items"][0]
    check("instances carry machine type URL, bundled GPU, disk size, metadata, tags",
          first["machineType"].endswith(f"/zones/{ZONE}/machineTypes/a2-highgpu-1g")
          and first["guestAccelerators"][0]["acceleratorType"].endswith("/acceleratorTypes/nvidia-tesla-a100")
          and first["disks"][0]["diskSizeGb"] == "200"
          and first["metadata"]["items"][0]["key"] == "ssh-keys"
          and first["tags"]["items"] == ["gangway-selftest"], first)
    status, more = api.post(bulk_path, dict(body, count="1", minCount="1"))
    api.until_done(more)
    check("namePattern continues after the largest number in use",
          api.get(f"zones/{ZONE}/instances/gw-abc-0005")[0] == 200)
    status, waited = api.post(f"zones/{ZONE}/operations/{op['name']}/wait")
    check("zoneOperations.wait answers DONE", status == 200 and waited["status"] == "DONE", waited)
    status, page1 = api.get(f"zones/{ZONE}/instances", maxResults="2")
    status, page2 = api.get(f"zones/{ZONE}/instances", maxResults="2", pageToken=page1.get("nextPageToken"))
    status, page3 = api.get(f"zones/{ZONE}/instances", maxResults="2", pageToken=page2.get("nextPageToken"))
    check("maxResults / pageToken paging",
          [len(p["items"]) for p in (page1, page2, page3)] == [2, 2, 1] and "nextPageToken" not in page3,
          [p.get("nextPageToken") for p in (page1, page2, page3)])

    # --- list filters ------------------------------------------------------------------
    def names_for(filter_text, zone=ZONE):
        status, listed = api.get(f"zones/{zone}/instances", filter=filter_text)
        return [i["name"] for i in listed.get("items", [])] if status == 200 else (status, listed)

    check("filter name = \"...\"", names_for('name = "gw-abc-0002"') == ["gw-abc-0002"])
    check("filter labels.a = \"x\" AND labels.b = \"y\"",
          len(names_for('labels.gangway-cluster = "abc" AND labels.role = "worker"')) == 5)
    check("filter (a) (b): implicit AND",
          names_for('(labels.gangway-cluster = abc) (name = gw-abc-0003)') == ["gw-abc-0003"])
    check("filter labels.role != worker", names_for("labels.role != worker") == [])
    check("filter labels.role:* (key exists)", len(names_for("labels.role:*")) == 5)
    check("filter name eq regex", names_for("name eq gw-abc-000[12]") == ["gw-abc-0001", "gw-abc-0002"])
    check("filter status = RUNNING and zone = <name> (URL field)",
          len(names_for(f"status = RUNNING AND zone = {ZONE}")) == 5)
    check("filter OR", names_for('name = gw-abc-0001 OR name = gw-abc-0004') == ["gw-abc-0001", "gw-abc-0004"])
    status, err = api.get(f"zones/{ZONE}/instances", filter="nosuchfield = 1")
    check("filter on an unknown field: 400", status == 400, (status, err))
    status, agg = api.get("aggregated/instances", filter="labels.gangway-cluster = abc")
    scope = agg.get("items", {}).get(f"zones/{ZONE}", {})
    check("aggregatedList: instances under zones/ZONE, warnings elsewhere",
          len(scope.get("instances", [])) == 5
          and agg["items"]["zones/us-east1-b"]["warning"]["code"] == "NO_RESULTS_ON_PAGE", agg)

    # --- failed operations and faults --------------------------------------------------
    status, rule = control(endpoint, "POST", "fault", {
        "method": "instances.bulkInsert", "zone": "us-central1-b", "contains": "gw-fault",
        "operation_error": "ZONE_RESOURCE_POOL_EXHAUSTED"})
    check("fault rule (failed operation) added", status == 201 and rule["kind"] == "operation", rule)
    fault_body = dict(body, namePattern="gw-fault-##", count="3", minCount="3")
    status, op = api.post("zones/us-central1-b/instances/bulkInsert", fault_body)
    done, statuses = api.until_done(op)
    errors = (done.get("error") or {}).get("errors", [])
    check("failed operation: PENDING -> RUNNING -> DONE with error.errors[{code, message}]",
          statuses == ["PENDING", "RUNNING", "DONE"] and errors
          and errors[0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
          and "us-central1-b" in errors[0]["message"] and done["httpErrorStatusCode"] == 503,
          (statuses, done))
    status, listed = api.get("zones/us-central1-b/instances")
    check("all or nothing: the failed bulkInsert created no instance", listed.get("items", []) == [], listed)
    status, fired = control(endpoint, "GET", "fired")
    check("/_gangway/fired lists the fired fault",
          [(f["method"], f["code"]) for f in fired["fired"]] == [("instances.bulkInsert",
                                                                    "ZONE_RESOURCE_POOL_EXHAUSTED")], fired)
    status, op = api.post("zones/us-central1-b/instances/bulkInsert", fault_body)
    done, _ = api.until_done(op)
    status, listed = api.get("zones/us-central1-b/instances")
    check("the rule fired once; the retry creates all 3",
          "error" not in done and len(listed["items"]) == 3, (done, listed))

    status, rule = control(endpoint, "POST", "fault", {
        "method": "compute.instances.insert", "contains": "gw-sync", "http_status": 503, "times": 2})
    single = {"name": "gw-sync-1", "machineType": f"zones/{ZONE}/machineTypes/n1-standard-8",
              "guestAccelerators": [{"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4",
                                     "acceleratorCount": 1}],
              "disks": [{"boot": True, "initializeParams": {"sourceImage": "x"}}],
              "networkInterfaces": [{}],
              "scheduling": {"onHostMaintenance": "TERMINATE"}}
    outcomes = [api.post(f"zones/{ZONE}/instances", single)[0] for _ in range(3)]
    status, err = control(endpoint, "GET", "faults")
    check("synchronous fault: 503 twice, then the call goes through",
          outcomes == [503, 503, 200] and [r for r in err["rules"] if r["id"] == rule["id"]][0]["fired"] == 2,
          outcomes)
    status, rule = control(endpoint, "POST", "fault", {
        "method": "instances.insert", "http_status": 403, "reason": "quotaExceeded",
        "message": "Quota 'NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region us-central1.", "contains": "gw-quota"})
    status, err = api.post(f"zones/{ZONE}/instances", dict(single, name="gw-quota-1"))
    e = error_of(err)
    check("synchronous fault is a Google JSON error with reason and status",
          status == 403 and e["code"] == 403 and e["errors"][0]["reason"] == "quotaExceeded"
          and e["errors"][0]["domain"] == "global" and e["status"] == "PERMISSION_DENIED"
          and "NVIDIA_T4_GPUS" in e["message"], err)
    status, inst = api.get(f"zones/{ZONE}/instances/gw-sync-1")
    check("insert: n1 + T4 with a partial machine type URL",
          status == 200 and inst["guestAccelerators"][0]["acceleratorCount"] == 1
          and "accessConfigs" not in inst["networkInterfaces"][0], inst)
    status, err = api.post(f"zones/{ZONE}/instances", single)
    check("insert of an existing name: 409 alreadyExists",
          status == 409 and error_of(err)["errors"][0]["reason"] == "alreadyExists", err)
    status, err = api.post(f"zones/{ZONE}/instances", dict(single, name="gw-bare", machineType="n1-standard-8"))
    check("insert with a bare machine type name: 400", status == 400, err)
    status, err = api.post(f"zones/{ZONE}/instances", dict(single, name="gw-mig", scheduling={
        "onHostMaintenance": "MIGRATE"}))
    check("GPU instance with onHostMaintenance MIGRATE: 400",
          status == 400 and "live migration" in error_of(err)["message"], err)
    status, err = api.post(bulk_path, dict(good, instanceProperties=instance_properties(
        labels={"Cluster": "x"})))
    check("label key with capitals: 400", status == 400 and "Label key 'Cluster'" in error_of(err)["message"], err)
    status, err = api.post(bulk_path, dict(good, instanceProperties=instance_properties(
        scheduling={"provisioningModel": "SPOT", "automaticRestart": True})))
    check("Spot with automaticRestart true: 400", status == 400, err)
    status, op = api.post(bulk_path, dict(good, instanceProperties=instance_properties(
        machineType=f"zones/{ZONE}/machineTypes/a2-highgpu-1g")))
    done, _ = api.until_done(op)
    check("bulkInsert with a machine type URL: failed operation INTERNAL_ERROR (as documented)",
          done["error"]["errors"][0]["code"] == "INTERNAL_ERROR", done)

    # --- capacity: all or nothing, minCount ---------------------------------------------
    control(endpoint, "POST", "capacity", {"zone": "us-central1-c", "machineType": "a2-highgpu-8g",
                                          "available": 3})
    cap_body = {"count": "4", "namePattern": "gw-cap-#",
                "instanceProperties": instance_properties(machineType="a2-highgpu-8g")}
    done, _ = api.until_done(api.post("zones/us-central1-c/instances/bulkInsert", cap_body)[1])
    listed = api.get("zones/us-central1-c/instances")[1]
    check("capacity 3, count 4: failed operation, no instances",
          done["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED" and listed.get("items", []) == [],
          (done, listed))
    done, _ = api.until_done(api.post("zones/us-central1-c/instances/bulkInsert",
                                      dict(cap_body, minCount="2"))[1])
    listed = api.get("zones/us-central1-c/instances")[1]
    check("capacity 3, count 4, minCount 2: 3 instances",
          "error" not in done and len(listed["items"]) == 3
          and done["instancesBulkInsertOperationMetadata"]["perLocationStatus"]["zones/us-central1-c"][
              "createdVmCount"] == 3, (done, listed))

    # --- stop / start / delete -----------------------------------------------------------
    inst_path = f"zones/{ZONE}/instances/gw-abc-0005"
    status, op = api.post(inst_path + "/stop")
    check("stop: instance STOPPING while the operation runs",
          op["operationType"] == "stop" and api.get(inst_path)[1]["status"] == "STOPPING", op)
    api.until_done(op)
    check("stop: TERMINATED once DONE", api.get(inst_path)[1]["status"] == "TERMINATED")
    done, _ = api.until_done(api.post(inst_path + "/start")[1])
    check("start: RUNNING once DONE", api.get(inst_path)[1]["status"] == "RUNNING")
    status, op = api.delete(inst_path)
    check("delete: STOPPING while the operation runs", api.get(inst_path)[1]["status"] == "STOPPING", op)
    api.until_done(op)
    check("delete: 404 once DONE", api.get(inst_path)[0] == 404)
    control(endpoint, "POST", "settings", {"op_polls": 0})
    status, op = api.delete(f"zones/{ZONE}/instances/gw-abc-0004")
    check("op_polls 0: operations DONE at once", op["status"] == "DONE"
          and api.get(f"zones/{ZONE}/instances/gw-abc-0004")[0] == 404, op)
    control(endpoint, "POST", "settings", {"op_polls": 2, "op_auto_done_s": 0.5})
    status, op = api.post(f"zones/{ZONE}/instances/gw-abc-0003/stop")
    time.sleep(1.0)
    check("op_auto_done_s: DONE after the deadline without polling",
          api.get(f"zones/{ZONE}/instances/gw-abc-0003")[1]["status"] == "TERMINATED")
    control(endpoint, "POST", "settings", {"op_auto_done_s": 3.0})

    # --- preemption and the metadata server -------------------------------------------------
    spot = {"count": "2", "namePattern": "gw-spot-#", "instanceProperties": instance_properties(
        machineType="g2-standard-8",
        scheduling={"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"})}
    api.until_done(api.post(bulk_path, spot)[1])
    spot_del = dict(spot, namePattern="gw-spotdel-#", count="1", instanceProperties=instance_properties(
        machineType="g2-standard-8",
        scheduling={"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}))
    api.until_done(api.post(bulk_path, spot_del)[1])

    status, server = control(endpoint, "POST", "metadata-server", {"instance": "gw-spot-1"})
    meta = "http://" + server["host"]
    flavor = {"Metadata-Flavor": "Google"}
    status, text, _ = http(meta, "GET", "/computeMetadata/v1/instance/preempted")
    check("metadata server without Metadata-Flavor: 403", status == 403, (status, text))
    status, text, headers = http(meta, "GET", "/computeMetadata/v1/instance/preempted", headers=flavor)
    check("metadata instance/preempted: FALSE with an ETag",
          status == 200 and text == "FALSE" and headers.get("ETag") and headers.get("Metadata-Flavor") == "Google",
          (status, text, dict(headers)))
    etag = headers.get("ETag")
    t0 = time.monotonic()
    status, text, _ = http(meta, "GET", "/computeMetadata/v1/instance/preempted?wait_for_change=true&timeout_sec=1",
                           headers=flavor)
    check("wait_for_change with timeout_sec: FALSE after ~1 s",
          text == "FALSE" and 0.8 < time.monotonic() - t0 < 3, (text, time.monotonic() - t0))
    status, text, _ = http(meta, "GET", "/computeMetadata/v1/instance/name", headers=flavor)
    check("metadata instance/name", text == "gw-spot-1", text)
    status, text, _ = http(meta, "GET", "/computeMetadata/v1/instance/attributes/ssh-keys", headers=flavor)
    check("metadata instance/attributes/KEY from the instance's metadata", text.startswith("gangway:"), text)

    waited = {}

    def long_poll():
        t = time.monotonic()
        waited["answer"] = http(meta, "GET", "/computeMetadata/v1/instance/preempted?wait_for_change=true"
                                f"&last_etag={etag}", headers=flavor, timeout=30)
        waited["seconds"] = time.monotonic() - t

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(0.5)
    check("the long poll blocks until something changes", poller.is_alive())
    status, preempted = control(endpoint, "POST", "preempt", {"instance": "gw-spot-1"})
    poller.join(10)
    answer = waited.get("answer", (None, None, {}))
    check("preempt (STOP): the long poll answers TRUE with a new ETag",
          answer[1] == "TRUE" and answer[2].get("ETag") != etag, (answer[:2], waited.get("seconds")))
    status, inst = api.get(f"zones/{ZONE}/instances/gw-spot-1")
    check("preempt (STOP): the instance is TERMINATED", inst["status"] == "TERMINATED", inst)
    status, ops = api.get(f"zones/{ZONE}/operations", filter='operationType = "compute.instances.preempted"')
    check("preempt: a compute.instances.preempted zone operation is listed",
          [o["targetLink"].rsplit("/", 1)[1] for o in ops["items"]] == ["gw-spot-1"]
          and ops["items"][0]["status"] == "DONE", ops)
    status, text, _ = http(endpoint, "GET", "/_gangway/metadata/gw-spot-2/computeMetadata/v1/instance/preempted",
                           headers=flavor)
    check("per-instance path prefix: the other spot VM is not preempted", text == "FALSE", text)
    control(endpoint, "POST", "metadata-default", {"instance": "gw-spot-1"})
    status, text, _ = http(endpoint, "GET", "/computeMetadata/v1/instance/preempted", headers=flavor)
    check("plain path on the main port serves the default instance", text == "TRUE", text)
    api.until_done(api.post(f"zones/{ZONE}/instances/gw-spot-1/start")[1])
    status, text, _ = http(meta, "GET", "/computeMetadata/v1/instance/preempted", headers=flavor)
    check("start after preemption: RUNNING and preempted FALSE again",
          api.get(f"zones/{ZONE}/instances/gw-spot-1")[1]["status"] == "RUNNING" and text == "FALSE", text)
    status, err = control(endpoint, "POST", "preempt", {"instance": "gw-abc-0001"})
    check("preempting a standard VM needs force", status == 400, err)

    status, server = control(endpoint, "POST", "metadata-server", {"instance": "gw-spotdel-1"})
    meta_del = "http://" + server["host"]
    status, preempted = control(endpoint, "POST", "preempt", {"instance": "gw-spotdel-1", "zone": ZONE})
    check("preempt (DELETE): action DELETE", preempted.get("action") == "DELETE", preempted)
    status, err = api.get(f"zones/{ZONE}/instances/gw-spotdel-1")
    check("preempt (DELETE): the instance is gone (404)", status == 404, (status, err))
    status, text, _ = http(meta_del, "GET", "/computeMetadata/v1/instance/preempted", headers=flavor)
    check("preempt (DELETE): its metadata server still says TRUE", text == "TRUE", text)
    status, ops = api.get(f"zones/{ZONE}/operations", filter="operationType = compute.instances.preempted")
    check("preempt (DELETE): a second preempted operation",
          sorted(o["targetLink"].rsplit("/", 1)[1] for o in ops["items"]) == ["gw-spot-1", "gw-spotdel-1"], ops)

    status, preempted = control(endpoint, "POST", "preempt", {"instance": "gw-spot-2", "grace_s": 0.6})
    check("preempt with grace_s: STOPPING during the grace period",
          api.get(f"zones/{ZONE}/instances/gw-spot-2")[1]["status"] == "STOPPING")
    time.sleep(1.0)
    check("preempt with grace_s: TERMINATED after it",
          api.get(f"zones/{ZONE}/instances/gw-spot-2")[1]["status"] == "TERMINATED")

    # --- nat IP prefix -------------------------------------------------------------------
    control(endpoint, "POST", "settings", {"nat_ip_prefix": "127.0.40."})
    done, _ = api.until_done(api.post(bulk_path, dict(good, namePattern="gw-lo-#", count="2"))[1])
    ips = [api.get(f"zones/{ZONE}/instances/gw-lo-{n}")[1]["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
           for n in (1, 2)]
    check("nat_ip_prefix 127.0.40.: loopback natIPs", ips == ["127.0.40.1", "127.0.40.2"], ips)
    status, inst = control(endpoint, "POST", "nat-ip", {"instance": "gw-lo-2", "natIP": "127.0.0.1"})
    check("/_gangway/nat-ip sets one instance's natIP",
          api.get(f"zones/{ZONE}/instances/gw-lo-2")[1]["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
          == "127.0.0.1", inst)

    # --- guest attributes: the host keys ------------------------------------------------
    guest_attributes_selftest(endpoint, api, bulk_path)

    # --- resource policies ---------------------------------------------------------------
    policy_path = f"regions/{REGION}/resourcePolicies"
    policy = {"name": "gw-compact", "groupPlacementPolicy": {"collocation": "COLLOCATED", "vmCount": 4}}
    status, op = api.post(policy_path, policy, requestId=str(uuid.uuid4()))
    check("resourcePolicies.insert: a region operation",
          status == 200 and op["region"].endswith(f"/regions/{REGION}") and op["operationType"] == "insert", op)
    done, statuses = api.until_done(op)
    check("region operation: PENDING -> RUNNING -> DONE", statuses == ["PENDING", "RUNNING", "DONE"], statuses)
    status, got = api.get(f"{policy_path}/gw-compact")
    check("resourcePolicies.get", status == 200 and got["groupPlacementPolicy"]["collocation"] == "COLLOCATED"
          and got["status"] == "READY", got)
    status, listed = api.get(policy_path)
    check("resourcePolicies.list", [p["name"] for p in listed["items"]] == ["gw-compact"], listed)
    status, agg = api.get("aggregated/resourcePolicies", filter="name = gw-compact")
    check("resourcePolicies.aggregatedList: by region scope, the policy only in its region",
          status == 200 and agg["kind"] == "compute#resourcePolicyAggregatedList"
          and [s for s, v in agg["items"].items() if "resourcePolicies" in v] == [f"regions/{REGION}"]
          and agg["items"][f"regions/{REGION}"]["resourcePolicies"][0]["name"] == "gw-compact"
          and all("warning" in v for s, v in agg["items"].items() if s != f"regions/{REGION}"),
          (status, agg))
    status, err = api.post(policy_path, {"name": "gw-compact", "groupPlacementPolicy": {"collocation": "COLLOCATE"}})
    check("resource policy with a bad collocation enum: 400", status == 400, err)
    compact = {"count": "4", "namePattern": "gw-pg-#", "instanceProperties": instance_properties(
        machineType="a3-highgpu-8g", resourcePolicies=["gw-compact"])}
    api.until_done(api.post(bulk_path, compact)[1])
    hosts = [api.get(f"zones/{ZONE}/instances/gw-pg-{n}")[1].get("resourceStatus", {}).get("physicalHost", "")
             for n in range(1, 5)]
    blocks = [h.split("/")[1:3] for h in hosts]
    check("COLLOCATED policy: physicalHost /BLOCK/SUBBLOCK/HOST, pairs share a sub-block",
          all(len(h.split("/")) == 4 for h in hosts) and blocks[0] == blocks[1] and blocks[2] == blocks[3]
          and blocks[0] != blocks[2] and blocks[0][0] == blocks[2][0] and len(set(hosts)) == 4, hosts)
    check("no physicalHost without a COLLOCATED policy",
          "resourceStatus" not in api.get(f"zones/{ZONE}/instances/gw-abc-0001")[1])
    status, err = api.post(bulk_path, dict(compact, namePattern="gw-nopol-#", instanceProperties=instance_properties(
        resourcePolicies=["no-such-policy"])))
    check("an unknown resource policy: 404", status == 404, err)
    status, err = api.post(bulk_path, dict(compact, namePattern="gw-n1pol-#", instanceProperties=instance_properties(
        machineType="n1-standard-8", resourcePolicies=["gw-compact"],
        guestAccelerators=[{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}])))
    check("a COLLOCATED policy on an N1 gang: 400 invalid, naming the machine type, nothing made",
          status == 400 and error_of(err)["errors"][0]["reason"] == "invalid"
          and "n1-standard-8" in error_of(err)["message"]
          and api.get(f"zones/{ZONE}/instances/gw-n1pol-1")[0] == 404, err)
    status, err = api.delete(f"{policy_path}/gw-compact")
    check("deleting a policy in use: 400 resourceInUseByAnotherResource",
          status == 400 and error_of(err)["errors"][0]["reason"] == "resourceInUseByAnotherResource", err)
    for n in range(1, 5):
        api.until_done(api.delete(f"zones/{ZONE}/instances/gw-pg-{n}")[1])
    done, _ = api.until_done(api.delete(f"{policy_path}/gw-compact")[1])
    check("resourcePolicies.delete once unused, then 404",
          "error" not in done and api.get(f"{policy_path}/gw-compact")[0] == 404, done)

    # --- firewalls --------------------------------------------------------------------------
    firewall = {"name": "gw-ssh", "network": "global/networks/default", "direction": "INGRESS",
                "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}], "sourceRanges": ["0.0.0.0/0"],
                "targetTags": ["gangway-selftest"]}
    status, op = api.post("global/firewalls", firewall, requestId=str(uuid.uuid4()))
    check("firewalls.insert: a global operation",
          status == 200 and "zone" not in op and "region" not in op and "/global/operations/" in op["selfLink"], op)
    done, statuses = api.until_done(op)
    check("global operation: PENDING -> RUNNING -> DONE", statuses == ["PENDING", "RUNNING", "DONE"], statuses)
    status, got = api.get("global/firewalls/gw-ssh")
    check("firewalls.get: priority 1000, network URL",
          status == 200 and got["priority"] == 1000 and got["network"].endswith("/global/networks/default"), got)
    status, listed = api.get("global/firewalls", filter="name = gw-ssh")
    check("firewalls.list with a name filter", [f["name"] for f in listed["items"]] == ["gw-ssh"], listed)
    status, err = api.post("global/firewalls", dict(firewall, priority="1000"))
    check("firewall priority as a string (int32): 400", status == 400, err)
    status, err = api.post("global/firewalls", firewall)
    check("firewalls.insert of an existing name: 409", status == 409, err)
    status, waited = api.post(f"global/operations/{api.delete('global/firewalls/gw-ssh')[1]['name']}/wait")
    check("globalOperations.wait, then the firewall is gone",
          waited["status"] == "DONE" and api.get("global/firewalls/gw-ssh")[0] == 404, waited)

    # --- many clients at once (parallel tests share one server) ------------------------
    answers = []

    def one_call():
        try:
            answers.append(http(endpoint, "GET", f"/compute/v1/projects/{PROJECT}/zones?$alt=json")[0])
        except OSError as err:
            answers.append(repr(err))

    callers = [threading.Thread(target=one_call) for _ in range(60)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(30)
    check("60 clients connecting at once are all answered", answers == [200] * 60,
          [a for a in answers if a != 200][:5])

    # --- the Cloud Billing Catalog ---------------------------------------------------------
    billing_selftest(endpoint, billing_schema)

    # --- kill points (the fault sweep) -----------------------------------------------------
    kill_points_selftest(endpoint, api)

    # --- state, reset -----------------------------------------------------------------------
    status, state = control(endpoint, "GET", "state")
    check("/_gangway/state lists instances", status == 200 and len(state["instances"]) > 5, status)
    control(endpoint, "POST", "reset")
    status, listed = api.get(f"zones/{ZONE}/instances")
    status_ops, ops = api.get(f"zones/{ZONE}/operations")
    status_f, faults = control(endpoint, "GET", "faults")
    check("reset clears instances, operations and faults",
          listed.get("items", []) == [] and ops.get("items", []) == [] and faults["rules"] == [], (listed, ops, faults))
    control(endpoint, "POST", "billing", {"fail": 403})
    control(endpoint, "POST", "reset")
    status, billing = control(endpoint, "GET", "billing")
    check("reset clears the billing failure and count",
          billing.get("fail") is None and billing.get("calls") == 0
          and http(endpoint, "GET", SKUS_PATH)[0] == 200, billing)


def host_key_line(key_type, comment="root@selftest"):
    """An OpenSSH public key line of `key_type` with a random key: the
    blob's fields in the wire format (RFC 4253 section 6.6), random bytes
    where the key material goes (nothing here checks the curve)."""
    def string(data):
        return len(data).to_bytes(4, "big") + data
    fields = [key_type.encode()]
    if key_type == "ssh-ed25519":
        fields.append(os.urandom(32))
    elif key_type.startswith("ecdsa-sha2-"):
        fields += [key_type.rsplit("-", 1)[1].encode(), b"\x04" + os.urandom(64)]
    else:
        fields += [b"\x01\x00\x01", b"\x00" + os.urandom(256)]
    blob = b"".join(string(f) for f in fields)
    return f"{key_type} {base64.b64encode(blob).decode()} {comment}"


def guest_attributes_selftest(endpoint, api, bulk_path):
    """instances.getGuestAttributes: the hostkeys/ namespace as the guest
    agent writes it, for RUNNING instances that enable guest attributes."""
    ed, ecdsa, rsa = (host_key_line(t) for t in ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"))
    blob = {line.split()[0]: line.split()[1] for line in (ed, ecdsa, rsa)}
    for bad, why in ((["ssh-dss AAAAB3NzaC1kc3M="], "unknown key type"),
                     (["ssh-ed25519 not*base64"], "is not base64"),
                     (["ssh-rsa " + blob["ssh-ed25519"]], "is not a ssh-rsa key"),
                     ([ed, host_key_line("ssh-ed25519")], "two ssh-ed25519 keys"),
                     ("ssh-ed25519 AAAA", "is a list")):
        status, err = control(endpoint, "POST", "settings", {"host_keys": bad})
        check(f"guest attributes: a bad host_keys setting is refused (400, {why})",
              status == 400 and why in error_of(err).get("message", ""), (status, err))
    status, settings = control(endpoint, "POST", "settings", {"host_keys": [ed, ecdsa]})
    check("guest attributes: the host_keys setting takes OpenSSH lines",
          status == 200 and settings["host_keys"] == [ed, ecdsa], settings)

    enabled = instance_properties(metadata={"items": [
        {"key": "ssh-keys", "value": "gangway:ssh-ed25519 AAAA test"},
        {"key": "enable-guest-attributes", "value": "TRUE"}]})
    status, op = api.post(bulk_path, {"count": "1", "namePattern": "gw-ga-#", "instanceProperties": enabled})
    path = f"zones/{ZONE}/instances/gw-ga-1/getGuestAttributes"
    status, err = api.get(path, queryPath="hostkeys/")
    check("guest attributes: not RUNNING yet, hostkeys/ is 404 Guest Attribute not found",
          status == 404 and error_of(err).get("message")
          == "The resource 'hostkeys/' of type 'Guest Attribute' was not found."
          and error_of(err)["errors"][0]["reason"] == "notFound", (status, err))
    api.until_done(op)
    items = [{"namespace": "hostkeys", "key": "ssh-ed25519", "value": blob["ssh-ed25519"]},
             {"namespace": "hostkeys", "key": "ecdsa-sha2-nistp256", "value": blob["ecdsa-sha2-nistp256"]}]
    status, got = api.get(path, queryPath="hostkeys/")
    check("guest attributes: RUNNING, queryPath=hostkeys/ answers the keys (type as key, base64 blob as value)",
          status == 200 and got.get("kind") == "compute#guestAttributes" and got.get("queryPath") == "hostkeys/"
          and got.get("queryValue", {}).get("items") == items, (status, got))
    status, bare = api.get(path, queryPath="hostkeys")
    status_all, every = api.get(path)
    status_one, one = api.get(path, queryPath="hostkeys/ssh-ed25519")
    check("guest attributes: queryPath hostkeys (no slash), none at all, NS/KEY",
          (status, status_all, status_one) == (200, 200, 200)
          and bare["queryValue"]["items"] == items and every["queryValue"]["items"] == items
          and "queryPath" not in every and one["queryValue"]["items"] == items[:1], (bare, every, one))
    status, var = api.get(path, variableKey="hostkeys/ssh-ed25519")
    check("guest attributes: variableKey answers variableKey and variableValue",
          status == 200 and var == {"kind": "compute#guestAttributes", "variableKey": "hostkeys/ssh-ed25519",
                                    "variableValue": blob["ssh-ed25519"]}, (status, var))
    status, err = api.get(path, variableKey="hostkeys/ssh-rsa")
    status_ns, err_ns = api.get(path, queryPath="other/")
    check("guest attributes: a key or namespace nobody wrote is 404 naming it",
          (status, status_ns) == (404, 404)
          and "'hostkeys/ssh-rsa' of type 'Guest Attribute'" in error_of(err)["message"]
          and "'other/' of type 'Guest Attribute'" in error_of(err_ns)["message"], (err, err_ns))
    status, err = api.get(path, queryPath="hostkeys/", fooBar="1")
    check("guest attributes: the request is schema-checked (an unknown parameter is 400)",
          status == 400 and "fooBar" in error_of(err)["message"], (status, err))

    # One instance's own keys (a replaced key), then back to the setting.
    status, own = control(endpoint, "POST", "host-keys", {"instance": "gw-ga-1", "host_keys": [rsa]})
    status_get, got = api.get(path, queryPath="hostkeys/")
    check("guest attributes: /_gangway/host-keys gives one instance its own (a replaced key)",
          status == 200 and own["own"] is True and status_get == 200
          and got["queryValue"]["items"] == [{"namespace": "hostkeys", "key": "ssh-rsa", "value": blob["ssh-rsa"]}],
          (own, got))
    status, own = control(endpoint, "POST", "host-keys", {"instance": "gw-ga-1", "host_keys": None})
    check("guest attributes: host_keys null goes back to the setting",
          status == 200 and own["host_keys"] == [ed, ecdsa]
          and api.get(path, queryPath="hostkeys/")[1]["queryValue"]["items"] == items, own)
    status, err = control(endpoint, "POST", "host-keys", {"instance": "gw-nobody", "host_keys": [ed]})
    status_bad, err_bad = control(endpoint, "POST", "host-keys", {"instance": "gw-ga-1", "host_keys": ["x"]})
    check("guest attributes: host-keys of an unknown instance 404, of a bad line 400",
          (status, status_bad) == (404, 400), (err, err_bad))

    # Stopped: nothing; started again: the keys.
    api.until_done(api.post(f"zones/{ZONE}/instances/gw-ga-1/stop")[1])
    stopped = api.get(path, queryPath="hostkeys/")[0]
    api.until_done(api.post(f"zones/{ZONE}/instances/gw-ga-1/start")[1])
    started = api.get(path, queryPath="hostkeys/")[0]
    check("guest attributes: TERMINATED 404, RUNNING again 200", (stopped, started) == (404, 200),
          (stopped, started))

    # Guest attributes not enabled; an unknown instance; no keys set; a fault.
    status, err = api.get(f"zones/{ZONE}/instances/gw-lo-1/getGuestAttributes", queryPath="hostkeys/")
    check("guest attributes: without enable-guest-attributes TRUE, 403 saying so",
          status == 403 and "enable-guest-attributes" in error_of(err).get("message", "")
          and error_of(err).get("status") == "PERMISSION_DENIED", (status, err))
    status, err = api.get(f"zones/{ZONE}/instances/gw-nobody/getGuestAttributes", queryPath="hostkeys/")
    check("guest attributes: an unknown instance is 404 (the instance)",
          status == 404 and "instances/gw-nobody" in error_of(err).get("message", ""), (status, err))
    control(endpoint, "POST", "settings", {"host_keys": []})
    status, err = api.get(path, queryPath="hostkeys/")
    check("guest attributes: no host keys set, hostkeys/ is 404 (the agent wrote none)", status == 404, err)
    control(endpoint, "POST", "fault", {"method": "instances.getGuestAttributes", "http_status": 503})
    status, err = api.get(path, queryPath="hostkeys/")
    check("guest attributes: fault rules apply", status == 503, (status, err))
    api.until_done(api.delete(f"zones/{ZONE}/instances/gw-ga-1")[1])


def kill_points_selftest(endpoint, api):
    """/_gangway/kill: API requests numbered; the marked processes killed
    at an arrival (the request never reaches the fake) or a return (the
    work done)."""
    def victim():
        return subprocess.Popen(["sleep", "60"], env={**os.environ, "GANGWAY_SELFTEST_KILL": "victim"})

    def gone(proc):
        try:
            return proc.wait(timeout=5) == -9
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return False

    def firewall(name):
        return {"name": name, "network": "global/networks/default", "direction": "INGRESS",
                "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}], "sourceRanges": ["192.0.2.0/24"]}

    _, settings = control(endpoint, "GET", "settings")
    control(endpoint, "POST", "settings", {"op_polls": 0})  # inserts done in their answer
    status, state = control(endpoint, "POST", "kill", {"at": 0})
    api.get("zones")
    control(endpoint, "GET", "state")  # the control API: not counted
    api.get(f"zones/{ZONE}")
    _, state = control(endpoint, "GET", "kill")
    check("kill points count API requests (arrival and return each)",
          status == 200 and (state["requests"], state["points"], state["fired"]) == (2, 4, None), state)

    # Point 3: the arrival of request 2, a firewalls.insert that never happens.
    proc = victim()
    control(endpoint, "POST", "kill", {"at": 3, "marker": "GANGWAY_SELFTEST_KILL=victim"})
    api.get("zones")
    alive_after_1 = proc.poll() is None
    status, _ = api.post("global/firewalls", firewall("gw-kill-early"), requestId=str(uuid.uuid4()))
    _, state = control(endpoint, "GET", "kill")
    check("killed at the arrival of request 2: the request never reached the fake",
          alive_after_1 and gone(proc) and status == 503
          and api.get("global/firewalls/gw-kill-early")[0] == 404
          and {k: state["fired"].get(k) for k in ("point", "request", "when")}
          == {"point": 3, "request": 2, "when": "arrival"}
          and state["fired"]["call"].startswith("POST /compute/v1/projects/")
          and state["fired"]["killed"] == [proc.pid], (status, state))

    # Point 2: the return of request 1, done but not answered to the killed.
    proc = victim()
    control(endpoint, "POST", "kill", {"at": 2, "marker": "GANGWAY_SELFTEST_KILL=victim"})
    api.post("global/firewalls", firewall("gw-kill-late"), requestId=str(uuid.uuid4()))
    _, state = control(endpoint, "GET", "kill")
    check("killed at the return of request 1: the work was done",
          gone(proc) and api.get("global/firewalls/gw-kill-late")[0] == 200
          and (state["fired"]["when"], state["fired"]["killed"]) == ("return", [proc.pid]), state)
    api.delete("global/firewalls/gw-kill-late")

    status, _ = control(endpoint, "POST", "kill", {"at": 1})
    check("a kill without a marker is refused (400)", status == 400, status)
    _, removed = control(endpoint, "DELETE", "kill")
    api.get("zones")
    _, state = control(endpoint, "GET", "kill")
    check("DELETE disarms the kill points",
          removed == {"removed": 1} and (state["at"], state["requests"]) == (None, 0), (removed, state))
    control(endpoint, "POST", "settings", {"op_polls": settings["op_polls"]})


ZONES = ["asia-northeast1-a", "europe-west4-a", "europe-west4-b", "us-central1-a", "us-central1-b",
         "us-central1-c", "us-central1-f", "us-east1-b", "us-east1-c", "us-east1-d"]


def scoped(agg, key):
    """{zone: [names]} of an aggregated list page (empty scopes left out),
    and whether every empty scope carries the NO_RESULTS_ON_PAGE warning."""
    names, warned = {}, True
    for scope, entry in agg.get("items", {}).items():
        if entry.get(key):
            names[scope.split("/", 1)[1]] = [r["name"] for r in entry[key]]
        else:
            warned = warned and entry.get("warning", {}).get("code") == "NO_RESULTS_ON_PAGE"
    return names, warned


def all_pages(api, path, key, **query):
    """Every page of an aggregated list: ([(zone, name)] in order, page sizes, answers)."""
    flat, sizes, pages, token = [], [], [], None
    for _ in range(50):
        status, agg = api.get(path, pageToken=token, **query)
        if status != 200:
            return None, None, [agg]
        pages.append(agg)
        page = [(scope.split("/", 1)[1], r["name"]) for scope, entry in sorted(agg["items"].items())
                for r in entry.get(key, [])]
        flat += page
        sizes.append(len(page))
        token = agg.get("nextPageToken")
        if not token:
            break
    return flat, sizes, pages


def catalog_selftest(api):
    status, mts = api.get(f"zones/{ZONE}/machineTypes")
    by_name = {m["name"]: m for m in mts.get("items", [])}
    wanted = {"n1-standard-4": (4, 15360), "n1-standard-32": (32, 122880), "n1-standard-64": (64, 245760),
              "a2-ultragpu-1g": (12, 174080), "a3-megagpu-8g": (208, 1916928), "c3-standard-8": (8, 32768),
              "n2-standard-8": (8, 32768)}
    check("the new machine types with their vCPUs and memory",
          all(n in by_name and (by_name[n]["guestCpus"], by_name[n]["memoryMb"]) == spec
              for n, spec in wanted.items())
          and by_name["a3-megagpu-8g"]["accelerators"] == [
              {"guestAcceleratorType": "nvidia-h100-mega-80gb", "guestAcceleratorCount": 8}]
          and by_name["a2-ultragpu-1g"]["accelerators"] == [
              {"guestAcceleratorType": "nvidia-a100-80gb", "guestAcceleratorCount": 1}]
          and "accelerators" not in by_name["c3-standard-8"],
          {n: (m["guestCpus"], m["memoryMb"]) for n, m in by_name.items()})
    status, err = api.get("zones/us-central1-b/machineTypes/a3-megagpu-8g")
    check("a3-megagpu-8g is not in us-central1-b: 404", status == 404, (status, err))

    path = "aggregated/machineTypes"
    status, agg = api.get(path)
    names, warned = scoped(agg, "machineTypes")
    check("machineTypes.aggregatedList: kind, id and all ten zones",
          status == 200 and agg["kind"] == "compute#machineTypeAggregatedList"
          and agg["id"] == f"projects/{PROJECT}/aggregated/machineTypes"
          and sorted(agg["items"]) == [f"zones/{z}" for z in ZONES] and "nextPageToken" not in agg,
          (status, sorted(agg.get("items", {}))))
    check("machineTypes.aggregatedList: n1 types in every zone, a2-highgpu-1g where the A100 is",
          all({"n1-standard-4", "n1-standard-8", "n1-standard-64", "c3-standard-8"} <= set(names.get(z, []))
              for z in ZONES)
          and sorted(z for z in ZONES if "a2-highgpu-1g" in names.get(z, [])) == [
              "asia-northeast1-a", "europe-west4-a", "europe-west4-b", "us-central1-a", "us-central1-b",
              "us-central1-c", "us-central1-f", "us-east1-c"], names)
    mt = agg["items"]["zones/us-central1-a"]["machineTypes"][0]
    check("aggregated machine types are rendered like machineTypes.get",
          mt == api.get(f"zones/us-central1-a/machineTypes/{mt['name']}")[1], mt)

    regex = '(a2-highgpu-1g|n1-standard-8)'
    status, agg = api.get(path, filter=f'name eq "{regex}"')
    names, warned = scoped(agg, "machineTypes")
    check('filter name eq "(a2-highgpu-1g|n1-standard-8)": exactly those two names',
          status == 200 and len(names) == 10 and {n for ns in names.values() for n in ns}
          == {"a2-highgpu-1g", "n1-standard-8"}
          and names["us-east1-b"] == ["n1-standard-8"] and names[ZONE] == ["a2-highgpu-1g", "n1-standard-8"],
          (status, names))
    status, bare = api.get(path, filter=f"name eq {regex}")
    check("the same regex without quotes", status == 200 and scoped(bare, "machineTypes")[0] == names,
          (status, bare))
    status, agg = api.get(path, filter='name eq "n1-standard-\\d+"')
    check('filter name eq "n1-standard-\\d+" keeps its backslash',
          status == 200 and set(scoped(agg, "machineTypes")[0]["us-east1-b"])
          == {"n1-standard-4", "n1-standard-8", "n1-standard-16", "n1-standard-32", "n1-standard-64"},
          (status, agg))
    status, agg = api.get(path, filter="name = a3-megagpu-8g")
    names, warned = scoped(agg, "machineTypes")
    check("a3-megagpu-8g only in us-central1-a and europe-west4-a, NO_RESULTS_ON_PAGE elsewhere",
          sorted(names) == ["europe-west4-a", "us-central1-a"] and warned, agg)
    status, agg = api.get(path, filter="guestCpus > 100")
    names, _ = scoped(agg, "machineTypes")
    check("filter guestCpus > 100 (a number field)",
          names.get(ZONE) == ["a3-highgpu-8g", "a3-megagpu-8g"], names)
    full, _, _ = all_pages(api, path, "machineTypes", filter=f'name eq "{regex}"')
    flat, sizes, pages = all_pages(api, path, "machineTypes", filter=f'name eq "{regex}"', maxResults="7")
    check("aggregatedList paging: maxResults 7 over 18 matches is pages of 7, 7, 4 in zone order",
          sizes == [7, 7, 4] and flat == full and len(full) == 18 and "nextPageToken" not in pages[-1]
          and all(sorted(p["items"]) == [f"zones/{z}" for z in ZONES] for p in pages),
          (sizes, flat, full))
    status, err = api.get(path, pageToken="bm90LWEtbnVtYmVy")
    check("aggregatedList with a bad pageToken: 400", status == 400, (status, err))
    status, err = api.get(path, filter="nosuchfield = 1")
    check("aggregatedList filter on an unknown field: 400", status == 400, (status, err))
    status, err = api.get(path, maxResults="501")
    check("aggregatedList maxResults over 500: 400", status == 400, (status, err))

    path = "aggregated/acceleratorTypes"
    status, agg = api.get(path)
    names, _ = scoped(agg, "acceleratorTypes")
    check("acceleratorTypes.aggregatedList: kind and the zones' accelerators",
          status == 200 and agg["kind"] == "compute#acceleratorTypeAggregatedList"
          and sorted(agg["items"]) == [f"zones/{z}" for z in ZONES]
          and sorted(z for z in ZONES if "nvidia-tesla-t4" in names.get(z, [])) == [
              "asia-northeast1-a", "europe-west4-a", "europe-west4-b", "us-central1-a", "us-central1-b",
              "us-central1-c", "us-central1-f", "us-east1-b", "us-east1-c", "us-east1-d"]
          and not {"us-east1-b", "us-east1-d", "asia-northeast1-a"} & {
              z for z in ZONES if "nvidia-tesla-v100" in names.get(z, [])}, names)
    status, agg = api.get(path, filter='name eq "nvidia-h100-mega-80gb"')
    names, warned = scoped(agg, "acceleratorTypes")
    mega = agg["items"]["zones/us-central1-a"]["acceleratorTypes"][0] if names else {}
    check("nvidia-h100-mega-80gb: us-central1-a and europe-west4-a, NVIDIA H100 80GB MEGA, 8 cards",
          sorted(names) == ["europe-west4-a", "us-central1-a"] and warned
          and mega.get("description") == "NVIDIA H100 80GB MEGA" and mega.get("maximumCardsPerInstance") == 8,
          agg)
    full, _, _ = all_pages(api, path, "acceleratorTypes")
    flat, sizes, _ = all_pages(api, path, "acceleratorTypes", maxResults="5")
    check("acceleratorTypes.aggregatedList paging: maxResults 5 gets them all, once each",
          flat == full and len(full) == 44   # the sizes of ZONE_ACCELERATORS' sets
          and all(s == 5 for s in sizes[:-1]) and 0 < sizes[-1] <= 5, (sizes, len(full)))


SKUS_PATH = "/v1/services/6F81-5844-456A/skus"
WHERE = {"us-central1": "Americas", "us-east1": "Americas", "europe-west4": "EMEA", "asia-northeast1": "Japan"}
FAMILIES = ["N1 Predefined", "A2", "A3Mega", "A3", "G2", "C3", "N2", "E2"]
GPUS = ["Nvidia Tesla T4", "Nvidia Tesla V100", "Nvidia Tesla A100", "Nvidia A100 80GB", "Nvidia L4",
        "Nvidia H100 80GB", "Nvidia H100 80GB Mega"]


def expected_skus(where):
    """(description, usageType, usageUnit) of a region's SKUs, as README.md lists them."""
    out = []
    for family in FAMILIES:
        out += [(f"{family} Instance Core running in {where}", "OnDemand", "h"),
                (f"{family} Instance Ram running in {where}", "OnDemand", "GiBy.h"),
                (f"Spot Preemptible {family} Instance Core running in {where}", "Preemptible", "h"),
                (f"Spot Preemptible {family} Instance Ram running in {where}", "Preemptible", "GiBy.h")]
    for gpu in GPUS:
        out += [(f"{gpu} GPU running in {where}", "OnDemand", "h"),
                (f"{gpu} GPU attached to Spot Preemptible VMs running in {where}", "Preemptible", "h")]
    out += [(f"Commitment v1: N1 Predefined Instance Core in {where} for 1 Year", "Commit1Yr", "h"),
            (f"N1 Custom Instance Core running in {where}", "OnDemand", "h"),
            (f"N1 Sole Tenancy Instance Core running in {where}", "OnDemand", "h"),
            ("Licensing Fee for Windows Server 2022 Datacenter Edition (CPU cost)", "OnDemand", "h"),
            (f"Network Internet Egress from {where} to {where}", "OnDemand", "GiBy"),
            ("Storage PD Capacity", "OnDemand", "GiBy.mo")]
    return sorted(out)


def usd(sku):
    """The first tier's price of a SKU, in USD."""
    price = sku["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]
    return int(price["units"]) + price["nanos"] / 1e9


def price_of(skus, region, description):
    found = [s for s in skus if s["serviceRegions"] == [region] and s["description"] == description]
    return usd(found[0]) if len(found) == 1 else None


def billing_selftest(endpoint, billing_schema):
    calls = [0]

    def skus(**query):
        calls[0] += 1
        query = {k: v for k, v in query.items() if v is not None}
        return http(endpoint, "GET", SKUS_PATH + ("?" + urllib.parse.urlencode(query) if query else ""))[:2]

    status, services, _ = http(endpoint, "GET", "/v1/services")
    check("billing services.list: Compute Engine is 6F81-5844-456A",
          status == 200 and services["services"][0]["serviceId"] == "6F81-5844-456A"
          and services["services"][0]["displayName"] == "Compute Engine", services)
    status, page = skus(currencyCode="USD")
    all_skus = page.get("skus", []) if isinstance(page, dict) else []
    check("SKU list: one page of 208 (52 per region), nextPageToken empty",
          status == 200 and len(all_skus) == 208 and page.get("nextPageToken", "") == "", (status, len(all_skus)))
    if billing_schema is not None:
        problems = billing_schema.check("ListSkusResponse", page, mode="response")
        problems += [p for sku in all_skus for p in billing_schema.check("Sku", sku, mode="response")]
        check("every SKU matches cloudbilling.v1.json's Sku schema", not problems, problems[:5])
    else:
        print("skip cloudbilling.v1.json not found next to compute.v1.json: SKUs not checked against Sku")
    first = all_skus[0] if all_skus else {}
    check("a SKU's shape: name, skuId, category, one serviceRegion, REGIONAL geoTaxonomy, Google",
          first.get("name") == "services/6F81-5844-456A/skus/" + first.get("skuId", "")
          and len(first["skuId"]) == 14 and first["skuId"].count("-") == 2
          and first["category"]["serviceDisplayName"] == "Compute Engine"
          and len(first["serviceRegions"]) == 1 and first["geoTaxonomy"] == {
              "type": "REGIONAL", "regions": first["serviceRegions"]}
          and first["serviceProviderName"] == "Google"
          and first["pricingInfo"][0]["pricingExpression"]["displayQuantity"] == 1
          and first["pricingInfo"][0]["currencyConversionRate"] == 1, first)
    got = {region: sorted((s["description"], s["category"]["usageType"],
                           s["pricingInfo"][0]["pricingExpression"]["usageUnit"])
                          for s in all_skus if s["serviceRegions"] == [region]) for region in WHERE}
    check("each region has exactly the documented descriptions, usage types and units",
          all(got[region] == expected_skus(where) for region, where in WHERE.items()),
          {r: sorted(set(got[r]) ^ set(expected_skus(w))) for r, w in WHERE.items()})
    money = [s["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"] for s in all_skus]
    check("prices are Money: USD, units an int64 string, nanos an int below 1e9",
          all(m["currencyCode"] == "USD" and isinstance(m["units"], str) and m["units"].isdigit()
              and isinstance(m["nanos"], int) and 0 <= m["nanos"] < 10**9 for m in money), money[:3])
    families = {s["description"]: s["category"] for s in all_skus if s["serviceRegions"] == ["us-central1"]}
    check("categories: N1Standard / CPU / RAM / GPU groups, License, Network, Storage families",
          families["N1 Predefined Instance Core running in Americas"]["resourceGroup"] == "N1Standard"
          and families["A2 Instance Ram running in Americas"]["resourceGroup"] == "RAM"
          and families["C3 Instance Core running in Americas"]["resourceGroup"] == "CPU"
          and families["Nvidia L4 GPU running in Americas"]["resourceGroup"] == "GPU"
          and families["Licensing Fee for Windows Server 2022 Datacenter Edition (CPU cost)"][
              "resourceFamily"] == "License"
          and families["Network Internet Egress from Americas to Americas"]["resourceFamily"] == "Network"
          and families["Storage PD Capacity"]["resourceFamily"] == "Storage", families)
    n1 = "N1 Predefined Instance Core running in {}"
    check("prices: N1 core 0.031611 in us-*, 10% more in europe-west4, 25% more in asia-northeast1",
          price_of(all_skus, "us-central1", n1.format("Americas")) == 0.031611
          and price_of(all_skus, "us-east1", n1.format("Americas")) == 0.031611
          and price_of(all_skus, "europe-west4", n1.format("EMEA")) == 0.0347721
          and price_of(all_skus, "asia-northeast1", n1.format("Japan")) == 0.03951375,
          [price_of(all_skus, r, n1.format(w)) for r, w in WHERE.items()])
    check("prices: whole dollars in units (V100 2.48 -> units 2; H100 Mega in Japan 13.125)",
          price_of(all_skus, "us-central1", "Nvidia Tesla V100 GPU running in Americas") == 2.48
          and price_of(all_skus, "asia-northeast1", "Nvidia H100 80GB Mega GPU running in Japan") == 13.125,
          [price_of(all_skus, "us-central1", "Nvidia Tesla V100 GPU running in Americas")])
    spot_ok = all(
        price_of(all_skus, "us-central1", f"Spot Preemptible {f} Instance Core running in Americas")
        < 0.5 * price_of(all_skus, "us-central1", f"{f} Instance Core running in Americas") for f in FAMILIES) and all(
        price_of(all_skus, "us-central1", f"{g} GPU attached to Spot Preemptible VMs running in Americas")
        < 0.41 * price_of(all_skus, "us-central1", f"{g} GPU running in Americas") for g in GPUS)
    check("Spot prices are well below on-demand", spot_ok)

    pages, token, sizes = [], None, []
    for _ in range(10):
        status, page = skus(pageSize="50", pageToken=token)
        if status != 200:
            break
        pages.append(page)
        sizes.append(len(page["skus"]))
        token = page.get("nextPageToken")
        if not token:
            break
    ids = [s["skuId"] for p in pages for s in p["skus"]]
    check("pageSize 50: pages of 50, 50, 50, 50, 8; the last nextPageToken is empty; same SKUs",
          sizes == [50, 50, 50, 50, 8] and pages[-1]["nextPageToken"] == ""
          and ids == [s["skuId"] for s in all_skus], sizes)
    status, page = skus(pageSize="100000")
    check("pageSize over 5000 is taken as 5000", status == 200 and len(page["skus"]) == 208, status)
    status, err = skus(currencyCode="EUR")
    check("currencyCode EUR: 400 INVALID_ARGUMENT",
          status == 400 and error_of(err).get("status") == "INVALID_ARGUMENT" and "EUR" in error_of(err)["message"],
          (status, err))
    for name, query in [("pageSize -1", {"pageSize": "-1"}), ("pageSize x", {"pageSize": "x"}),
                        ("a bad pageToken", {"pageToken": "garbage!"}), ("an unknown parameter", {"filter": "x"}),
                        ("a bad startTime", {"startTime": "yesterday"})]:
        status, err = skus(**query)
        check(f"SKU list with {name}: 400", status == 400 and error_of(err).get("code") == 400, (status, err))
    status, page = skus(startTime="2026-11-01T00:00:00Z", endTime="2026-11-02T00:00:00Z", **{"$alt": "json"})
    check("startTime, endTime and $alt=json are taken", status == 200 and len(page["skus"]) == 208, status)
    status, page = skus(pageSize="1", **{"$alt": "json;enum-encoding=int"})
    check("$alt=json;enum-encoding=int: geoTaxonomy.type is the number 2",
          status == 200 and page["skus"][0]["geoTaxonomy"]["type"] == 2, page)
    calls[0] += 1
    status, err, _ = http(endpoint, "GET", "/v1/services/0000-0000-0000/skus")
    check("another service: 404 NOT_FOUND", status == 404 and error_of(err).get("status") == "NOT_FOUND", err)

    status, state = control(endpoint, "POST", "billing", {"fail": 403})
    status, err = skus()
    e = error_of(err)
    check("billing fail 403: Google's SERVICE_DISABLED error",
          status == 403 and e.get("code") == 403 and e.get("status") == "PERMISSION_DENIED"
          and e.get("message", "").startswith("Cloud Billing API has not been used in project gangway-test")
          and any(d.get("reason") == "SERVICE_DISABLED" for d in e.get("details", [])), (status, err))
    check("billing fail 403 stays until cleared", skus()[0] == 403)
    control(endpoint, "POST", "billing", {"fail": None})
    check('{"fail": null} clears it', skus()[0] == 200)
    control(endpoint, "POST", "billing", {"fail": 503, "times": 1})
    check('{"fail": 503, "times": 1}: one 503, then 200', [skus()[0], skus()[0]] == [503, 200])
    status, err = control(endpoint, "POST", "billing", {"fail": "yes"})
    check("billing control with a bad fail: 400", status == 400, err)

    control(endpoint, "POST", "billing", {"region_factor": {"europe-west4": 2}})
    status, page = skus()
    doubled = price_of(page["skus"], "europe-west4", n1.format("EMEA"))
    control(endpoint, "POST", "billing", {"region_factor": None})
    status, page = skus()
    check("region_factor changes a region's prices; null restores them",
          doubled == 0.063222 and price_of(page["skus"], "europe-west4", n1.format("EMEA")) == 0.0347721,
          doubled)
    status, billing = control(endpoint, "GET", "billing")
    status, state = control(endpoint, "GET", "state")
    check("every SKU list call is counted, refused ones too (/_gangway/state billing_calls)",
          state.get("billing_calls") == billing.get("calls") == calls[0],
          (state.get("billing_calls"), billing, calls[0]))


if __name__ == "__main__":
    sys.exit(main())
