#!/usr/bin/env python3
"""Self test of the Vast.ai fake (server.py) with urllib.

    python3 selftest.py

Starts the fake on a free port and checks auth (Bearer and ?api_key=), the
offer search with the CLI's query JSON, renting on demand and by bid, the
request shape checks, an offer that is gone, instances v1 (paginated) and
v0, attaching a key, an outbid interruptible instance, destroy, per-endpoint
rate limits, the violation log and leak_check.py, and ssh into an instance
through a real sshd when one can run (else `SKIPPED ssh: why`). Prints one
line per check and `N passed, N failed`; exits 1 on failure.
"""

import json
import os
import subprocess
import sys
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gpucloud"))
sys.dont_write_bytecode = True

from testkit import Sshd, call, check, start, stop, summary, wait_for  # noqa: E402

AUTH = {"Authorization": "Bearer test-key"}
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGangwayFakeKeyForTheSelftestOnlyAAAAAAAAAA selftest"


def cli_create_body(image, label, price=None, onstart=None, env=None):
    """The JSON `vastai create instance` sends (vast.py create__instance)."""
    return {"client_id": "me", "image": image, "env": env or {}, "price": price, "disk": 20.0,
            "label": label, "extra": None, "onstart": onstart, "image_login": None,
            "python_utf8": False, "lang_utf8": False, "use_jupyter_lab": False, "jupyter_dir": None,
            "force": False, "cancel_unavail": None, "template_hash_id": None, "user": None,
            "runtype": "ssh_direc ssh_proxy"}


def main():
    proc, url = start(os.path.join(HERE, "server.py"), "--boot-seconds", "0.3")
    api = url + "/api/v0"
    sshd = None
    try:
        def va(method, path, body=None, headers=AUTH):
            return call(api + path, method, body, headers)

        s, b, _ = va("POST", "/bundles/", {}, headers={})
        check("no key: 401 with success false", s == 401 and b["success"] is False, b)
        call(url + "/_fake/violations", "DELETE")

        query = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
                 "rented": {"eq": False}, "gpu_name": {"in": ["RTX 4090"]}, "num_gpus": {"gte": 1},
                 "order": [["dph_total", "asc"]], "type": "on-demand", "allocated_storage": 20.0}
        s, b, _ = va("POST", "/bundles/", query)
        check("search: RTX 4090 offers cheapest first",
              s == 200 and [o["id"] for o in b["offers"]] == [41001, 41002], b)
        s, b, _ = call(api + "/bundles?api_key=test-key", "POST", dict(query, type="bid", limit=1))
        check("?api_key= and a bid search: min_bid as the price, limit",
              s == 200 and len(b["offers"]) == 1 and b["offers"][0]["dph_total"] == 0.18, b)
        s, b, _ = va("POST", "/bundles/", dict(query, gpu_nmae={"eq": "x"}))
        check("unknown search field: 400 invalid_args", s == 400 and b["error"] == "invalid_args" and "gpu_nmae" in b["msg"], b)
        s, b, _ = va("POST", "/bundles/", dict(query, num_gpus=2))
        check("a filter that is no object: 400", s == 400, b)
        call(url + "/_fake/violations", "DELETE")

        sshd_why = Sshd.why_not()
        pub = PUB
        if sshd_why is None:
            sshd = Sshd()
            pub = sshd.public_key
            call(url + "/_fake/machines", "POST", {"slots": [["127.0.0.1", sshd.port]],
                                                   "authorized_keys": sshd.authorized_keys})

        s, b, _ = va("PUT", "/asks/41001/", dict(cli_create_body("ubuntu:22.04", "gangway-c1-0"), colour="red"))
        check("create with an unknown field: 400 invalid_args", s == 400 and "colour" in b["msg"], b)
        s, b, _ = va("PUT", "/asks/41001/", {"label": "x"})
        check("create without image: 400", s == 400 and "image" in b["msg"], b)
        s, v, _ = call(url + "/_fake/violations")
        check("two violations logged", v["count"] == 2, v)
        call(url + "/_fake/violations", "DELETE")

        # offer gone
        call(url + "/_fake/offer", "POST", {"id": 41003})
        s, b, _ = va("PUT", "/asks/41003/", cli_create_body("ubuntu:22.04", "gangway-gone"))
        check("an offer that is gone: 404 'no_such_ask' in msg, ask_id",
              s == 404 and "no_such_ask" in b["msg"] and b["ask_id"] == 41003, b)
        s, b, _ = va("PUT", "/asks/41003/", dict(cli_create_body("ubuntu:22.04", "gangway-gone"), cancel_unavail=True))
        check("with cancel_unavail: 410 no_such_ask", s == 410 and b["error"] == "no_such_ask", b)

        # account key, rent on demand, reach
        s, b, _ = va("POST", "/ssh/", {"ssh_key": pub})
        check("account ssh key", s == 200 and b["success"] and b["key"]["public_key"] == pub, b)
        key_id = b["key"]["id"]
        s, b, _ = va("PUT", "/asks/41001/", cli_create_body("ubuntu:22.04", "gangway-c1-0", env={"-p 22:22": "1", "GW": "1"}))
        check("rent on demand: success and new_contract", s == 200 and b["success"] and b["new_contract"], b)
        iid = b["new_contract"]
        s, b, _ = va("GET", f"/instances/{iid}/?owner=me")
        check("just rented: actual_status null or loading", s == 200 and b["instances"]["actual_status"] in (None, "loading"), b)
        inst = wait_for(lambda: (lambda r: r[1]["instances"] if r[1]["instances"]["actual_status"] == "running" else None)(
            va("GET", f"/instances/{iid}/")), 5)
        check("running: ssh_host/ssh_port, public_ipaddr, ports['22/tcp'][0].HostPort",
              inst and inst["ssh_port"] and inst["public_ipaddr"]
              and inst["ports"]["22/tcp"][0]["HostPort"] == str(inst["ssh_port"]), inst)
        if sshd is not None:
            r = sshd.ssh(inst["ssh_host"], inst["ssh_port"], "echo reached-$((40+2))")
            check("ssh root@ssh_host -p ssh_port with the account key reaches the instance",
                  r.returncode == 0 and r.stdout.strip() == "reached-42", r.stderr)
            s, b, _ = va("PUT", "/asks/41002/", cli_create_body("ubuntu:22.04", "gangway-c1-1"))
            check("the only sshd slot is taken: the offer answers no_such_ask", s == 404, b)
        else:
            print(f"SKIPPED ssh: {sshd_why}")
        s, b, _ = va("POST", "/bundles/", dict(query, gpu_name={"in": ["RTX 4090"]}))
        check("the rented machine leaves the search", 41001 not in [o["id"] for o in b["offers"]], b)
        s, b, _ = va("PUT", "/asks/41001/", cli_create_body("ubuntu:22.04", "gangway-again"))
        check("renting it again: no_such_ask", s == 404 and "no_such_ask" in b["msg"], b)
        s, b, _ = va("POST", f"/instances/{iid}/ssh/", {"ssh_key": pub + "-second"})
        check("attach ssh key to the instance", s == 200 and b["success"], b)

        # destroy the on-demand one to free the slot
        s, b, _ = va("DELETE", f"/instances/{iid}/", {})
        check("destroy: success", s == 200 and b["success"], b)
        s, b, _ = va("GET", f"/instances/{iid}/")
        check("then 404", s == 404, b)

        # bid, outbid
        s, b, _ = va("PUT", "/asks/41004/", cli_create_body("ubuntu:22.04", "gangway-bid", price=0.1))
        check("a bid under min_bid: 400 invalid_price", s == 400 and b["error"] == "invalid_price", b)
        s, b, _ = va("PUT", "/asks/41004/", cli_create_body("ubuntu:22.04", "gangway-bid", price=0.5))
        check("a bid at or over min_bid: rented, is_bid", s == 200, b)
        bid_id = b["new_contract"]
        wait_for(lambda: va("GET", f"/instances/{bid_id}/")[1]["instances"]["actual_status"] == "running", 5)
        s, b, _ = call(url + "/_fake/outbid", "POST", {"id": bid_id})
        s, b, _ = va("GET", f"/instances/{bid_id}/")
        i = b["instances"]
        check("outbid: actual_status stopped, cur_state stopped, intended_status running, no ssh",
              i["actual_status"] == "stopped" and i["cur_state"] == "stopped"
              and i["intended_status"] == "running" and i["ssh_port"] is None and i["is_bid"], i)

        # lists
        params = {"select_filters": {}, "order_by": [{"col": "id", "dir": "asc"}], "limit": 25}
        qs = "&".join(f"{k}={urllib.parse.quote_plus(json.dumps(v))}" for k, v in params.items())
        s, b, _ = call(url + "/api/v1/instances/?" + qs, headers=AUTH)
        check("v1 instances as the CLI asks: instances, next_token null",
              s == 200 and [x["id"] for x in b["instances"]] == [bid_id] and b["next_token"] is None, b)
        s, b, _ = call(url + "/api/v1/instances/?limit=50", headers=AUTH)
        check("v1 limit over 25: 400", s == 400, b)
        s, b, _ = va("GET", "/instances/?owner=me")
        check("v0 instances list", s == 200 and [x["id"] for x in b["instances"]] == [bid_id], b)
        call(url + "/_fake/violations", "DELETE")

        # rate limit per endpoint
        call(url + "/_fake/rate-intervals", "POST", {"searchOffers": 5})
        va("POST", "/bundles/", query)
        s, b, _ = va("POST", "/bundles/", query)
        check("per-endpoint rate limit: 429 plain text 'API requests too frequent'",
              s == 429 and "API requests too frequent" in b, b)
        call(url + "/_fake/rate-intervals", "POST", {"searchOffers": None})

        leak = subprocess.run([sys.executable, os.path.join(HERE, "..", "gpucloud", "leak_check.py"),
                               "--endpoint", url, "--keys"], capture_output=True, text=True)
        check("leak_check.py counts the outbid instance and the key (exit 1)",
              leak.returncode == 1 and str(bid_id) in leak.stdout and "ssh key" in leak.stdout, leak.stdout)
        va("DELETE", f"/instances/{bid_id}/", {})
        va("DELETE", f"/ssh/{key_id}/", {})
        leak = subprocess.run([sys.executable, os.path.join(HERE, "..", "gpucloud", "leak_check.py"),
                               "--endpoint", url, "--keys"], capture_output=True, text=True)
        check("leak_check.py: nothing left (exit 0)", leak.returncode == 0, leak.stdout)
        s, v, _ = call(url + "/_fake/violations")
        check("no violations from the well-formed calls", v["count"] == 0, v)
    finally:
        if sshd is not None:
            sshd.close()
        stop(proc)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
