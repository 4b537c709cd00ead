"""Start the machine services servestack needs, on demand, so nobody starts anything by hand.

One small interface over platform details: `ensure_dockerd()`, `ensure_registry()`,
`ensure_slurm()` and `ensure_binfmt_aarch64()`. Each is idempotent, returns in well under a
second when its service already answers, and otherwise starts it detached (its own session, so
it outlives the caller), waits with a deadline and, on failure, raises ServestackError carrying
the end of the service's log. State and logs live under `project.state_home()`.

The packages come from `.ci/bootstrap` (Debian 12 plus docker from Debian 13). There is no
init system on these machines (containers, CI runners), so we do not use systemctl: we run the
daemons ourselves, as root.

One module per service: dockerd (and the Docker client), registry (loopback and TLS), munge,
slurm, binfmt; daemons holds how each is started (detached, serialised, with a deadline).
"""

from servestack.services.binfmt import ensure_binfmt_aarch64
from servestack.services.dockerd import docker_client, ensure_dockerd
from servestack.services.munge import ensure_munge
from servestack.services.oci_registry import DEFAULT_REGISTRY, ensure_registry, ensure_tls_registry
from servestack.services.slurm_daemons import ensure_slurm

__all__ = [
    "DEFAULT_REGISTRY",
    "docker_client",
    "ensure_binfmt_aarch64",
    "ensure_dockerd",
    "ensure_munge",
    "ensure_registry",
    "ensure_slurm",
    "ensure_tls_registry",
]
