#!/usr/bin/env python3
"""S3 emulator for gangway's bucket tests: moto's S3 behind the storage front.

Runs moto's S3 (the moto[server] that tests/emulators/ec2/requirements.txt
pins; the EC2 emulator's venv, made by ../ec2/setup.sh) in a child process on
a loopback port of its own, and the request-logging, fault-injecting front
(../storage/front.py) in this one:

    $(tests/emulators/ec2/setup.sh) tests/emulators/s3/server.py --port 0 [--watch-stdin]

prints exactly one line `READY http://127.0.0.1:PORT` (the front's address:
clients and the control API /_gangway/ both use it) once S3 answers through
the front, then serves until SIGTERM or SIGINT or, with --watch-stdin, until
standard input reaches end of file. Path-style addressing only
(http://127.0.0.1:PORT/BUCKET/KEY); any access key and region; signatures are
not checked. See README.md beside this file.
"""

import argparse
import os
import subprocess
import sys
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "storage"))

import front as storage_front  # noqa: E402


def run_store(host):
    """The child: moto's S3 alone, threaded werkzeug on a free port."""
    import logging

    from moto.moto_server.werkzeug_app import create_backend_app
    from werkzeug.serving import make_server

    try:  # moto >= 5.2 normalizes header names with this handler.
        from moto.moto_server.werkzeug_app import MotoRequestHandler
        extra = {"request_handler": MotoRequestHandler}
    except ImportError:  # pragma: no cover - older moto
        extra = {}
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = make_server(host, 0, create_backend_app("s3"), threaded=True, **extra)
    print(f"STORE http://{host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


def null_version(h, rule, entry):
    """`Front.adapter`: reads of `versionId=null` go to the plain object.

    moto answers CompleteMultipartUpload with `x-amz-version-id: null` even
    in a bucket that never had versioning, and then refuses (400) the
    `HEAD ?versionId=null` that rclone sends after a streamed upload (rcat,
    a write through `rclone mount --vfs-cache-mode off`). S3 takes `null` as
    the id of the object written without versioning; so does this."""
    if h.command not in ("GET", "HEAD"):
        return False
    url = urllib.parse.urlsplit(h.path)
    query = urllib.parse.parse_qsl(url.query, keep_blank_values=True)
    if ("versionId", "null") not in query:
        return False
    rest = urllib.parse.urlencode([(k, v) for k, v in query if (k, v) != ("versionId", "null")])
    h.forward(rule, entry, path=url.path + ("?" + rest if rest else ""))
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="the front's port; 0 picks a free one")
    parser.add_argument("--watch-stdin", action="store_true",
                        help="exit when standard input reaches end of file")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    parser.add_argument("--store-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.store_only:
        return run_store(args.host)

    import moto  # noqa: F401  (fail here, clearly, without the venv)

    # Objects above this size spill from memory to temporary files (moto's
    # default is 5 MiB - 1 KiB already; kept explicit).
    env = dict(os.environ)
    env.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(5 * 1024 * 1024 - 1024))
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--store-only", "--host", args.host],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env,
        preexec_fn=storage_front.die_with_parent,
    )
    line = child.stdout.readline().decode().strip()
    if not line.startswith("STORE "):
        child.kill()
        sys.stderr.write(f"s3: moto did not start (said {line!r})\n")
        return 1
    upstream = storage_front.parse_upstream(line.split()[1])
    front = storage_front.Front((args.host, args.port), upstream, "s3", args.verbose)
    front.adapter = null_version
    # A bucket listing answers once moto has loaded S3.
    check = lambda: storage_front.wait_http(front.url + "/", 60, ok=lambda s: s == 200, proc=child)
    return storage_front.serve_until_stopped(front, args.watch_stdin, children=[child], check=check)


if __name__ == "__main__":
    sys.exit(main())
