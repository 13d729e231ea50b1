#!/usr/bin/env python3
"""Self test of the GCE emulator (server.py), with urllib only.

    python selftest.py        # any python3; the venv's is fine

Starts the server on a free port, checks routing, schema rejections, the
instance lifecycle (bulkInsert, insert, stop, start, delete), operations,
requestId idempotency, fault injection, capacity, list filters, preemption
and the metadata server, resource policies and firewalls, and stops it.
Every JSON answer of the API is also checked here against the discovery
document's response schema. Prints one line per check, then
`N passed, N failed`, and exits 1 if anything failed.
"""

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
        "nvidia-tesla-a100", "nvidia-a100-80gb", "nvidia-h100-80gb", "nvidia-l4", "nvidia-tesla-t4",
        "nvidia-tesla-v100"}, accs)
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

    # --- state, reset -----------------------------------------------------------------------
    status, state = control(endpoint, "GET", "state")
    check("/_gangway/state lists instances", status == 200 and len(state["instances"]) > 5, status)
    control(endpoint, "POST", "reset")
    status, listed = api.get(f"zones/{ZONE}/instances")
    status_ops, ops = api.get(f"zones/{ZONE}/operations")
    status_f, faults = control(endpoint, "GET", "faults")
    check("reset clears instances, operations and faults",
          listed.get("items", []) == [] and ops.get("items", []) == [] and faults["rules"] == [], (listed, ops, faults))


if __name__ == "__main__":
    sys.exit(main())
