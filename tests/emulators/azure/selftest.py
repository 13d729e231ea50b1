#!/usr/bin/env python3
"""Self test of the Azure ARM fake (server.py, machines.py) and leak_check.py.

    python3 selftest.py      # any python3 once setup.sh has written the schema file

Starts the server on a free port (with small pages and quick operations),
walks a launch the way a provider would (token, resource group, network,
NSG, public IPs, NICs, placement group, Spot VMs, polling, lists with
nextLink, teardown), checks the schema checks and the violation log, fault
injection, capacity limits, SKU restrictions, evictions with and without a
Preempt notice, the metadata service, a real ssh into a VM when /usr/sbin/sshd
is there (SKIPPED otherwise), leak_check.py and kill points, and stops the
server. Prints one line per check, then `N passed, N failed`; exits 1 if
anything failed.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SUB = "00000000-0000-0000-0000-00000000a2e1"
SUB2 = "00000000-0000-0000-0000-00000000b0b2"
TENANT = "72f988bf-0000-0000-0000-000000000001"
COMPUTE_V, DISKS_V, SKUS_V, NETWORK_V, RESOURCES_V = (
    "2024-11-01", "2024-03-02", "2021-07-01", "2024-10-01", "2025-03-01")
TOKEN = "Bearer selftest"
results = []


def check(name, condition, detail=""):
    results.append(bool(condition))
    print(f"{'ok  ' if condition else 'FAIL'} {name}{'' if condition else ': ' + str(detail)[:600]}")


class Client:
    def __init__(self, endpoint):
        self.endpoint = endpoint
        self.auth = TOKEN

    def call(self, method, path, body=None, api=None, headers=None, raw=None, auth=True):
        url = path if path.startswith("http") else self.endpoint + path
        if api:
            url += ("&" if "?" in url else "?") + "api-version=" + api
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if auth and self.auth:
            req.add_header("Authorization", self.auth)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, hdrs, text = resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            status, hdrs, text = err.code, dict(err.headers), err.read()
        try:
            out = json.loads(text) if text else None
        except ValueError:
            out = text.decode()
        return status, out, hdrs

    def control(self, method, what, body=None):
        status, out, _ = self.call(method, "/_fake/" + what, body, auth=False)
        return status, out

    def wait(self, headers, limit=20):
        """Polls an Azure-AsyncOperation URL to its end: (status, polls)."""
        url = headers.get("Azure-AsyncOperation")
        polls = 0
        for _ in range(limit):
            status, out, _h = self.call("GET", url)
            polls += 1
            if out and out.get("status") != "InProgress":
                return out, polls
        return out, polls


def rg_path(rg):
    return f"/subscriptions/{SUB}/resourceGroups/{rg}"


def res_path(rg, provider, type_, name):
    return f"{rg_path(rg)}/providers/{provider}/{type_}/{name}"


def vm_body(name, nic_id, key, location="eastus", zone=None, ppg=None, size="Standard_ND96amsr_A100_v4",
            spot=True, os_delete="Delete", nic_delete="Delete"):
    props = {
        "hardwareProfile": {"vmSize": size},
        "storageProfile": {
            "imageReference": {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc",
                               "sku": "2204", "version": "latest"},
            "osDisk": {"createOption": "FromImage", "deleteOption": os_delete,
                       "managedDisk": {"storageAccountType": "Premium_LRS"}, "diskSizeGB": 256},
        },
        "osProfile": {"computerName": name, "adminUsername": "gangway",
                      "linuxConfiguration": {"disablePasswordAuthentication": True, "ssh": {
                          "publicKeys": [{"path": "/home/gangway/.ssh/authorized_keys",
                                          "keyData": key}]}}},
        "networkProfile": {"networkInterfaces": [{"id": nic_id, "properties": {
            "primary": True, "deleteOption": nic_delete}}]},
    }
    if spot:
        props.update(priority="Spot", evictionPolicy="Delete", billingProfile={"maxPrice": -1})
    if ppg:
        props["proximityPlacementGroup"] = {"id": ppg}
    body = {"location": location, "tags": {"gangway-cluster": "selftest", "gangway-owner": "t"},
            "properties": props}
    if zone:
        body["zones"] = [zone]
    return body


def start_server(extra=()):
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "server.py"), "--port", "0",
                             "--op-polls", "2", "--page-size", "2", "--retry-after", "0", *extra],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise SystemExit(f"server did not print READY (got {line!r}); run setup.sh first?")
    return proc, line.split()[1]


def ssh_keypair(tmp):
    path = os.path.join(tmp, "id_ed25519")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path], check=True)
    with open(path + ".pub") as f:
        return path, f.read().strip()


def main():
    t0 = time.monotonic()
    proc, endpoint = start_server()
    tmp = tempfile.mkdtemp(prefix="azure-selftest-")
    try:
        c = Client(endpoint)
        identity(c)
        launch(c, tmp)
        checks(c)
        faults(c, tmp)
        evictions(c, tmp)
        retail(c)
        leak_and_kill(c, endpoint)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    check("server: stops on SIGTERM", proc.returncode is not None, proc.returncode)
    passed = sum(results)
    failed = len(results) - passed
    print(f"({time.monotonic() - t0:.1f} s)")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def identity(c):
    c.control("POST", "identities", {"tenant": TENANT, "client_id": "app-1", "client_secret": "s3"})
    form = urllib.parse.urlencode({"grant_type": "client_credentials", "client_id": "app-1",
                                   "client_secret": "s3",
                                   "scope": "https://management.azure.com/.default"}).encode()
    status, out, _ = c.call("POST", f"/{TENANT}/oauth2/v2.0/token", raw=form, auth=False,
                            headers={"Content-Type": "application/x-www-form-urlencoded"})
    check("token: client_credentials gives a Bearer token",
          status == 200 and out.get("token_type") == "Bearer" and out.get("access_token")
          and out.get("expires_in") == 3599, (status, out))
    token = out.get("access_token") if isinstance(out, dict) else None
    bad = form.replace(b"client_secret=s3", b"client_secret=nope")
    status, out, _ = c.call("POST", f"/{TENANT}/oauth2/v2.0/token", raw=bad, auth=False)
    check("token: a wrong secret is 401 invalid_client AADSTS7000215",
          status == 401 and out.get("error") == "invalid_client" and 7000215 in out.get("error_codes", []),
          (status, out))
    status, out, _ = c.call("GET", f"/{TENANT}/v2.0/.well-known/openid-configuration", auth=False)
    check("token: openid-configuration names the token endpoint",
          status == 200 and out["token_endpoint"].endswith(f"/{TENANT}/oauth2/v2.0/token"), out)
    c.auth = f"Bearer {token}"
    status, out, _ = c.call("GET", f"/subscriptions/{SUB}", api="2022-12-01")
    check("subscriptions: GET one answers Enabled", status == 200 and out.get("state") == "Enabled",
          (status, out))
    status, out, _ = c.call("GET", f"/subscriptions/{SUB}/resourcegroups", api=RESOURCES_V, auth=False)
    check("auth: no Authorization header is 401 AuthenticationFailed",
          status == 401 and out["error"]["code"] == "AuthenticationFailed", (status, out))
    c.control("DELETE", "violations")


def launch(c, tmp):
    keys = os.path.join(tmp, "authorized_keys")
    pairs = [["127.0.251.1", "127.1.251.1"], ["127.0.251.2", "127.1.251.2"],
             ["127.0.251.3", "127.1.251.3"]]
    status, view = c.control("POST", "machines", {"subscription": SUB, "addresses": pairs,
                                                  "authorized_keys": keys})
    port = view.get("imds_port") if status == 200 else None
    check("machines: a subscription gets its pairs and one metadata port", status == 200 and port, view)
    c.imds_port = port
    c.keys_file = keys

    rg = "gangway-selftest-eastus"
    status, out, _ = c.call("PUT", rg_path(rg), {"location": "eastus", "tags": {
        "gangway-cluster": "selftest"}}, api=RESOURCES_V)
    check("rg: PUT creates (201) with tags", status == 201 and out["tags"] == {"gangway-cluster": "selftest"}
          and out["properties"]["provisioningState"] == "Succeeded", (status, out))
    status, out, _ = c.call("PUT", rg_path(rg), {"location": "eastus", "tags": {
        "gangway-cluster": "selftest"}}, api=RESOURCES_V)
    check("rg: PUT again is 200", status == 200, status)
    status, out, _ = c.call("GET", rg_path(rg), api=RESOURCES_V)
    check("rg: GET", status == 200 and out["name"] == rg and out["location"] == "eastus", out)
    for extra in ("a", "b", "c"):
        c.call("PUT", rg_path(f"other-{extra}"), {"location": "westus2"}, api=RESOURCES_V)
    names, url, pages = [], f"/subscriptions/{SUB}/resourcegroups?api-version={RESOURCES_V}", 0
    while url:
        status, out, _ = c.call("GET", url)
        names += [g["name"] for g in out["value"]]
        url = out.get("nextLink")
        pages += 1
    check("rg: list pages with nextLink (page size 2)", pages == 2 and len(names) == 4, (pages, names))
    status, out, _ = c.call("GET", f"/subscriptions/{SUB}/resourcegroups?$filter="
                            + urllib.parse.quote("tagName eq 'gangway-cluster' and tagValue eq 'selftest'"),
                            api=RESOURCES_V)
    check("rg: $filter by tag", status == 200 and [g["name"] for g in out["value"]] == [rg], out)

    net = "Microsoft.Network"
    nsg_id = res_path(rg, net, "networkSecurityGroups", "gw-nsg")
    status, out, h = c.call("PUT", nsg_id, {"location": "eastus", "tags": {"gangway-cluster": "selftest"},
                                            "properties": {"securityRules": [{
                                                "name": "ssh", "properties": {
                                                    "protocol": "Tcp", "access": "Allow",
                                                    "direction": "Inbound", "priority": 1000,
                                                    "sourceAddressPrefix": "203.0.113.7/32",
                                                    "sourcePortRange": "*",
                                                    "destinationAddressPrefix": "*",
                                                    "destinationPortRange": "22"}}]}},
                            api=NETWORK_V)
    check("nsg: PUT is 201 with Azure-AsyncOperation, Updating",
          status == 201 and "Azure-AsyncOperation" in h and "Retry-After" in h
          and out["properties"]["provisioningState"] == "Updating", (status, h, out))
    op, polls = c.wait(h)
    check("lro: InProgress for 2 polls, then Succeeded", op["status"] == "Succeeded" and polls == 3,
          (op, polls))
    status, out, _ = c.call("GET", nsg_id, api=NETWORK_V)
    check("nsg: GET after the operation: Succeeded, rule with an id",
          out["properties"]["provisioningState"] == "Succeeded"
          and out["properties"]["securityRules"][0]["id"] == nsg_id + "/securityRules/ssh", out)
    vnet_id = res_path(rg, net, "virtualNetworks", "gw-vnet")
    status, out, h = c.call("PUT", vnet_id, {"location": "eastus", "properties": {
        "addressSpace": {"addressPrefixes": ["10.10.0.0/16"]},
        "subnets": [{"name": "default", "properties": {"addressPrefix": "10.10.0.0/24",
                                                        "networkSecurityGroup": {"id": nsg_id}}}]}},
        api=NETWORK_V)
    check("vnet: PUT with a subnet", status == 201, (status, out))
    subnet_id = vnet_id + "/subnets/default"
    status, out, _ = c.call("GET", subnet_id, api=NETWORK_V)
    check("subnet: GET the child resource", status == 200 and out.get("id") == subnet_id, out)
    status, out, h = c.call("PUT", vnet_id + "/subnets/second", {"properties": {
        "addressPrefix": "10.10.1.0/24"}}, api=NETWORK_V)
    check("subnet: PUT a second subnet (201, LRO)", status == 201 and "Azure-AsyncOperation" in h,
          (status, out))
    ppg_id = res_path(rg, "Microsoft.Compute", "proximityPlacementGroups", "gw-ppg")
    status, out, h = c.call("PUT", ppg_id, {"location": "eastus", "properties": {
        "proximityPlacementGroupType": "Standard"}}, api=COMPUTE_V)
    check("ppg: PUT is synchronous (201, no operation), as in the specification",
          status == 201 and "Azure-AsyncOperation" not in h, (status, h))

    _priv, key = ssh_keypair(tmp) if shutil.which("ssh-keygen") else (None, "ssh-ed25519 AAAAC3Nza selftest")
    c.private_key = _priv
    c.public_key = key
    vms = []
    for i in range(2):
        pip_id = res_path(rg, net, "publicIPAddresses", f"gw-ip-{i}")
        status, out, h = c.call("PUT", pip_id, {"location": "eastus", "sku": {"name": "Standard"},
                                                "zones": ["1"], "properties": {
                                                    "publicIPAllocationMethod": "Static"}},
                                api=NETWORK_V)
        check(f"pip {i}: PUT Standard/Static (201)", status == 201, (status, out))
        nic_id = res_path(rg, net, "networkInterfaces", f"gw-nic-{i}")
        status, out, h = c.call("PUT", nic_id, {"location": "eastus", "properties": {
            "enableAcceleratedNetworking": True,
            "ipConfigurations": [{"name": "ipconfig1", "properties": {
                "subnet": {"id": subnet_id}, "publicIPAddress": {"id": pip_id},
                "privateIPAllocationMethod": "Dynamic"}}]}}, api=NETWORK_V)
        check(f"nic {i}: PUT with accelerated networking (201)", status == 201, (status, out))
        vm_id = res_path(rg, "Microsoft.Compute", "virtualMachines", f"gw-node-{i}")
        status, out, h = c.call("PUT", vm_id, vm_body(f"gw-node-{i}", nic_id, key, zone="1",
                                                      ppg=ppg_id), api=COMPUTE_V)
        check(f"vm {i}: PUT Spot is 201 Creating with Azure-AsyncOperation",
              status == 201 and out["properties"]["provisioningState"] == "Creating"
              and "/providers/Microsoft.Compute/locations/eastus/operations/" in h.get(
                  "Azure-AsyncOperation", ""), (status, h, out))
        vms.append((vm_id, nic_id, pip_id, h))
    vm_id, nic_id, pip_id, h = vms[0]
    status, out, _ = c.call("GET", vm_id + "/instanceView", api=COMPUTE_V)
    codes = [s["code"] for s in out.get("statuses", [])]
    check("vm: instanceView while creating: ProvisioningState/creating, PowerState/starting",
          codes == ["ProvisioningState/creating", "PowerState/starting"], codes)
    for _vm_id, _n, _p, hh in vms:
        op, polls = c.wait(hh)
    check("vm: the operation ends Succeeded", op["status"] == "Succeeded", op)
    status, out, _ = c.call("GET", vm_id + "?$expand=instanceView", api=COMPUTE_V)
    codes = [s["code"] for s in out["properties"]["instanceView"]["statuses"]]
    check("vm: $expand=instanceView: succeeded, PowerState/running",
          codes == ["ProvisioningState/succeeded", "PowerState/running"], codes)
    p = out["properties"]
    check("vm: GET shows Spot, Delete, maxPrice -1, zone, PPG, vmId",
          p["priority"] == "Spot" and p["evictionPolicy"] == "Delete"
          and p["billingProfile"]["maxPrice"] == -1 and out["zones"] == ["1"]
          and p["proximityPlacementGroup"]["id"] == ppg_id and p.get("vmId"), out)
    status, out, _ = c.call("GET", pip_id, api=NETWORK_V)
    check("machines: the VM's public IP resource has the pair's public address",
          out["properties"].get("ipAddress") == "127.0.251.1", out)
    status, out, _ = c.call("GET", nic_id, api=NETWORK_V)
    check("machines: the NIC's ipConfiguration has the pair's private address; attached to the VM",
          out["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"] == "127.1.251.1"
          and out["properties"]["virtualMachine"]["id"] == vm_id, out)
    with open(keys) as f:
        check("machines: the VM's SSH key is in authorized_keys", key in f.read())
    status, out, _ = c.call("GET", ppg_id, api=COMPUTE_V)
    check("ppg: lists its VMs", len(out["properties"].get("virtualMachines", [])) == 2, out)

    ids, url, pages = [], f"/subscriptions/{SUB}/providers/Microsoft.Compute/virtualMachines?api-version={COMPUTE_V}", 0
    while url:
        status, out, _ = c.call("GET", url)
        ids += [v["id"] for v in out["value"]]
        url = out.get("nextLink")
        pages += 1
    check("vm: list by subscription", sorted(ids) == sorted(v[0] for v in vms), ids)
    status, out, _ = c.call("GET", rg_path(rg) + "/providers/Microsoft.Compute/virtualMachines",
                            api=COMPUTE_V)
    check("vm: list by resource group", status == 200 and len(out["value"]) == 2, out)

    imds(c, vm_id)
    ssh_into(c, tmp)

    # teardown of node 1 by hand: VM (its disk and NIC go by deleteOption), then the rest
    vm1, nic1, pip1, _ = vms[1]
    status, out, h = c.call("DELETE", vm1, api=COMPUTE_V)
    check("vm: DELETE is 202 with Azure-AsyncOperation and Location",
          status == 202 and "Azure-AsyncOperation" in h and "Location" in h, (status, h))
    status, out, h2 = c.call("GET", h["Location"])
    check("lro: the Location URL answers 202 while running", status == 202, status)
    c.wait(h)
    status, out, _ = c.call("GET", vm1, api=COMPUTE_V)
    check("vm: gone after the delete (404 ResourceNotFound)",
          status == 404 and out["error"]["code"] == "ResourceNotFound", (status, out))
    status, out, _ = c.call("GET", nic1, api=NETWORK_V)
    check("vm: its NIC went with it (deleteOption Delete)", status == 404, status)
    status, out, _ = c.call("GET", rg_path(rg) + "/providers/Microsoft.Compute/disks", api=DISKS_V)
    check("disks: the deleted VM's OS disk went (deleteOption Delete); the other's stays",
          status == 200 and len(out["value"]) == 1 and out["value"][0]["properties"]["diskState"]
          == "Attached", out)
    status, out, _ = c.call("DELETE", pip1, api=NETWORK_V)
    check("pip: DELETE of a detached public IP (202)", status == 202, (status, out))
    status, out, _ = c.call("DELETE", vms[0][1], api=NETWORK_V)
    check("nic: DELETE of a NIC in use is 400 NicInUse",
          status == 400 and out["error"]["code"] == "NicInUse", (status, out))
    status, out, _ = c.call("DELETE", vms[0][2], api=NETWORK_V)
    check("pip: DELETE of a public IP in use is 400 PublicIPAddressCannotBeDeleted",
          status == 400 and out["error"]["code"] == "PublicIPAddressCannotBeDeleted", (status, out))
    status, out, _ = c.call("DELETE", nsg_id, api=NETWORK_V)
    check("nsg: DELETE of an NSG in use is 400 InUseNetworkSecurityGroupCannotBeDeleted",
          status == 400 and out["error"]["code"] == "InUseNetworkSecurityGroupCannotBeDeleted",
          (status, out))
    c.launch_rg = rg
    c.vm0 = vms[0]


def imds(c, vm_id):
    port = c.imds_port

    def get(path, meta=True, method="GET", body=None):
        req = urllib.request.Request(f"http://127.0.251.1:{port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode())
        if meta:
            req.add_header("Metadata", "true")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw and raw[:1] in b"{[" else raw.decode())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    status, out = get("/metadata/instance?api-version=2021-02-01", meta=False)
    check("imds: without Metadata: true is 400", status == 400, (status, out))
    status, out = get("/metadata/instance")
    check("imds: without api-version is 400", status == 400, (status, out))
    status, out = get("/metadata/instance?api-version=2021-02-01")
    comp = out.get("compute", {}) if isinstance(out, dict) else {}
    check("imds: compute name, location, zone, vmSize, priority, evictionPolicy, domains",
          status == 200 and comp.get("name") == "gw-node-0" and comp.get("location") == "eastus"
          and comp.get("zone") == "1" and comp.get("vmSize") == "Standard_ND96amsr_A100_v4"
          and comp.get("priority") == "Spot" and comp.get("evictionPolicy") == "Delete"
          and comp.get("platformFaultDomain") == "0" and comp.get("resourceId") == vm_id
          and "placementGroupId" in comp, out)
    ip = out["network"]["interface"][0]["ipv4"]["ipAddress"][0]
    check("imds: network addresses are the pair's",
          ip == {"privateIpAddress": "127.1.251.1", "publicIpAddress": "127.0.251.1"}, ip)
    status, out = get("/metadata/instance/compute/vmSize?api-version=2021-02-01&format=text")
    check("imds: a leaf with format=text", status == 200 and out == "Standard_ND96amsr_A100_v4",
          (status, out))
    status, out = get("/metadata/scheduledevents?api-version=2020-07-01")
    check("scheduled events: none yet", status == 200 and out == {"DocumentIncarnation": 0, "Events": []},
          out)
    status, out = get("/metadata/identity/oauth2/token?api-version=2018-02-01&resource="
                      + urllib.parse.quote("https://management.azure.com/"))
    check("imds: managed identity token", status == 200 and out.get("access_token"), out)


def ssh_into(c, tmp):
    if not (os.path.exists("/usr/sbin/sshd") and shutil.which("ssh") and c.private_key):
        print("SKIPPED ssh into a VM: /usr/sbin/sshd or ssh is not installed")
        return
    host_key = os.path.join(tmp, "host_key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", host_key], check=True)
    os.chmod(c.keys_file, 0o600)
    with socket.socket() as s:
        s.bind(("127.0.251.1", 0))
        port = s.getsockname()[1]
    config = os.path.join(tmp, "sshd_config")
    with open(config, "w") as f:
        f.write(f"ListenAddress 127.0.251.1:{port}\nHostKey {host_key}\n"
                f"AuthorizedKeysFile {c.keys_file}\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                f"PidFile {tmp}/sshd.pid\nPermitRootLogin prohibit-password\n")
    os.makedirs("/run/sshd", exist_ok=True)
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", config],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.251.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        user = os.environ.get("USER") or "root"
        out = subprocess.run(["ssh", "-i", c.private_key, "-p", str(port), "-o", "BatchMode=yes",
                              "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                              "-o", "LogLevel=ERROR", f"{user}@127.0.251.1", "echo hello-from-vm"],
                             capture_output=True, text=True, timeout=20)
        check("ssh: into the VM's public address with its key (a real sshd)",
              out.returncode == 0 and "hello-from-vm" in out.stdout, (out.returncode, out.stderr))
    finally:
        sshd.terminate()
        sshd.wait(timeout=5)


def checks(c):
    c.control("DELETE", "violations")
    rg = c.launch_rg
    vm = res_path(rg, "Microsoft.Compute", "virtualMachines", "gw-bad")
    nic = c.vm0[1]
    status, out, _ = c.call("PUT", vm, vm_body("gw-bad", nic, c.public_key))
    check("api-version: missing is 400 MissingApiVersionParameter",
          status == 400 and out["error"]["code"] == "MissingApiVersionParameter", out)
    status, out, _ = c.call("PUT", vm, vm_body("gw-bad", nic, c.public_key), api="2023-03-01")
    check("api-version: another one is 400 NoRegisteredProviderFound",
          status == 400 and out["error"]["code"] == "NoRegisteredProviderFound", out)
    body = vm_body("gw-bad", nic, c.public_key)
    body["properties"]["hardwareProfile"]["vmSizee"] = "x"
    status, out, _ = c.call("PUT", vm, body, api=COMPUTE_V)
    check("schema: an unknown property is 400 InvalidRequestContent naming it",
          status == 400 and out["error"]["code"] == "InvalidRequestContent"
          and "vmSizee" in out["error"]["message"], out)
    body = vm_body("gw-bad", nic, c.public_key)
    body["properties"]["billingProfile"]["maxPrice"] = "cheap"
    status, out, _ = c.call("PUT", vm, body, api=COMPUTE_V)
    check("schema: a wrong type is 400 InvalidRequestContent",
          status == 400 and out["error"]["code"] == "InvalidRequestContent"
          and "maxPrice" in out["error"]["message"], out)
    body = vm_body("gw-bad", nic, c.public_key)
    del body["location"]
    status, out, _ = c.call("PUT", vm, body, api=COMPUTE_V)
    check("schema: a missing required location is 400 LocationRequired",
          status == 400 and out["error"]["code"] == "LocationRequired", out)
    body = vm_body("gw-bad", nic, c.public_key)
    del body["properties"]["storageProfile"]["osDisk"]["createOption"]
    status, out, _ = c.call("PUT", vm, body, api=COMPUTE_V)
    check("schema: a missing required nested property (osDisk.createOption) is 400",
          status == 400 and "createOption" in out["error"]["message"], out)
    body = vm_body("gw-bad", nic, c.public_key)
    body["properties"]["priority"] = "Cheap"
    status, out, _ = c.call("PUT", vm, body, api=COMPUTE_V)
    check("schema: a value outside the enumeration is 400 InvalidParameter",
          status == 400 and out["error"]["code"] == "InvalidParameter", out)
    status, out, _ = c.call("PUT", vm, raw=b"{not json", api=COMPUTE_V)
    check("schema: a body that is not JSON is 400 InvalidRequestContent",
          status == 400 and out["error"]["code"] == "InvalidRequestContent", out)
    status, out, _ = c.call("GET", f"/subscriptions/{SUB}/resourceGroups/{rg}/providers/"
                            "Microsoft.Compute/virtualMachinez/x", api=COMPUTE_V)
    check("route: an unknown resource type is 404 InvalidResourceType",
          status == 404 and out["error"]["code"] == "InvalidResourceType", out)
    status, out, _ = c.call("GET", rg_path("gangway-none") + "/providers/Microsoft.Compute/"
                            "virtualMachines/x", api=COMPUTE_V)
    check("rg: a VM in a missing group is 404 ResourceGroupNotFound",
          status == 404 and out["error"]["code"] == "ResourceGroupNotFound", out)
    status, v = c.control("GET", "violations")
    kinds = sorted(x["kind"] for x in v["violations"])
    check("violations: every refusal above is counted, by kind",
          v["count"] == 9 and kinds == ["api-version", "api-version", "body", "enum", "required",
                                        "required", "route", "type", "unknown"], kinds)
    c.control("DELETE", "violations")
    pip = res_path(rg, "Microsoft.Network", "publicIPAddresses", "gw-ro")
    status, out, h = c.call("PUT", pip, {"location": "eastus", "sku": {"name": "Standard"},
                                         "properties": {"publicIPAllocationMethod": "Static",
                                                        "provisioningState": "Succeeded"}},
                            api=NETWORK_V)
    status2, v = c.control("GET", "violations")
    check("schema: a read-only property is taken (as ARM does) but counted",
          status == 201 and v["count"] == 1 and v["violations"][0]["kind"] == "readonly", (status, v))
    c.call("DELETE", pip, api=NETWORK_V)
    c.control("DELETE", "violations")
    status, out, _ = c.call("PUT", vm, vm_body("gw-bad", nic, c.public_key, size="Standard_B2s"),
                            api=COMPUTE_V)
    check("vm: a NIC already on another VM is 400 NicInUse",
          status == 400 and out["error"]["code"] == "NicInUse", out)
    status, v = c.control("GET", "violations")
    check("violations: ARM's own refusals (not the client's protocol) are not violations",
          v["count"] == 0, v)


def make_nic(c, rg, name, location="eastus", accel=False):
    net = "Microsoft.Network"
    vnet = res_path(rg, net, "virtualNetworks", f"{name}-vnet")
    c.call("PUT", vnet, {"location": location, "properties": {
        "addressSpace": {"addressPrefixes": ["10.20.0.0/16"]},
        "subnets": [{"name": "s", "properties": {"addressPrefix": "10.20.0.0/24"}}]}}, api=NETWORK_V)
    pip = res_path(rg, net, "publicIPAddresses", f"{name}-ip")
    c.call("PUT", pip, {"location": location, "sku": {"name": "Standard"},
                        "properties": {"publicIPAllocationMethod": "Static"}}, api=NETWORK_V)
    nic = res_path(rg, net, "networkInterfaces", f"{name}-nic")
    status, out, _ = c.call("PUT", nic, {"location": location, "properties": {
        "enableAcceleratedNetworking": accel, "ipConfigurations": [{"name": "ip", "properties": {
            "subnet": {"id": vnet + "/subnets/s"}, "publicIPAddress": {"id": pip}}}]}}, api=NETWORK_V)
    assert status == 201, (status, out)
    return nic


def faults(c, tmp):
    rg = "gangway-selftest-faults"
    c.call("PUT", rg_path(rg), {"location": "eastus"}, api=RESOURCES_V)
    status, rule = c.control("POST", "faults", {"method": "GET", "type": "resourceGroups",
                                                "error": "throttle", "retry_after": 7})
    check("faults: a rule is added (201)", status == 201 and rule.get("id"), rule)
    status, out, h = c.call("GET", rg_path(rg), api=RESOURCES_V)
    check("faults: throttle is 429 with Retry-After and x-ms-ratelimit-remaining-subscription-reads",
          status == 429 and h.get("Retry-After") == "7"
          and h.get("x-ms-ratelimit-remaining-subscription-reads") == "0", (status, h))
    status, out, _ = c.call("GET", rg_path(rg), api=RESOURCES_V)
    check("faults: times 1 (the default) fires once", status == 200, status)
    nic = make_nic(c, rg, "f1")
    vm = res_path(rg, "Microsoft.Compute", "virtualMachines", "gw-f1")
    for error, code, http in [("SkuNotAvailable", "SkuNotAvailable", 409),
                              ("QuotaExceeded", "QuotaExceeded", 409),
                              ("OperationNotAllowed", "OperationNotAllowed", 409),
                              ("AuthorizationFailed", "AuthorizationFailed", 403),
                              ("InvalidAuthenticationToken", "InvalidAuthenticationToken", 401),
                              ("ZonalAllocationFailed", "ZonalAllocationFailed", 409),
                              ("OverconstrainedAllocationRequest", "OverconstrainedAllocationRequest", 409)]:
        c.control("POST", "faults", {"method": "PUT", "type": "virtualMachines", "error": error})
        status, out, _ = c.call("PUT", vm, vm_body("gw-f1", nic, c.public_key), api=COMPUTE_V)
        check(f"faults: {error} synchronously is {http} {code}",
              status == http and out["error"]["code"] == code, (status, out))
    status, out, _ = c.call("GET", rg_path(rg) + "/providers/Microsoft.Compute/virtualMachines",
                            api=COMPUTE_V)
    check("faults: nothing was made by the refused creates", out["value"] == [], out)
    status, out, _ = c.call("GET", f"/subscriptions/{SUB}/providers/Microsoft.Compute/"
                            "virtualMachines", api=COMPUTE_V)
    msg = None
    c.control("POST", "faults", {"method": "PUT", "type": "virtualMachines", "error": "QuotaExceeded"})
    status, out, _ = c.call("PUT", vm, vm_body("gw-f1", nic, c.public_key, spot=True), api=COMPUTE_V)
    msg = out["error"]["message"]
    check("faults: the quota message names the family and location",
          "Low Priority Cores quota" in msg and "Location: eastus" in msg, msg)

    c.control("POST", "faults", {"method": "PUT", "type": "virtualMachines",
                                 "error": "AllocationFailed", "async": True})
    status, out, h = c.call("PUT", vm, vm_body("gw-f1", nic, c.public_key), api=COMPUTE_V)
    check("faults: an async AllocationFailed is accepted (201)", status == 201, (status, out))
    op, _ = c.wait(h)
    check("faults: ... and its operation ends Failed with AllocationFailed",
          op["status"] == "Failed" and op["error"]["code"] == "AllocationFailed", op)
    status, out, _ = c.call("GET", vm + "?$expand=instanceView", api=COMPUTE_V)
    check("faults: the VM stays, provisioningState Failed, ProvisioningState/failed/AllocationFailed",
          out["properties"]["provisioningState"] == "Failed"
          and out["properties"]["instanceView"]["statuses"][0]["code"]
          == "ProvisioningState/failed/AllocationFailed", out)
    status, out, h = c.call("DELETE", vm, api=COMPUTE_V)
    c.wait(h)
    status, out, _ = c.call("GET", rg_path(rg) + "/providers/Microsoft.Compute/disks", api=DISKS_V)
    disks = out["value"]
    check("disks: an OS disk with deleteOption Detach stays after its VM, Unattached",
          len(disks) == 0 or all(d["properties"]["diskState"] == "Unattached" for d in disks), disks)

    # capacity limits: one A100 VM in eastus zone 2, the second fails asynchronously
    c.control("POST", "capacity", {"location": "eastus", "zone": "2",
                                   "size": "Standard_ND96amsr_A100_v4", "available": 1})
    nic2 = make_nic(c, rg, "f2")
    nic3 = make_nic(c, rg, "f3")
    vm2 = res_path(rg, "Microsoft.Compute", "virtualMachines", "gw-f2")
    vm3 = res_path(rg, "Microsoft.Compute", "virtualMachines", "gw-f3")
    status, out, h2 = c.call("PUT", vm2, vm_body("gw-f2", nic2, c.public_key, zone="2",
                                                 os_delete="Detach"), api=COMPUTE_V)
    status, out, h3 = c.call("PUT", vm3, vm_body("gw-f3", nic3, c.public_key, zone="2"), api=COMPUTE_V)
    op2, _ = c.wait(h2)
    op3, _ = c.wait(h3)
    check("capacity: within the limit Succeeded, over it ZonalAllocationFailed",
          op2["status"] == "Succeeded" and op3["status"] == "Failed"
          and op3["error"]["code"] == "ZonalAllocationFailed", (op2, op3))
    c.control("DELETE", "capacity")
    for v in (vm2, vm3):
        _s, _o, h = c.call("DELETE", v, api=COMPUTE_V)
        c.wait(h)
    status, out, _ = c.call("GET", rg_path(rg) + "/providers/Microsoft.Compute/disks", api=DISKS_V)
    left = [d["name"] for d in out["value"] if d["name"].startswith("gw-f2")]
    check("disks: a Detach OS disk is left, listable", len(left) == 1, out)
    if left:
        status, out, h = c.call("DELETE", rg_path(rg) + "/providers/Microsoft.Compute/disks/" + left[0],
                                api=DISKS_V)
        check("disks: ... and deletable (202)", status == 202, (status, out))

    # restrictions: a size restricted in a zone shows in resourceSkus and is SkuNotAvailable
    c.control("POST", "restrictions", {"location": "westus2", "size": "Standard_ND96asr_v4",
                                       "zones": ["3"]})
    status, out, _ = c.call("GET", f"/subscriptions/{SUB}/providers/Microsoft.Compute/skus?$filter="
                            + urllib.parse.quote("location eq 'westus2'"), api=SKUS_V)
    skus, pages = list(out["value"]), 1
    while out.get("nextLink"):
        status, out, _ = c.call("GET", out["nextLink"])
        skus += out["value"]
        pages += 1
    asr = [s for s in skus if s["name"] == "Standard_ND96asr_v4"]
    check("skus: paged, with capabilities and the zone restriction",
          pages > 1 and asr and asr[0]["restrictions"][0]["type"] == "Zone"
          and asr[0]["restrictions"][0]["restrictionInfo"]["zones"] == ["3"]
          and {"name": "GPUs", "value": "8"} in asr[0]["capabilities"], asr)
    c.call("PUT", rg_path("gangway-selftest-w2"), {"location": "westus2"}, api=RESOURCES_V)
    nic4 = make_nic(c, "gangway-selftest-w2", "w", location="westus2")
    status, out, _ = c.call("PUT", res_path("gangway-selftest-w2", "Microsoft.Compute", "virtualMachines",
                                            "gw-w"), vm_body("gw-w", nic4, c.public_key, location="westus2",
                                                             zone="3", size="Standard_ND96asr_v4"),
                            api=COMPUTE_V)
    check("skus: a restricted size is 409 SkuNotAvailable",
          status == 409 and out["error"]["code"] == "SkuNotAvailable", out)
    status, out, _ = c.call("GET", f"/subscriptions/{SUB}/providers/Microsoft.Compute/locations/"
                            "eastus/vmSizes", api=COMPUTE_V)
    names = [s["name"] for s in out.get("value", [])]
    check("vmSizes: eastus lists ND96amsr_A100_v4 with 96 cores",
          any(s["name"] == "Standard_ND96amsr_A100_v4" and s["numberOfCores"] == 96
              for s in out.get("value", [])), names)
    status, out, _ = c.call("PUT", res_path("gangway-selftest-w2", "Microsoft.Compute", "virtualMachines",
                                            "gw-b"), vm_body("gw-b", make_nic(c, "gangway-selftest-w2", "b",
                                                                             location="westus2", accel=True),
                                                             c.public_key, location="westus2",
                                                             size="Standard_B2s", spot=False),
                            api=COMPUTE_V)
    check("vm: accelerated networking on a size without it is 400",
          status == 400 and out["error"]["code"] == "VMSizeIsNotPermittedToEnableAcceleratedNetworking", out)
    status, out, h = c.call("DELETE", rg_path("gangway-selftest-w2"), api=RESOURCES_V)
    check("rg: DELETE is 202 with a Location", status == 202 and "/operationresults/" in h.get("Location", ""),
          (status, h))
    for _ in range(5):
        status, out, h2 = c.call("GET", h["Location"])
        if status != 202:
            break
    check("rg: its Location answers 202 then 200", status == 200, status)
    status, out, _ = c.call("GET", rg_path("gangway-selftest-w2") + "/providers/Microsoft.Network/"
                            "networkInterfaces", api=NETWORK_V)
    check("rg: deleting the group deleted what was in it", status == 404, (status, out))
    status, v = c.control("GET", "violations")
    check("violations: none from the walk", v["count"] == 0, v)


def evictions(c, tmp):
    rg = "gangway-selftest-evict"
    c.call("PUT", rg_path(rg), {"location": "eastus"}, api=RESOURCES_V)
    vms = []
    for name, policy_delete in (("gw-e1", True), ("gw-e2", True)):
        nic = make_nic(c, rg, name)
        vm = res_path(rg, "Microsoft.Compute", "virtualMachines", name)
        _s, _o, h = c.call("PUT", vm, vm_body(name, nic, c.public_key), api=COMPUTE_V)
        c.wait(h)
        vms.append((vm, nic))
    # gw-node-0 holds 127.0.251.1; these took .2 and .3
    status, view = c.control("GET", f"machines?subscription={SUB}")
    held = {h["vm"].rsplit("/", 1)[1]: h["public"] for h in view.get("held", [])}
    check("machines: each VM holds its own pair", held.get("gw-e1") == "127.0.251.2"
          and held.get("gw-e2") == "127.0.251.3", held)
    status, state = c.control("GET", "state")
    listed = {r["id"].rsplit("/", 1)[1]: r for r in state["resources"] if r["kind"] == "vm"}
    check("state: a VM's zone and public address are listed",
          listed.get("gw-e1", {}).get("public") == "127.0.251.2"
          and "zone" in listed.get("gw-e1", {}), listed.get("gw-e1"))
    port = c.imds_port

    def events(address, method="GET", body=None):
        req = urllib.request.Request(f"http://{address}:{port}/metadata/scheduledevents?"
                                     "api-version=2020-07-01", method=method,
                                     data=None if body is None else json.dumps(body).encode())
        req.add_header("Metadata", "true")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except OSError as err:
            return None, str(err)

    status, out = c.control("POST", "evict", {"vm": "gw-e1", "notice_s": 1.0})
    check("evict: with notice schedules a Preempt event", status == 200 and out["outcome"] == "scheduled",
          out)
    status, doc = events("127.0.251.2")
    ev = doc["Events"][0] if status == 200 and doc.get("Events") else {}
    check("scheduled events: a Preempt event as Azure posts it",
          doc.get("DocumentIncarnation") == 1 and ev.get("EventType") == "Preempt"
          and ev.get("ResourceType") == "VirtualMachine" and ev.get("Resources") == ["gw-e1"]
          and ev.get("EventStatus") == "Scheduled" and ev.get("EventSource") == "Platform"
          and ev.get("DurationInSeconds") == -1 and ev.get("NotBefore", "").endswith("GMT"), doc)
    status, out, _ = c.call("GET", vms[0][0] + "/instanceView", api=COMPUTE_V)
    check("evict: the VM still runs during the notice",
          "PowerState/running" in [s["code"] for s in out.get("statuses", [])], out)
    time.sleep(1.6)
    status, out, _ = c.call("GET", vms[0][0], api=COMPUTE_V)
    check("evict: after the notice the Spot VM (evictionPolicy Delete) is gone", status == 404, status)
    status, out, _ = c.call("GET", vms[0][1], api=NETWORK_V)
    check("evict: its NIC went by its deleteOption", status == 404, status)

    status, out = c.control("POST", "evict", {"vm": "gw-e2", "notice_s": 30})
    status, doc = events("127.0.251.3")
    event_id = doc["Events"][0]["EventId"]
    status, _ = events("127.0.251.3", "POST", {"StartRequests": [{"EventId": event_id}]})
    check("scheduled events: a StartRequests acknowledgement is 200", status == 200, status)
    time.sleep(0.6)
    status, out, _ = c.call("GET", vms[1][0], api=COMPUTE_V)
    check("scheduled events: approving a Preempt evicts at once", status == 404, status)

    nic = make_nic(c, rg, "gw-e3")
    vm = res_path(rg, "Microsoft.Compute", "virtualMachines", "gw-e3")
    body = vm_body("gw-e3", nic, c.public_key)
    body["properties"]["evictionPolicy"] = "Deallocate"
    _s, _o, h = c.call("PUT", vm, body, api=COMPUTE_V)
    c.wait(h)
    status, out = c.control("POST", "evict", {"vm": "gw-e3", "notice": False})
    check("evict: without notice, Deallocate policy: deallocated at once",
          status == 200 and out["outcome"] == "deallocated", out)
    status, out, _ = c.call("GET", vm + "/instanceView", api=COMPUTE_V)
    check("evict: instanceView says PowerState/deallocated",
          "PowerState/deallocated" in [s["code"] for s in out.get("statuses", [])], out)
    status, out = c.control("POST", "evict", {"vm": "gw-node-0", "notice": False})
    check("evict: without notice, Delete policy: deleted at once",
          status == 200 and out["outcome"] == "deleted", out)
    status, out = c.control("GET", "state")
    check("state: lists the evictions", len(out.get("evicted", [])) == 4, out.get("evicted"))


def retail(c):
    """The Retail Prices API: no credentials, $filter, pages, the meters of
    a size, a filter it cannot read counted as a violation."""
    c.control("DELETE", "violations")
    c.control("POST", "settings", {"retail_page_size": 4})
    c.control("POST", "retail", {"prices": [{"sku": "Standard_NC4as_T4_v3", "region": "eastus",
                                             "linux": 0.5, "spot": 0.06}],
                                  "filler_per_region": 6})
    q = urllib.parse.quote("serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' "
                           "and priceType eq 'Consumption'")
    url, items, pages = f"/api/retail/prices?$filter={q}", [], 0
    while url and pages < 10:
        status, out, _ = c.call("GET", url, auth=False)
        if status != 200:
            break
        pages += 1
        items += out["Items"]
        url = out["NextPageLink"]
    mine = {(i["meterName"], i["productName"].endswith("Windows")): i["retailPrice"]
            for i in items if i["armSkuName"] == "Standard_NC4as_T4_v3"}
    check("retail: pages through NextPageLink without credentials, Consumption meters only",
          status == 200 and pages == 3 and len(items) == 9
          and all(i["type"] == "Consumption" for i in items), (status, pages, len(items)))
    check("retail: a size has Linux, Windows, Spot and Low Priority meters",
          mine.get(("NC4as T4 v3", False)) == 0.5 and mine.get(("NC4as T4 v3 Spot", False)) == 0.06
          and ("NC4as T4 v3", True) in mine and ("NC4as T4 v3 Low Priority", False) in mine, mine)
    status, out, _ = c.call("GET", "/api/retail/prices?$filter=" + urllib.parse.quote("retailPrice gt 1"),
                            auth=False)
    _, v = c.control("GET", "violations")
    check("retail: a filter it cannot read is 400 and a violation",
          status == 400 and v["count"] == 1 and v["violations"][0]["kind"] == "retail-filter", (status, v))
    c.control("DELETE", "violations")
    c.control("POST", "settings", {"retail_page_size": 1000})


def leak_and_kill(c, endpoint):
    leak = [sys.executable, os.path.join(HERE, "leak_check.py"), "--endpoint", endpoint,
            "--subscription", SUB]
    out = subprocess.run(leak, capture_output=True, text=True, timeout=30)
    check("leak_check: finds what is left (exit 1)", out.returncode == 1 and "leak check:" in out.stdout,
          (out.returncode, out.stdout[-400:], out.stderr[-400:]))
    for group in list(c.control("GET", "state")[1]["resource_groups"]):
        _s, _o, h = c.call("DELETE", group["id"], api=RESOURCES_V)
        for _ in range(6):
            s, _o2, _h2 = c.call("GET", h["Location"])
            if s != 202:
                break
    out = subprocess.run(leak, capture_output=True, text=True, timeout=30)
    check("leak_check: nothing left after the groups are deleted (exit 0)",
          out.returncode == 0 and "nothing left" in out.stdout, (out.returncode, out.stdout, out.stderr))
    status, state = c.control("GET", "state")
    check("state: empty after the teardown", state["resources"] == [] and state["resource_groups"] == [],
          state["resources"])

    victim = subprocess.Popen(["sleep", "30"], env={"PATH": os.environ.get("PATH", ""),
                                                   "GANGWAY_HOME": "/tmp/azure-selftest-kill"})
    status, out = c.control("POST", "kill", {"at": 3, "marker": "GANGWAY_HOME=/tmp/azure-selftest-kill"})
    c.call("GET", f"/subscriptions/{SUB}/resourcegroups", api=RESOURCES_V)
    c.call("GET", f"/subscriptions/{SUB}/resourcegroups", api=RESOURCES_V)
    try:
        victim.wait(timeout=5)
    except subprocess.TimeoutExpired:
        victim.kill()
    status, out = c.control("GET", "kill")
    check("kill points: point 3 (request 2's arrival) SIGKILLs the marked process",
          victim.returncode == -9 and out["fired"]["point"] == 3 and out["fired"]["when"] == "arrival",
          (victim.returncode, out))
    c.control("POST", "reset")
    status, state = c.control("GET", "state")
    check("reset: forgets everything", state["violations"] == 0 and state["resources"] == [], state)


if __name__ == "__main__":
    sys.exit(main())
