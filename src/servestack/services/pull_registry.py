"""The registry as a cluster's nodes see it: Bearer-token auth in front of the images, as in production.

Why: unpatched enroot (what real clusters run) first sends a HEAD for the manifest with no Accept
header. An anonymous registry answers that with 404 for an OCI manifest ("accept header does not
support OCI manifests") and the import stops. Production registries (nvcr.io, ghcr.io, ...)
answer 401 with `WWW-Authenticate: Bearer realm=...`, even for anonymous pulls; enroot then
fetches a token from the realm and asks for the manifest with the OCI Accept headers, and the
import works. (HTTP Basic does not help: enroot checks Basic credentials with another GET without
Accept.) So the test cluster pulls the way production does: a second Debian docker-registry
serves the loopback registry's storage read-only, with token auth, and a small token service
here issues short-lived pull tokens (RS256 JWTs, signed with `openssl`) to anyone, like a public
repository. The image and its digest are the same bytes the build pushed.

`python -m servestack.services.pull_registry serve ...` is the token service (started detached by
`ensure_pull_registry`). Both listen on one host address: loopback for the one-node cluster, the
cluster network's host address for nodes in namespaces of their own (`services.netns`), whose
loopback is their own.
"""

from __future__ import annotations

import argparse
import base64
import http.server
import json
import re
import time
import urllib.parse
import uuid
from pathlib import Path

from servestack.util.console import console
from servestack.util.fsutil import atomic_write_text
from servestack.util.proc import output_bytes, run
from servestack.util.project import state_home

LOOPBACK = "127.0.0.1"
REGISTRY_PORT = 5001
TOKEN_PORT = 5002
ISSUER = "servestack-token"
SERVICE = "servestack-pull-registry"
TOKEN_SECONDS = 900
_SCOPE = re.compile(r"^repository:([a-z0-9][a-z0-9._/-]*):([a-z,*]+)$")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def issue_token(key: Path, cert_der: bytes, scopes: list[str], now: float | None = None) -> str:
    """A JWT granting `pull` on each `repository:NAME:...` scope (nothing else), signed with KEY."""
    now = time.time() if now is None else now
    access = []
    for scope in scopes:
        m = _SCOPE.match(scope)
        if m and "pull" in m.group(2).split(","):
            access.append({"type": "repository", "name": m.group(1), "actions": ["pull"]})
    header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(cert_der).decode()]}
    claims = {"iss": ISSUER, "sub": "", "aud": SERVICE, "exp": int(now) + TOKEN_SECONDS, "nbf": int(now) - 60,
              "iat": int(now), "jti": uuid.uuid4().hex, "access": access}
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    signature = output_bytes(["openssl", "dgst", "-sha256", "-sign", key], input=signing_input.encode())
    return f"{signing_input}.{_b64(signature)}"


def _serve(host: str, port: int, key: Path, cert: Path) -> None:
    cert_der = output_bytes(["openssl", "x509", "-in", cert, "-outform", "DER"])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlparse(self.path)
            if url.path != "/token":
                self.send_error(404)
                return
            query = urllib.parse.parse_qs(url.query)
            token = issue_token(key, cert_der, [s for v in query.get("scope", []) for s in v.split(" ")])
            body = json.dumps({"token": token, "access_token": token, "expires_in": TOKEN_SECONDS}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: object) -> None:
            console.progress(f"{self.address_string()} {fmt % args}")

    http.server.ThreadingHTTPServer((host, port), Handler).serve_forever()


def _registry_conf(storage: Path, cert: Path, host: str) -> str:
    # Plain YAML (paths quoted JSON-style). Read-only: this registry never writes the storage the
    # build pushes into.
    return (
        "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {json.dumps(str(storage))}\n"
        "  maintenance:\n    readonly:\n      enabled: true\n"
        f"http:\n  addr: {json.dumps(f'{host}:{REGISTRY_PORT}')}\n"
        "auth:\n  token:\n"
        f"    realm: {json.dumps(f'http://{host}:{TOKEN_PORT}/token')}\n"
        f"    service: {SERVICE}\n    issuer: {ISSUER}\n"
        f"    rootcertbundle: {json.dumps(str(cert))}\n"
    )


def ensure_pull_registry(source_registry: str, timeout: float = 30.0, host: str = LOOPBACK) -> str:
    """The loopback registry's images behind token auth on HOST:5001; returns that address.

    `source_registry` must be the loopback registry services.ensure_registry() runs (its storage
    is served); anything else is refused.
    """
    from servestack.errors import ServestackError
    from servestack.services.daemons import exclusive, require, spawn_detached, wait_until
    from servestack.services.oci_registry import registry_answers

    storage = state_home() / "registry" / source_registry.rpartition(":")[2] / "storage"
    if not storage.is_dir():
        raise ServestackError(f"{source_registry}: no local storage at {storage}; only the loopback registry "
                              "started by servestack can be served to the cluster")
    address = f"{host}:{REGISTRY_PORT}"
    if registry_answers(address) and _token_answers(host):
        return address
    home = state_home() / "pull-registry"
    served = home if host == LOOPBACK else home / host
    with exclusive("pull-registry"):
        served.mkdir(parents=True, exist_ok=True)
        key, cert = home / "token.key", home / "token.crt"
        if not cert.exists():
            run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                 "-days", "3650", "-subj", f"/CN={ISSUER}"])
            key.chmod(0o600)
        if not _token_answers(host):
            import sys

            log = served / "token.log"
            proc = spawn_detached([sys.executable, "-m", "servestack.services.pull_registry", "serve", "--host", host,
                                   "--port", str(TOKEN_PORT), "--key", str(key), "--cert", str(cert)], log)
            wait_until(lambda: _token_answers(host), what="the pull registry's token service", timeout=timeout,
                       log_path=log, proc=proc)
        if not registry_answers(address):
            config = served / "config.yml"
            atomic_write_text(config, _registry_conf(storage, cert, host))
            log = served / "registry.log"
            proc = spawn_detached([require("docker-registry"), "serve", str(config)], log)
            wait_until(lambda: registry_answers(address),
                       what=f"the pull registry on {address}", timeout=timeout, log_path=log, proc=proc)
    return address


def _token_answers(host: str) -> bool:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{host}:{TOKEN_PORT}/token?scope=", timeout=2) as resp:
            return "token" in json.loads(resp.read())
    except (OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m servestack.services.pull_registry")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="the token service")
    serve.add_argument("--host", default=LOOPBACK)
    serve.add_argument("--port", type=int, default=TOKEN_PORT)
    serve.add_argument("--key", type=Path, required=True)
    serve.add_argument("--cert", type=Path, required=True)
    args = parser.parse_args(argv)
    _serve(args.host, args.port, args.key, args.cert)


if __name__ == "__main__":
    main()
